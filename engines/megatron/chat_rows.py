"""One SFT sub-stage's conversations as the chat JSONL Megatron-Bridge's SFT dataset reads, for `engine: megatron`.

    report = write_chat_rows(sample_jsonl, tokenizer_dir, pack_size=512, off_fraction=0.5, seed=3, out=root)
    # root/training.jsonl, root/report.json: {"conversations", "dropped", "reasoning_off"}

`--dataset local-jsonl` with engines/megatron/translate.py's chat_jsonl_overrides reads
`<root>/training.jsonl` through Megatron-Bridge's ChatSFTPreprocessingConfig, each row rendered
by the run's HF tokenizer's chat template, the loss on the assistant turns. The run's tokenizer is
the SFT start checkpoint's, whose template is the one our engine trains with (data/chat.py). This
is the faithful route: prompt/completion rows (the preset's default schema) would supervise only a
last answer and lose the earlier assistant turns, tool calls and the per-conversation reasoning
switch. A row per conversation of the sub-stage's sample (sample.jsonl: its blend and the share
kept from the previous sub-stage): `{"id": ..., "messages": [...], "tools": [...] (when it has tools)}`.

What Megatron-Bridge 0.6.2 hands the template (conversation_processing.tokenize_chat_example), read
off the released code and checked by tests/engines/megatron/test_real_data.py: the row's
`messages` as written (normalize_chat_conversation keeps every turn that has `role` and `content`
as it is: no null-content or tool-call-argument rewriting) and its `tools`, and nothing else (a
row's template variables are never read: chat_template_kwargs_from_example passes only `tools`).
So a row is written to render to our training text with the template's defaults:

- messages: as our engine hands them to the template (data.chat.render_text): the model's own
  reasoning switch applied (data/reasoning_switch.py: traces dropped when off, a system-prompt
  flag written) and tool-call arguments in the form the template reads (data/tool_arguments.py);
  a message without `content` gets "" (the loader refuses a turn without one);
- reasoning: the same seeded choice our packing made (data.chat.reasoning_enabled with the
  sub-stage's pack seed). A switch that is a template variable (ours: `reasoning`) cannot reach
  the template, so where the variable changes the text (reasoning off) the row carries the
  system prompt the template writes with it instead (`_system_written`): for ours, the system
  turn holding its text, the tools block and the `reasoning: off` line, the tools then not
  repeated as `tools`;
- left out: a conversation longer than the pack, which our packer drops and never cuts
  (Megatron-Bridge would truncate it), so both engines train on the same conversations;
- refused: a conversation no row renders to our text for (a template whose variable switch is
  not in its system prompt, or that writes `""` where a message has no content differently
  from a missing one): SFTDataError naming it, since Megatron-Bridge would train other text.
  Every row is rendered as Megatron-Bridge renders it and compared with ours before it is written.

What stays Megatron-Bridge's own: it packs the rows itself (offline packing to the pack size; our
best-fit packs are not carried over), and its assistant mask is the template's generation spans
joined with the turn boundaries it infers from the ChatML markers (infer_assistant_mask_boundary_config:
an assistant turn ends with `<|im_end|>\\n`), so the newline after each assistant turn's `<|im_end|>`
is supervised there, not here: one more supervised token per assistant turn, nothing else. It also
writes its index of the JSONL (`training.jsonl.idx.npy` / `.idx.info`) beside it on first read.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from stagewise.data.atomic import building
from stagewise.data.chat import conversation_id, reasoning_enabled, render, render_text
from stagewise.data.reasoning_switch import SwitchSetting, resolve_switch, switched
from stagewise.data.sft_assembly import SFTDataError, read_sample, write_jsonl
from stagewise.data.tool_arguments import arguments_form, in_form

TRAINING_FILE = "training.jsonl"
"""The split Megatron-Bridge's GPT SFT builder reads under dataset_root (validation and test are off)."""
SYSTEM_OPEN, TURN_END = "<|im_start|>system\n", "<|im_end|>\n"
"""How a ChatML template (ours) opens its system turn and ends every turn."""


