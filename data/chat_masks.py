"""Which tokens of a conversation SFT supervises, for any chat template, checked exactly or refused.

A template with `{% generation %}` blocks (ours) declares its assistant spans: transformers
maps them to tokens, and the conversation is one example (`generation_examples`).

A template without them (the published checkpoints': Nemotron 3, Qwen3, Llama 3.1) is asked
what it writes for each assistant turn, in the context it gives that turn (`derived_examples`):

- turn i's context is P = the template's text for messages[:i] with the generation prompt,
  and W = its text for messages[:i+1]. W must start with P (else the generation prompt is
  not how the template opens the turn, and no span can be cut out exactly). The turn is
  W after P, through its end-of-turn token: the last added token of that text before any
  trailing whitespace (the `<|im_end|>` or `<|eot_id|>` the model must learn to stop at);
  the whitespace after it (ChatML's newline) is context. A turn that ends in no added
  token has nothing to stop at and is refused.
- a turn the template writes in its reasoning-off form while its generation prompt opens a trace
  (Nemotron 3's: `<think></think>answer` after a tool's reply, where the prompt is `<think>\n`) is
  taken after the template's own reasoning-off generation prompt instead (`<think></think>`, with
  the switch's off value: TemplateCall.off_prompt), when W starts with that. That is what matches
  inference: a model prompted with the trace opened is never asked to close it at once, while one
  run with reasoning off is prompted with exactly that text and answers after it. W is the same
  text either way (the switch moves only the generation prompt), so the turn trains in the one
  sequence as the rest; a template whose switch is not a variable of its own has no such prompt.
- the span must be the turn: its content, its reasoning trace (when one is kept) and each
  tool call's name must all be written in it (else the template drops part of the turn,
  e.g. Llama 3.1's ignores `reasoning_content`, and training would silently lose it; the message
  then names `reasoning_content: drop`, the SFT data's way to train such data on its answers).
- the examples, each the template's text for a prefix of the conversation: the first is the
  whole conversation, supervising every turn whose own W is a prefix of it. A template that
  rewrites earlier turns once later ones follow (Qwen3 and Nemotron 3 drop the reasoning of
  turns before the last user message) is not prefix-stable: the turns it rewrote are not
  covered, and the latest uncovered turn j starts the next example, W_j, supervising every
  uncovered turn whose W is a prefix of W_j; and so on until every turn is covered. So a
  prefix-stable conversation is one example, and otherwise each assistant turn is trained
  once, on exactly the text the template gives it when the model writes it (a tool call
  and the answer after the tool's reply share an example when the template keeps the call's
  trace until the next user message). Examples come out in conversation order.
- each span must fall on token boundaries of its example's tokens (fast-tokenizer offsets:
  no token may straddle either end), and the example's tokens before the span must be the
  tokens of P itself: what the model is trained to write follows exactly the tokens it is
  prompted with at inference.

Why this is exact: every supervised character range [len(P), len(P) + len(turn)) of an
example E lies in E's prefix W, so E holds there exactly what the template writes for that
turn after exactly its context P. Anything else raises BadInput (exit 2) naming the
conversation, the turn and the reason; a mask is never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import REASONING_FIELDS
from stagewise.data.template_call import TemplateCall

DROP_HINT = ("set stages.sft.data.reasoning_content: drop (`stagewise data pack --reasoning-content drop`) to "
             "discard the traces and train the final responses")
"""How to train traces a template cannot write: the SFT data's field (data/sft_config.py SFTDataConfig)."""
Example = tuple[list[int], list[int]]
"""(input_ids, mask): 1 on every supervised token."""


@dataclass(frozen=True)
class Turn:
    """Assistant turn `k` (message `index`): the characters [start, end) of `written` it writes after `prompt`."""

    k: int
    index: int
    prompt: str
    written: str

    @property
    def start(self) -> int:
        return len(self.prompt)

    @property
    def end(self) -> int:
        return len(self.prompt) + len(self.written[len(self.prompt):].rstrip())


def generation_examples(call: TemplateCall, messages: list[dict]) -> list[Example]:
    """The one example a template with `{% generation %}` blocks marks itself."""
    ids, mask = call.masked(messages)
    if not any(mask) and any(m.get("role") == "assistant" for m in messages):
        raise BadInput(f"{call.name()}: the chat template's {{% generation %}} blocks mark no assistant tokens")
    return [(ids, mask)]


