"""What a Prefect form may ask of a served deployment: the operator's boundary, checked in the flow run.

A shared Prefect server's Run form is other people's input. Without a boundary it can name any recipe
file, set any `key=value` (the container image a launch runs with `--gpus all`, a venv whose
bin/python is executed, pyxis mounts such as `/:/host`, a `tracking.uri` on an outside server that
then receives metrics and checkpoints, any `workdir`, any readable file as a data source or `base:`).
So the operator says, at `stagewise serve`:

- `--recipe-root DIR`: the directories a form's `recipe` (and a promotion's rule file) may lie in,
  symlinks resolved; by default the served recipe's own directory and the shipped recipes.
- `--allow-set PATTERN`: override keys a form may set beyond DEFAULT_ALLOWED (training knobs:
  token budgets and steps, learning rates, blend weights, the seed). A pattern is a recipe path
  whose `*` is one path segment or index and `**` anything: `workdir`, `stages.pretrain.**`, `**`.
  `launch`, engine environments, `tracking`, `workdir`, `base`, `model.from` and data paths stay
  closed unless a pattern opens them.

The policy travels to the flow runs in the served process's environment (STAGEWISE_FORM_POLICY, JSON):
Prefect's runner starts each flow run with `stagewise serve`'s environment and no per-run job
variables, so a form cannot change it. Every deployed flow (flows/deployed.py, flows/nightly_eval.py,
flows/promote.py, flows/data_build.py) calls `form_policy().admit_*` first, before any work: a refusal is BadInput naming
the parameter and the key, and the flow run ends Failed with it. A flow run with no policy in its
environment (a worker started by hand) gets the default one. On a work pool, `serve --pool` writes
the policy into each deployment's job variables, which a person allowed to edit job variables can
change: there the boundary is the Prefect API's authentication (docs/DEPLOY.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from importlib.resources import files
from pathlib import Path

from pydantic import Field

from stagewise.config_base import StrictConfig
from stagewise.data.errors import BadInput
from stagewise.recipe.errors import join_path, parse_path
from stagewise.recipe.shipped import resolve_recipe

POLICY_ENV = "STAGEWISE_FORM_POLICY"
"""The environment variable a served flow run reads its policy from (FormPolicy as JSON)."""

DEFAULT_ALLOWED = (
    "seed",
    "stages.*.tokens", "stages.*.steps", "stages.*.prompts_per_step",
    "stages.*.optimizer.lr", "stages.*.optimizer.min_lr",
    "stages.sft.stages[*].tokens", "stages.sft.stages[*].optimizer.lr", "stages.sft.stages[*].optimizer.min_lr",
    "stages.pretrain.phases[*].blend", "stages.pretrain.phases[*].blend.*",
    "stages.pretrain.phases[*].quality_weights", "stages.pretrain.phases[*].quality_weights.*",
    "stages.sft.stages[*].blend.weights", "stages.sft.stages[*].blend.weights.*",
    "stages.sft.stages[*].blend.reasoning_off_fraction",
)
"""The override keys any form may set: training knobs that change what is trained, never where it runs,
what it reads or where its results go."""


def _pattern(text: str) -> re.Pattern:
    """A recipe-path pattern as a regex: `**` anything, `*` one key or index (no `.`, `[`, `]`)."""
    out = []
    for part in re.split(r"(\*\*|\*)", text):
        out.append(".*" if part == "**" else r"[^.\[\]]+" if part == "*" else re.escape(part))
    return re.compile("".join(out))


def canonical_key(key: str) -> str:
    """An override's key as the loader walks it (`a.b[1].c`), so spacing cannot dodge a pattern."""
    at = ""
    for token in parse_path(key.strip()):
        at = join_path(at, token)
    return at


