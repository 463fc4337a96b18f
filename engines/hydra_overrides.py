"""Python values as Hydra override text (`key=value`), the one renderer for every launched engine.

Why: Megatron-Bridge's run_recipe.py and NeMo RL's examples both parse their trailing `key=value`
arguments with Hydra 1.3's override grammar, then resolve them through OmegaConf. A string is
quoted, and inside Hydra's quotes only three things are special (checked against hydra-core 1.3.2's
OverridesParser, the version Megatron-Bridge pins, with OmegaConf 2.3 resolving):
- a double quote, escaped as `\\"`;
- a run of backslashes right before a quote or at the end, each doubled (elsewhere a backslash is
  literal, so `C:\\a` stays as written);
- `${`, escaped as `\\${` so OmegaConf does not read it as an interpolation.
Everything else, non-ASCII included, is written as is (JSON's `\\u00fc` escapes would reach the
engine literally: a path with an umlaut would name another directory)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_BACKSLASHES_BEFORE_QUOTE_OR_END = re.compile(r'(\\+)(?="|$)')


def hydra_string(text: str) -> str:
    """`text` as a double-quoted Hydra value that parses back to exactly `text`."""
    text = _BACKSLASHES_BEFORE_QUOTE_OR_END.sub(lambda m: m.group(1) * 2, text)
    return '"' + text.replace('"', '\\"').replace("${", "\\${") + '"'


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value: null, true/false, numbers, quoted strings,
    lists `[a,b]`, dicts `{k:v}`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value}")
        return repr(value)
    if isinstance(value, str):
        return hydra_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra form for {type(value).__name__}: {value!r}")


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """A mapping of dotted keys (`+` / `~` prefixes kept) as `key=value` arguments, in order."""
    return [f"{k}={hydra_value(v)}" for k, v in overrides.items()]


__all__ = ["hydra_string", "hydra_value", "override_args"]