def derived_examples(call: TemplateCall, messages: list[dict]) -> list[Example]:
    """Examples from what the template writes per assistant turn (see the module docstring)."""
    full = call.text(messages)
    turns = [_turn(call, messages, i, k) for k, i in enumerate(i for i, m in enumerate(messages)
                                                                 if m.get("role") == "assistant")]
    groups: list[tuple[str, list[Turn]]] = []
    left, text = turns, full
    while left:
        covered = [t for t in left if text.startswith(t.written)]
        if covered:
            groups.append((text, covered))
            left = [t for t in left if t not in covered]
        if left:
            text = left[-1].written
    groups = sorted(groups, key=lambda g: g[1][-1].k) if turns else [(full, [])]
    return [_encode(call, text, covered) for text, covered in groups]


def _turn(call: TemplateCall, messages: list[dict], i: int, k: int) -> Turn:
    """Assistant turn k (message i) as the template writes it in its context, checked (module docstring)."""
    prompt = call.text(messages[:i], add_generation_prompt=True)
    written = call.text(messages[:i + 1])
    turn = Turn(k, i, prompt, written)
    if not written.startswith(prompt):
        off = call.off_prompt(messages[:i])
        if off is not None and written.startswith(off):  # a turn written in the template's reasoning-off form
            turn = Turn(k, i, off, written)
        else:
            at = _common_prefix(prompt, written)
            tried = " nor its reasoning-off prompt" if off is not None else ""
            _fail(call, turn, f"the template's generation prompt{tried} is not how it opens the turn (the prompt "
                              f"goes on {prompt[at:at + 40]!r}, the turn {written[at:at + 40]!r})")
    text = written[turn.start:turn.end]
    if not _ends_with_added_token(text, call.tokenizer):
        _fail(call, turn, f"the turn ends in no special token the model could stop at ({text[-40:]!r})")
    missing = _unwritten(messages[i], text)
    if missing in REASONING_FIELDS:
        _fail(call, turn, f"the template does not write the turn's {missing}: it writes {text[:80]!r}; {DROP_HINT}")
    if missing:
        _fail(call, turn, f"the template does not write the turn's {missing}: it writes {text[:80]!r}")
    return turn


def _unwritten(message: dict, text: str) -> str | None:
    """What of the message the turn's text lacks (content, reasoning, a tool call's name), or None."""
    content = message.get("content")
    if isinstance(content, str) and content.strip() and content.strip() not in text:
        return "content"
    for key in REASONING_FIELDS:
        trace = message.get(key)
        if isinstance(trace, str) and trace.strip() and trace.strip() not in text:
            return key
    for k, call in enumerate(message.get("tool_calls") or []):
        f = (call.get("function") or call) if isinstance(call, dict) else {}
        name = f.get("name") if isinstance(f, dict) else None
        if isinstance(name, str) and name not in text:
            return f"tool call {k} ({name})"
    return None


def _ends_with_added_token(text: str, tokenizer: Any) -> bool:
    return any(text.endswith(t.content) for t in tokenizer.added_tokens_decoder.values() if t.content.strip())


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _fail(call: TemplateCall, turn: Turn, reason: str) -> NoReturn:
    raise BadInput(f"{call.name()}: assistant turn {turn.k} (message {turn.index}) cannot be masked exactly: {reason}")


def _encode(call: TemplateCall, text: str, turns: list[Turn]) -> Example:
    """`text`'s tokens, 1 on the tokens of each turn, each checked to lie on token boundaries and
    to follow exactly the tokens of its own prompt."""
    tokenizer = call.tokenizer
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("masks without {% generation %} blocks need a fast tokenizer (character offsets)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [0] * len(ids)
    for turn in turns:
        inside = [t for t, (s, e) in enumerate(offsets) if s < turn.end and e > turn.start]
        if not inside or offsets[inside[0]][0] != turn.start or offsets[inside[-1]][1] != turn.end:
            cover = (offsets[inside[0]][0], offsets[inside[-1]][1]) if inside else None
            _fail(call, turn, f"characters {turn.start}..{turn.end} do not fall on token boundaries "
                              f"(its tokens cover {cover})")
        if ids[:inside[0]] != list(tokenizer(turn.prompt, add_special_tokens=False)["input_ids"]):
            _fail(call, turn, "the tokens before the turn are not the tokens of its prompt alone (the tokenizer "
                              "merges across the end of the generation prompt)")
        for t in inside:
            mask[t] = 1
    return ids, mask
