"""Held-out conversations: does the model answer them, and how surprised is it by the answers?

    convs = read_conversations("runs/tiny/sft_world/<key>/sft_eval.jsonl")
    heldout_answers(model, tokenizer, convs, limit=100)  # {"exact_match": .., "exact_match_lookup": ..}
    heldout_loss(model, tokenizer, convs, pack_size=1024)  # {"loss": .., "supervised_tokens": ..}

The SFT stage scores the demo world's held-out conversations (`sft_eval.jsonl`, split off
by prompt hash, so none was trained on) before it trains and after each sub-stage. Two
numbers, both through the checkpoint's own chat template:
- answers: the prompt (every turn before the last assistant turn) rendered with reasoning
  off (the model's own switch: data/chat.py chat_text) and the generation prompt, greedy decoding (left-padded batches) until <|im_end|>, compared with the last
  assistant turn's content after stripping whitespace (exact match). Only single-answer
  conversations count (a system/user prefix, then one assistant turn); tool-calling
  conversations need a tool loop and are left to the loss. Per domain as well. Next to it,
  `format_match`: the answer has the target's *shape* (`shape`: digit, upper- and lower-case
  runs collapsed, punctuation kept: "quartz 396" and "amber 411" are both "a 9"), i.e. the
  model answers in the asked form even where it gets the content wrong *(ours)*. A small
  model learns the form long before the skill; exact match needs both.
- loss: the SFT loss on the whole conversations (rendered as training renders them, with
  reasoning), token-normalised over the assistant tokens, packed like training data.
Plain torch/transformers: no Prefect, no MLflow.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch

from stagewise.data.chat import chat_text, turn_end_token
from stagewise.data.reasoning_switch import SwitchSetting
from stagewise.data.sft_config import PackingConfig
from stagewise.data.sft_packs import KEYS, pack_conversations
from stagewise.eval.intervals import rate_interval
from stagewise.eval.metric_names import ANSWER_SCORES, BOUND_ENDS
from stagewise.model.objectives.sft import IGNORE
from stagewise.model.packed import causal_lm, packed_hidden


def read_conversations(path: str | Path) -> list[dict]:
    """Conversations from a JSONL file (one JSON object per line; blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer_items(convs: list[dict], limit: int | None = None,
                 max_prompt_chars: int | None = None) -> list[tuple[list[dict], str, str]]:
    """(prompt messages, target answer, domain) of the single-answer conversations.

    With `limit`, at most that many, taken round-robin over the domains (each domain in its
    file order), so a limit does not drop whole domains. Prompts longer than
    `max_prompt_chars` are skipped (long-context answering has its own evaluation; the
    held-out loss still covers them)."""
    items = []
    for conv in convs:
        msgs = conv.get("messages") or []
        if conv.get("tools") or len(msgs) < 2 or msgs[-1].get("role") != "assistant":
            continue
        prefix = msgs[:-1]
        if any(m.get("role") not in ("system", "user") for m in prefix) or msgs[-1].get("tool_calls"):
            continue
        if max_prompt_chars is not None and sum(len(m.get("content") or "") for m in prefix) > max_prompt_chars:
            continue
        target = (msgs[-1].get("content") or "").strip()
        if target:
            items.append((prefix, target, str(conv.get("domain") or "all")))
    return round_robin(items, lambda item: item[2], limit)


def round_robin(items: list, domain_of: Callable[[Any], str], limit: int | None) -> list:
    """At most `limit` items taken round-robin over their domains (sorted by name; each domain in
    its list order), so a limit never cuts a whole domain out; all of them when `limit` is None."""
    if limit is None or limit >= len(items):
        return list(items)
    by_domain: dict[str, list] = defaultdict(list)
    for item in items:
        by_domain[domain_of(item)].append(item)
    queues = [iter(v) for _, v in sorted(by_domain.items())]
    picked: list = []
    while len(picked) < limit:
        for q in queues:
            item = next(q, None)
            if item is not None and len(picked) < limit:
                picked.append(item)
    return picked


def shape(text: str) -> str:
    """The answer's form: runs of digits -> 9, of upper-case letters -> A, of lower-case -> a; the rest kept.

    "710, 369, 144" -> "9, 9, 9"; '{"answer": -76}' -> '{"a": -9}'; "GREY" -> "A"."""
    out: list[str] = []
    for ch in text:
        c = "9" if ch.isdigit() else "A" if ch.isupper() else "a" if ch.isalpha() else ch
        if not (out and c in "9Aa" and out[-1] == c):
            out.append(c)
    return "".join(out)


def end_ids(tokenizer: Any) -> list[int]:
    """Tokens that end a response: the token the template closes an assistant turn with
    (data.chat.turn_end_token: <|im_end|> for ChatML, <|eot_id|> for Llama 3) and the tokenizer's eos."""
    end = turn_end_token(tokenizer)
    ids = [tokenizer.convert_tokens_to_ids(end)] if end else []
    ids = [i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id and i >= 0]
    return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def heldout_answers(model: torch.nn.Module, tokenizer: Any, convs: list[dict], limit: int | None = None,
                    max_new_tokens: int = 48, batch_size: int = 16, max_prompt_chars: int | None = 6000,
                    device: str = "cpu", switch: SwitchSetting = "auto") -> dict[str, float]:
    """Greedy exact match on the single-answer conversations (see the module docstring).

    Returns {"answered", "exact_match", "format_match", "exact_match_<domain>",
    "format_match_<domain>"...}; an empty dict when no conversation qualifies."""
    return answer_metrics(answer_results(model, tokenizer, convs, limit, max_new_tokens, batch_size, max_prompt_chars,
                                         device, switch))


@torch.no_grad()
def answer_results(model: torch.nn.Module, tokenizer: Any, convs: list[dict], limit: int | None = None,
                   max_new_tokens: int = 48, batch_size: int = 16, max_prompt_chars: int | None = 6000,
                   device: str = "cpu", switch: SwitchSetting = "auto") -> dict[str, dict]:
    """Each answered conversation's result, by item id (`answer_item_ids`): {"domain", "exact_match",
    "format_match"} (0 or 1): what heldout_answers averages and an interval resamples.

    Prompts are generated in left-padded batches of similar length (one decoding step costs
    about the same for 1 or 16 rows on a CPU)."""
    items = answer_items(convs, limit, max_prompt_chars)
    if not items:
        return {}
    prompts = [tokenizer(chat_text(prefix, tokenizer, reasoning=False, add_generation_prompt=True, switch=switch),
                         add_special_tokens=False).input_ids
               for prefix, _, _ in items]
    budgets = [min(max_new_tokens, len(tokenizer(t, add_special_tokens=False).input_ids) + 4) for _, t, _ in items]
    order = sorted(range(len(items)), key=lambda i: len(prompts[i]))
    answers: dict[int, str] = {}
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            for i, text in zip(chunk, _generate(model, tokenizer, [prompts[i] for i in chunk],
                                                max(budgets[i] for i in chunk), device)):
                answers[i] = text
    finally:
        model.train(was_training)
    return {key: {"domain": domain, "exact_match": int(answers[i] == target),
                  "format_match": int(shape(answers[i]) == shape(target))}
            for i, (key, (_, target, domain)) in enumerate(zip(answer_item_ids(items), items))}


def answer_item_ids(items: list[tuple[list[dict], str, str]]) -> list[str]:
    """A stable id per answer item: the hash of its prompt and target (`#2`, `#3`... on repeats), so
    the same conversations scored before and after pair up."""
    ids, seen = [], defaultdict(int)
    for prefix, target, _ in items:
        key = hashlib.sha1(json.dumps([prefix, target], sort_keys=True).encode()).hexdigest()[:16]
        seen[key] += 1
        ids.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return ids


def _rates(results: dict[str, dict]) -> Iterator[tuple[str, list[int]]]:
    """(rate name, its items' 0/1 results): each answer score over all items, then per domain."""
    for name in ANSWER_SCORES:
        per: dict[str, list[int]] = defaultdict(list)
        for r in results.values():
            per[r["domain"]].append(r[name])
        yield name, [h for v in per.values() for h in v]
        yield from ((f"{name}_{d}", v) for d, v in sorted(per.items()))


def answer_intervals(results: dict[str, dict]) -> dict[str, float]:
    """Each of answer_metrics' rates' 95% interval (Wilson's: the items are 0 or 1), as
    `<rate>_low` and `<rate>_high`: what a gate's `bound` reads (eval/gates.py); {} without results."""
    out: dict[str, float] = {}
    if not results:
        return out
    for rate, values in _rates(results):
        out[f"{rate}{BOUND_ENDS[0]}"], out[f"{rate}{BOUND_ENDS[1]}"] = rate_interval(values)
    return out


def answer_metrics(results: dict[str, dict]) -> dict[str, float]:
    """heldout_answers' metrics from answer_results: each score over all items and per domain."""
    if not results:
        return {}
    return {"answered": float(len(results)), **{rate: sum(v) / len(v) for rate, v in _rates(results)}}


def _generate(model: torch.nn.Module, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
              device: str) -> list[str]:
    """Greedy continuations of left-padded prompts, each cut at its first end token and stripped."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    end = end_ids(tokenizer)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=end, pad_token_id=pad)
    texts = []
    for row in out[:, width:].tolist():
        cut = next((j for j, t in enumerate(row) if t in end), len(row))
        texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True).strip())
    return texts


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, tokenizer: Any, convs: list[dict], pack_size: int,
                 limit: int | None = None, batch_size: int = 4, device: str = "cpu",
                 switch: SwitchSetting = "auto") -> dict[str, float]:
    """Token-normalised SFT loss over the assistant tokens of `convs` (packed; longer ones dropped;
    with `limit`, that many taken at an even stride through the list)."""
    if limit and limit < len(convs):  # an even stride keeps every domain of a domain-ordered file
        convs = [convs[i * len(convs) // limit] for i in range(limit)]
    packed = pack_conversations(convs, tokenizer, PackingConfig(pack_size=pack_size), switch=switch)
    rows = {k: torch.from_numpy(packed.rows[k]) for k in KEYS}
    n = len(rows["input_ids"])
    if n == 0:
        return {}
    was_training = model.training
    model.eval()
    lm = causal_lm(model)
    total, count = 0.0, 0
    try:
        for i in range(0, n, batch_size):
            ids, labels, pos, seq = (rows[k][i:i + batch_size].to(device) for k in KEYS)
            hidden = packed_hidden(model, ids, pos, seq)
            logits = lm.lm_head(hidden).float()
            ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.reshape(-1),
                                                   ignore_index=IGNORE, reduction="sum")
            total += float(ce)
            count += int((labels != IGNORE).sum())
    finally:
        model.train(was_training)
    return {"loss": total / max(count, 1), "supervised_tokens": float(count)}