def chat_row(conv: dict, tokenizer: Any, reasoning: bool, switch: SwitchSetting = "auto") -> dict:
    """The row Megatron-Bridge renders to exactly our training text for `conv` (see the module
    docstring); SFTDataError when there is none."""
    ours = render_text(conv, tokenizer, reasoning=reasoning, switch=switch)
    messages = _handed(conv, tokenizer, reasoning, switch)
    row = _row(conv, messages, conv.get("tools"))
    if megatron_text(row, tokenizer) == ours:
        return row
    written = _system_written(messages, ours)
    if written is not None:
        row = _row(conv, written, None)
        if megatron_text(row, tokenizer) == ours:
            return row
    raise SFTDataError(f"conversation {conversation_id(conv)!r}: no chat row renders to the text our engine trains "
                       f"on (reasoning {'on' if reasoning else 'off'}): Megatron-Bridge hands the template only a "
                       "row's messages and tools, no template variables; use engine torch, or name a system-prompt "
                       "reasoning switch (tokenizer.reasoning_switch)")


def as_megatron_renders(row: dict) -> dict:
    """`row` as Megatron-Bridge hands it to the chat template: its messages as written and its tools
    (normalize_chat_conversation, chat_template_kwargs_from_example)."""
    return {"messages": copy.deepcopy(row["messages"]), "tools": row.get("tools")}


def megatron_text(row: dict, tokenizer: Any) -> str:
    """The text Megatron-Bridge's chat preprocessing renders for `row` (no generation prompt, no
    template variables); SFTDataError naming the row when the template refuses it."""
    seen = as_megatron_renders(row)
    try:
        return tokenizer.apply_chat_template(seen["messages"], tools=seen["tools"], tokenize=False,
                                             add_generation_prompt=False)
    except Exception as e:  # whatever the template raises about this row  # noqa: BLE001
        raise SFTDataError(f"conversation {row['id']!r}: the chat template cannot render its row "
                           f"({type(e).__name__}: {e})") from None


def _handed(conv: dict, tokenizer: Any, reasoning: bool, switch: SwitchSetting) -> list[dict]:
    """The messages as data.chat hands them to the template (the switch applied, arguments in the
    template's form), each with `content`."""
    messages, _ = switched(conv["messages"], resolve_switch(tokenizer, switch), reasoning)
    if any(m.get("tool_calls") for m in messages):
        messages = in_form(messages, arguments_form(tokenizer), f"conversation {conversation_id(conv)!r}")
    return [{**m, "content": m.get("content", "")} for m in messages]


def _row(conv: dict, messages: list[dict], tools: list | None) -> dict:
    row = {"id": conversation_id(conv), "messages": messages}
    if tools:
        row["tools"] = tools
    return row


def _system_written(messages: list[dict], text: str) -> list[dict] | None:
    """`messages` with a system turn holding the system prompt `text` opens with (ChatML: what the
    template writes between `<|im_start|>system\\n` and the first `<|im_end|>\\n`) in place of their
    own; None when `text` opens with no system turn."""
    if not text.startswith(SYSTEM_OPEN) or TURN_END not in text:
        return None
    system = text[len(SYSTEM_OPEN): text.index(TURN_END)]
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    return [{"role": "system", "content": system}, *rest]


def write_chat_rows(sample: str | Path, tokenizer_dir: str | Path, pack_size: int, off_fraction: float, seed: int,
                    out: Path, switch: SwitchSetting = "auto") -> dict:
    """`<out>/training.jsonl` from a packed sub-stage's sample (see the module docstring), and
    `<out>/report.json`; returns the report. `switch` is the recipe's tokenizer.reasoning_switch.
    An existing complete `out` is reused (the caller names it by content); it is published
    atomically (data.atomic.building)."""
    out = Path(out)
    if (out / "report.json").is_file():
        return json.loads((out / "report.json").read_text())

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows, dropped, off = [], 0, 0
    for _, conv in read_sample(sample):
        on = reasoning_enabled(conv, off_fraction, seed)
        ids, _ = render(conv, tok, reasoning=on, switch=switch)
        if not 0 < len(ids) <= pack_size:  # our packer's rule (data/packing.py): dropped, never cut
            dropped += 1
            continue
        rows.append(chat_row(conv, tok, on, switch))
        off += not on
    if not rows:
        raise SFTDataError(f"no conversation of {sample} fits a pack of {pack_size} tokens")
    report = {"conversations": len(rows), "dropped": dropped, "reasoning_off": off}
    with building(out) as tmp:
        write_jsonl(tmp / TRAINING_FILE, rows)
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
    return report