class FormPolicy(StrictConfig):
    """The operator's boundary for form input (see the module docstring)."""

    recipe_roots: list[str] = Field(default_factory=list)
    """Absolute directories a form's recipe or rule file may lie in (symlinks resolved)."""
    allowed: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOWED))
    """Override-key patterns a form may set."""
    tracking_uris: list[str] = Field(default_factory=list)
    """MLflow stores a promotion form may name (the served recipe's), unless `tracking.uri` is allowed."""

    def allows(self, key: str) -> bool:
        return any(_pattern(p).fullmatch(key) for p in self.allowed)

    def admit_overrides(self, overrides: Iterable[str], parameter: str = "overrides") -> None:
        """BadInput naming every override whose key the policy does not open."""
        refused = []
        for text in overrides:
            key, eq, _ = str(text).partition("=")
            try:
                path = canonical_key(key) if eq else None
            except ValueError:
                path = None
            if path is None:
                refused.append(f"{parameter}: {text!r} is not key=value")
            elif not self.allows(path):
                refused.append(f"{parameter}: {path} may not be set from a form (this server lets forms set "
                               f"{', '.join(self.allowed)}; the operator widens it with `stagewise serve --allow-set`)")
        if refused:
            raise BadInput(refused, title="the form asks for what this server does not allow")

    def admit_file(self, value: str | os.PathLike, parameter: str) -> Path:
        """The file `value` names (a path, or a shipped recipe's name), refused unless under a recipe root."""
        path = resolve_recipe(value).resolve() if parameter == "recipe" else Path(value).expanduser().resolve()
        roots = [Path(r).resolve() for r in self.recipe_roots]
        if not any(path.is_relative_to(r) for r in roots):
            raise BadInput([f"{parameter}: {path} is outside the directories this server serves recipes from "
                            f"({', '.join(map(str, roots)) or 'none'}; the operator adds one with "
                            "`stagewise serve --recipe-root DIR`)"], title="the form asks for what this server does not allow")
        return path

    def admit_tracking(self, uri: str | None, parameter: str = "tracking_uri") -> None:
        """A promotion's MLflow store: the served recipe's, unless `tracking.uri` is allowed."""
        if uri is None or self.allows("tracking.uri") or uri in self.tracking_uris:
            return
        raise BadInput([f"{parameter}: {uri!r} is not this server's MLflow store ({', '.join(self.tracking_uris)}); "
                        "the operator opens it with `stagewise serve --allow-set tracking.uri`"],
                       title="the form asks for what this server does not allow")

    def to_env(self) -> dict[str, str]:
        return {POLICY_ENV: self.model_dump_json()}


def shipped_root() -> Path:
    """The shipped recipes' directory (inside the installed package)."""
    return Path(str(files("stagewise") / "recipes")).resolve()


def serving_policy(recipe: str | Path, roots: Sequence[str | Path] = (), allow: Sequence[str] = (),
                   tracking_uris: Sequence[str] = ()) -> FormPolicy:
    """`stagewise serve`'s policy: the served recipe's directory, the shipped recipes and `roots`;
    DEFAULT_ALLOWED and `allow`. Patterns are checked to compile; roots to be directories."""
    for r in roots:
        if not Path(r).expanduser().is_dir():
            raise BadInput([f"--recipe-root {r}: not a directory"])
    for p in allow:
        if not p or not re.fullmatch(r"[A-Za-z0-9_.\[\]*]+", p):
            raise BadInput([f"--allow-set {p!r}: a recipe path pattern (letters, digits, _ . [ ] and * only), "
                            "e.g. workdir or stages.pretrain.**"])
    dirs = [Path(recipe).expanduser().resolve().parent, shipped_root(), *(Path(r).expanduser().resolve() for r in roots)]
    return FormPolicy(recipe_roots=list(dict.fromkeys(str(d) for d in dirs)),
                      allowed=list(dict.fromkeys([*DEFAULT_ALLOWED, *allow])), tracking_uris=list(tracking_uris))


def form_policy() -> FormPolicy:
    """The policy of this flow run: STAGEWISE_FORM_POLICY's, else the default (shipped recipes and the
    current directory, DEFAULT_ALLOWED)."""
    text = os.environ.get(POLICY_ENV)
    if not text:
        return FormPolicy(recipe_roots=[str(shipped_root()), str(Path.cwd().resolve())])
    return FormPolicy.model_validate(json.loads(text))
