"""One SFT sub-stage's conversations as the chat JSONL Megatron-Bridge's SFT dataset reads, for `engine: megatron`.

    report = write_chat_rows(sample_jsonl, tokenizer_dir, pack_size=512, off_fraction=0.5, seed=3, out=root)
    # root/training.jsonl, root/report.json: {"conversations", "dropped", "reasoning_off"}

`--dataset local-jsonl` with engines/megatron/translate.py's chat_jsonl_overrides reads
`<root>/training.jsonl` through Megatron-Bridge's ChatSFTPreprocessingConfig: each row's
`messages` (and `tools`) rendered by the run's HF tokenizer's chat template with the row's
`chat_template_kwargs`, the loss on the assistant turns. The run's tokenizer is the SFT start
checkpoint's, which carries our template (data/templates/chat.jinja), so a row renders to the
text our engine trains on (data/chat.py). This is the faithful route: prompt/completion rows
(the preset's default schema) would supervise only a last answer and lose the earlier assistant
turns, tool calls and the per-conversation reasoning switch. A row per conversation of the
sub-stage's sample (sample.jsonl: its blend and the share kept from the previous sub-stage):

    {"id": ..., "messages": [...], "tools": [...] (when it has tools), "chat_template_kwargs": {"reasoning": bool}}

- reasoning: the same seeded choice our packing made (data.chat.reasoning_enabled with the
  sub-stage's pack seed), handed to the template as its `reasoning` variable;
- left out: a conversation longer than the pack, which our packer drops and never cuts
  (Megatron-Bridge would truncate it), so both engines train on the same conversations;
- refused: a conversation Megatron-Bridge would render differently. Its loader normalises rows
  before rendering (conversation_processing.normalize_chat_conversation: null content becomes "",
  tool-call `arguments` JSON strings are parsed to objects, which the template writes back with
  `tojson`), so each conversation is rendered both ways here and a difference raises SFTDataError
  naming it (e.g. arguments written `{"a":1}` rather than `{"a": 1}`).

What stays Megatron-Bridge's own: it packs the rows itself (offline packing to the pack size; our
best-fit packs are not carried over), and its assistant mask, inferred from the ChatML markers
(infer_assistant_mask_boundary_config), ends each turn with the `<|im_end|>\\n` that closes it:
the newline after `<|im_end|>` is supervised there, not here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from stagewise.data.atomic import building
from stagewise.data.chat import conversation_id, reasoning_enabled, render, render_text
from stagewise.data.sft_assembly import SFTDataError, read_sample, write_jsonl

TRAINING_FILE = "training.jsonl"
"""The split Megatron-Bridge's GPT SFT builder reads under dataset_root (validation and test are off)."""


def chat_row(conv: dict, reasoning: bool) -> dict:
    """The row Megatron-Bridge's chat preprocessing reads for `conv` (every message has `content`:
    its loader refuses a turn without one, and turns a null one into "")."""
    row = {"id": conversation_id(conv),
           "messages": [{**m, "content": m.get("content")} for m in conv["messages"]]}
    if conv.get("tools"):
        row["tools"] = conv["tools"]
    row["chat_template_kwargs"] = {"reasoning": reasoning}
    return row


def as_megatron_renders(row: dict) -> dict:
    """`row` as Megatron-Bridge hands it to the chat template: null content as "", tool-call
    arguments parsed from JSON (normalize_chat_conversation)."""
    messages = copy.deepcopy(row["messages"])
    for m in messages:
        if m["content"] is None:
            m["content"] = ""
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            f = call.get("function") if isinstance(call, dict) else None
            if isinstance(f, dict) and isinstance(f.get("arguments"), str):
                f["arguments"] = json.loads(f["arguments"])
    return {**row, "messages": messages}


def write_chat_rows(sample: str | Path, tokenizer_dir: str | Path, pack_size: int, off_fraction: float, seed: int,
                    out: Path) -> dict:
    """`<out>/training.jsonl` from a packed sub-stage's sample (see the module docstring), and
    `<out>/report.json`; returns the report. An existing complete `out` is reused (the caller
    names it by content); it is published atomically (data.atomic.building)."""
    out = Path(out)
    if (out / "report.json").is_file():
        return json.loads((out / "report.json").read_text())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows, dropped, off = [], 0, 0
    for _, conv in read_sample(sample):
        on = reasoning_enabled(conv, off_fraction, seed)
        ids, _ = render(conv, tok, reasoning=on)
        if not 0 < len(ids) <= pack_size:  # our packer's rule (data/packing.py): dropped, never cut
            dropped += 1
            continue
        row = chat_row(conv, on)
        _same_text(conv, row, tok, on)
        rows.append(row)
        off += not on
    if not rows:
        raise SFTDataError(f"no conversation of {sample} fits a pack of {pack_size} tokens")
    report = {"conversations": len(rows), "dropped": dropped, "reasoning_off": off}
    with building(out) as tmp:
        write_jsonl(tmp / TRAINING_FILE, rows)
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
    return report


def _same_text(conv: dict, row: dict, tokenizer, reasoning: bool) -> None:
    """SFTDataError unless Megatron-Bridge's normalised row renders to the text our engine trains on."""
    try:
        theirs = render_text(as_megatron_renders(row), tokenizer, reasoning=reasoning)
    except (ValueError, TypeError) as e:  # arguments that are not JSON: Megatron-Bridge refuses the row too
        raise SFTDataError(f"conversation {row['id']!r}: Megatron-Bridge cannot read it ({e})") from None
    if theirs != render_text(conv, tokenizer, reasoning=reasoning):
        raise SFTDataError(f"conversation {row['id']!r} renders differently once Megatron-Bridge normalises it "
                           "(tool-call arguments are re-serialised with json.dumps' separators, null content "
                           "becomes \"\"): write its arguments as json.dumps writes them, or use engine torch")
