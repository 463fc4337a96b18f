"""How a model's chat template turns reasoning off: the model's own switch, never ours imposed on it.

Templates switch reasoning their own way, so `reasoning: bool` (data/chat.py) is mapped to
the one the checkpoint's template reads:

- `{kind: kwarg, name, when_on, when_off}`: a template variable. Ours (data/templates/chat.jinja) reads
  `reasoning` (true/false: off drops every trace and ends the system prompt with the line
  `reasoning: off`); Qwen3 and Nemotron 3 templates read `enable_thinking` (true/false).
- `{kind: system_flag, when_off, when_on}`: text the model reads in its system prompt
  (`/no_think` and `/think`; `detailed thinking off` and `detailed thinking on`). The flag is
  appended to the system prompt as its last paragraph (after a blank line); a conversation
  without a system prompt gets one holding only the flag. `when_on` may be left unset:
  reasoning on then writes nothing.
- `{kind: none}`: the template has no switch. Reasoning is then always the template's default,
  and a non-zero `reasoning_off_fraction` is refused naming `tokenizer.reasoning_switch`
  (refuse_without_switch), since the model could not be told which conversations are off.

Reasoning off always drops every assistant turn's trace (`reasoning_content`, and the
`thinking` / `reasoning` names transformers aliases to it) before the template sees the
messages: a template switched off may still write a trace it is given (Qwen3's does), and
an off conversation must train the answer alone.

The recipe field `tokenizer.reasoning_switch` (data/config.py TokenizerConfig) is `auto` or
one of the three. `auto` detects the switch from the template's source: it reads `reasoning`
(ours), else `enable_thinking`, else none. A system-prompt flag is not guessed from the
template's text: name it in the recipe. (The fields are not `on`/`off`: YAML reads those
words as booleans, keys included.)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from stagewise.config_base import StrictConfig
from stagewise.data.errors import BadInput
from stagewise.data.template_call import template_source, template_variables

SWITCH_FIELD = "tokenizer.reasoning_switch"
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""A message's reasoning trace under the names transformers reads it by (chat_template_utils aliases them)."""


class KwargSwitch(StrictConfig):
    """Reasoning is a template variable: `name` = `when_on` or `when_off`."""

    kind: Literal["kwarg"] = "kwarg"
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The variable the template reads (e.g. enable_thinking)."""
    when_on: bool | int | str = True
    """Its value with reasoning on."""
    when_off: bool | int | str = False
    """Its value with reasoning off."""


class SystemFlagSwitch(StrictConfig):
    """Reasoning is a flag in the system prompt, appended as its last paragraph."""

    kind: Literal["system_flag"] = "system_flag"
    when_off: str = Field(min_length=1)
    """The flag with reasoning off (e.g. /no_think, or `detailed thinking off`)."""
    when_on: str | None = None
    """The flag with reasoning on (e.g. /think); unset: nothing is written."""


class NoSwitch(StrictConfig):
    """The template cannot turn reasoning off."""

    kind: Literal["none"] = "none"


def _kind(value: Any) -> str | None:
    """The branch a setting is validated as: `auto`, else its `kind` (so an error names that branch alone)."""
    if isinstance(value, str):
        return value
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


ReasoningSwitch = Annotated[Union[KwargSwitch, SystemFlagSwitch, NoSwitch], Field(discriminator="kind")]
SwitchSetting = Annotated[Union[Annotated[Literal["auto"], Tag("auto")], Annotated[KwargSwitch, Tag("kwarg")],
                                Annotated[SystemFlagSwitch, Tag("system_flag")], Annotated[NoSwitch, Tag("none")]],
                          Discriminator(_kind)]

OURS = KwargSwitch(name="reasoning")
KNOWN_KWARGS = (OURS, KwargSwitch(name="enable_thinking"))
"""Variables `auto` recognises, in order of preference."""


def detect_switch(source: str | None) -> KwargSwitch | NoSwitch:
    """The switch a template's source reads (KNOWN_KWARGS), else NoSwitch."""
    names = template_variables(source) if source else frozenset()
    return next((s for s in KNOWN_KWARGS if s.name in names), NoSwitch())


def resolve_switch(tokenizer: Any, setting: SwitchSetting = "auto") -> KwargSwitch | SystemFlagSwitch | NoSwitch:
    """The recipe's switch, or (`auto`) the one the tokenizer's template reads."""
    return detect_switch(template_source(tokenizer)) if setting == "auto" else setting


def switched(messages: list[dict], switch: KwargSwitch | SystemFlagSwitch | NoSwitch,
             reasoning: bool) -> tuple[list[dict], dict]:
    """(messages, template kwargs) that say `reasoning` in the model's own way (see the module docstring).
    `messages` is not modified."""
    if not reasoning:
        messages = without_traces(messages)
    if isinstance(switch, KwargSwitch):
        return list(messages), {switch.name: switch.when_on if reasoning else switch.when_off}
    if isinstance(switch, SystemFlagSwitch):
        flag = switch.when_on if reasoning else switch.when_off
        return (with_system_flag(messages, flag) if flag else list(messages)), {}
    return list(messages), {}


def without_traces(messages: list[dict]) -> list[dict]:
    """`messages` with every assistant turn's reasoning trace (REASONING_FIELDS) removed; not modified in place."""
    return [{k: v for k, v in m.items() if k not in REASONING_FIELDS} if m.get("role") == "assistant" else m
            for m in messages]


def off_call_kwargs(switch: KwargSwitch | SystemFlagSwitch | NoSwitch) -> dict | None:
    """The template kwargs of the model's own reasoning-off generation prompt, when the switch is a
    template variable (a system-prompt flag changes the context, not the prompt; no switch has none)."""
    return {switch.name: switch.when_off} if isinstance(switch, KwargSwitch) else None


def with_system_flag(messages: list[dict], flag: str) -> list[dict]:
    """`flag` as the system prompt's last paragraph (a system message of its own when there is none)."""
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content")
        if isinstance(content, list):  # content parts: the flag is one more text part
            content = [*content, {"type": "text", "text": flag}]
        else:
            content = f"{content}\n\n{flag}" if content else flag
        return [{**messages[0], "content": content}, *messages[1:]]
    return [{"role": "system", "content": flag}, *messages]


def refuse_without_switch(switch: KwargSwitch | SystemFlagSwitch | NoSwitch, fractions: dict[str, float],
                          where: str) -> None:
    """BadInput naming tokenizer.reasoning_switch when any of `fractions` (field -> reasoning-off
    fraction) is above 0 but the template of `where` has no switch."""
    asked = {f: v for f, v in fractions.items() if v > 0}
    if isinstance(switch, NoSwitch) and asked:
        fields = ", ".join(f"{f}: {v}" for f, v in asked.items())
        raise BadInput(f"{SWITCH_FIELD}: the chat template of {where} has no reasoning switch (it reads neither "
                       f"`reasoning` nor `enable_thinking`), so {fields} cannot train reasoning-off conversations; "
                       "name the model's switch, e.g. {kind: system_flag, when_off: /no_think, when_on: /think} or "
                       "{kind: kwarg, name: thinking, when_on: true, when_off: false}, or set the fraction to 0")


def switch_spec(setting: SwitchSetting) -> dict:
    """What a step's hash holds of the setting: nothing for `auto` (the switch is then the start
    checkpoint's template's own, an input of the step already), else {"reasoning_switch": setting}."""
    return {} if setting == "auto" else {"reasoning_switch": setting}
