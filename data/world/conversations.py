"""SFT conversations from the demo world, deterministic from a seed (OpenAI messages format).

Domains (each a list of conversations with `id`, `domain`, `messages`, maybe `tools`):
- arithmetic:   a small problem (1-2 digit operands), a one-line trace, the number
- calculator:   a real tool call to the calculator, its real result, the final answer
- sorting:      numbers to sort ascending or descending, a short trace, the list
- lookup:       a few key-value records in the user turn, the value of one key
- format:       given words in UPPERCASE, small sums as JSON, entity facts (from pretraining) in either
- long_context: a long retrieval document (100-600 records) in the user turn (SFT stage 2)

`dirty_lines` mixes clean conversations with planted faults that curation must catch
(malformed JSON, unknown role, undefined tool, tool call without tools, empty assistant
turn, role order, a looping answer, exact and near duplicates), each returned with the
reason curation should give. `generate_sft_world` writes `sft_<domain>.jsonl`,
`sft_dirty.jsonl` and a held-out `sft_eval.jsonl` (split by prompt hash, so no eval
prompt is ever trained on).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from stagewise.data.chat import prompt_key, unit_hash
from stagewise.data.world._common import rng_for
from stagewise.data.world.arithmetic import make_small_problem
from stagewise.data.world.calculator import TOOL, evaluate, random_expression
from stagewise.data.world.facts import COLOURS, SYMBOLS, Entity, make_entities
from stagewise.data.world.retrieval import WORDS, make_retrieval

DOMAINS = ("arithmetic", "calculator", "sorting", "lookup", "format", "long_context")
SYSTEM = "You are a careful assistant. Answer exactly what is asked."


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(content: str, reasoning: str | None = None) -> dict:
    m = {"role": "assistant", "content": content}
    if reasoning:
        m["reasoning_content"] = reasoning
    return m


def arithmetic(rng: random.Random, _: list[Entity]) -> dict:
    """A small problem (80% one-digit, 20% two-digit operands) answered with the number, its
    one-line trace as reasoning: mental arithmetic. Multi-digit problems are the calculator
    domain's (a tool call), and pretraining's (column working): the tiny model cannot do them
    in its head, so asking it to would teach the answer's form and nothing else."""
    p = make_small_problem(rng, 1 if rng.random() < 0.8 else 2)
    ask = rng.choice(["Compute {q}.", "What is {q}?", "Work out {q} and give the result.", "{q} = ?"])
    return {"messages": [_user(ask.format(q=p.question)), _assistant(str(p.answer), f"{p.question} = {p.answer}.")]}


def calculator(rng: random.Random, _: list[Entity]) -> dict:
    expr = random_expression(rng)
    result = evaluate(expr)
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expr})}}
    ask = rng.choice(["Use the calculator to evaluate {e}.", "What is {e}? Use the calculator tool.",
                      "Please calculate {e} with the calculator."])
    return {"tools": [TOOL], "messages": [
        _user(ask.format(e=expr)),
        {"role": "assistant", "content": "", "tool_calls": [call],
         "reasoning_content": f"The user wants {expr}; the calculator gives an exact result."},
        {"role": "tool", "content": result},
        _assistant(f"{expr} = {result}")]}


def sorting(rng: random.Random, _: list[Entity]) -> dict:
    nums = [rng.randint(0, 999) for _ in range(rng.randint(3, 9))]
    desc = rng.random() < 0.5
    order = sorted(nums, reverse=desc)
    way = "descending" if desc else "ascending"
    trace = f"There are {len(nums)} numbers. In {way} order the first is {order[0]} and the last is {order[-1]}."
    return {"messages": [_user(f"Sort these numbers in {way} order: {', '.join(map(str, nums))}"),
                         _assistant(", ".join(map(str, order)), trace)]}


def _records(pairs) -> str:
    return "\n".join(f"{k}: {v}" for k, v in pairs)


def lookup(rng: random.Random, _: list[Entity]) -> dict:
    doc = make_retrieval(rng, rng.randint(4, 30))
    return {"messages": [_user(f"Records:\n{_records(doc.pairs)}\n\nWhat is the value of {doc.key}?"),
                         _assistant(doc.value, f"The record for {doc.key} reads \"{doc.key}: {doc.value}\".")]}


UPPERCASE_WORDS = sorted({*WORDS, *COLOURS, *SYMBOLS})
"""Words the format domain asks to write in uppercase: the world's value words, colours and emblems."""


def format_following(rng: random.Random, entities: list[Entity]) -> dict:
    """A format instruction, in three equal parts: one or two given words in uppercase; a small
    sum as JSON `{"answer": n}` (both as eval/benchmarks' world_chat_format asks); a fact about a
    pretraining entity in uppercase or as a JSON object (the content must be recalled)."""
    kind = rng.random()
    if kind < 1 / 3:
        picked = rng.sample(UPPERCASE_WORDS, rng.randint(1, 2))
        ask = rng.choice(["Write the word{s} {w} in uppercase letters.", "Spell {w} in capital letters.",
                          "Give {w} in uppercase, nothing else."])
        text = " ".join(picked)
        return {"messages": [_user(ask.format(s="s" if len(picked) > 1 else "", w=text)), _assistant(text.upper())]}
    if kind < 2 / 3:
        p = make_small_problem(rng, rng.randint(1, 2))
        return {"messages": [_user(f'Compute {p.question}. Reply only with JSON of the form {{"answer": <number>}}.'),
                             _assistant(json.dumps({"answer": p.answer}), f"{p.question} = {p.answer}.")]}
    e = rng.choice(entities)
    if rng.random() < 0.5:
        field = rng.choice(["location", "colour", "symbol"])
        question = {"location": f"In which region is {e.name}?", "colour": f"What is the official colour of {e.name}?",
                    "symbol": f"Which animal is on the emblem of {e.name}?"}[field]
        answer = str(getattr(e, field)).upper()
        return {"messages": [{"role": "system", "content": SYSTEM},
                             _user(f"{question} Answer in uppercase letters only."), _assistant(answer)]}
    body = json.dumps({"founded": e.founded, "founder": e.founder})
    return {"messages": [_user(f"When was {e.name} founded, and by whom? Reply with a JSON object with keys "
                               f"\"founded\" (a number) and \"founder\" (a string), nothing else."),
                         _assistant(body, f"{e.name} was founded in {e.founded} by {e.founder}.")]}


def long_context(rng: random.Random, _: list[Entity]) -> dict:
    doc = make_retrieval(rng, rng.randint(100, 600))
    return {"messages": [_user(f"Here is a long list of records.\n{_records(doc.pairs)}\n\n"
                               f"Question: what is the value of {doc.key}?"), _assistant(doc.value)]}


MAKERS: dict[str, Callable[[random.Random, list[Entity]], dict]] = {
    "arithmetic": arithmetic, "calculator": calculator, "sorting": sorting, "lookup": lookup,
    "format": format_following, "long_context": long_context}


def domain_conversations(domain: str, n: int, seed: int, n_entities: int = 3000) -> list[dict]:
    """`n` conversations of one domain (ids `<domain>-<i>`) with distinct prompts where the domain
    has enough of them (curation would reject repeats as duplicates), deterministic from the seed.

    `n_entities` must match the world's `facts` count for `format` questions to be about
    entities the pretraining data described."""
    rng = rng_for(seed, f"sft-{domain}")
    entities = make_entities(n_entities, seed) if domain == "format" else []
    out, seen = [], set()
    for i in range(n):
        for _ in range(100):  # a small domain may run out of new prompts: then repeats are allowed
            conv = {"id": f"{domain}-{i}", "domain": domain, **MAKERS[domain](rng, entities)}
            if prompt_key(conv) not in seen:
                break
        seen.add(prompt_key(conv))
        out.append(conv)
    return out


def is_eval(conv: dict, seed: int, fraction: float) -> bool:
    """Held out: a seeded `fraction` of prompts (by prompt hash, so a prompt is never on both sides)."""
    return unit_hash(seed, "sft-eval:" + prompt_key(conv)) < fraction


def _near_copy(conv: dict, rng: random.Random) -> dict:
    """The conversation with one record value changed (a near duplicate for long lookups)."""
    copy = json.loads(json.dumps(conv))
    user = copy["messages"][0]
    lines = user["content"].split("\n")
    i = rng.randrange(1, len(lines) - 2)
    lines[i] = lines[i].rsplit(" ", 1)[0] + f" {rng.randint(1000, 9999)}"
    user["content"] = "\n".join(lines)
    copy["id"] += "-near"
    return copy


def dirty_lines(clean: list[dict], seed: int) -> list[tuple[str, str | None]]:
    """JSONL lines: every clean conversation (reason None) plus planted faults with the reason
    curation should reject them for. Needs some `lookup` conversations for near duplicates."""
    rng = rng_for(seed, "sft-dirty")
    lookups = [c for c in clean if c.get("domain") == "lookup" and len(c["messages"][0]["content"]) > 400]
    u, a = _user("What is 2 + 2?"), _assistant("4")
    bad: list[tuple[dict | str, str]] = [
        ('{"messages": [{"role": "user", "content": "Compute 12 +', "malformed_json"),
        ("[1, 2, 3]", "malformed_json"),
        ({"messages": [u, {"role": "narrator", "content": "Meanwhile..."}, a]}, "unknown_role"),
        ({"messages": [u, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"2 + 2\"}"}}]},
            {"role": "tool", "content": "4"}, a]}, "tool_call_without_tools"),
        ({"tools": [TOOL], "messages": [u, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "content": "sunny"}, a]}, "undefined_tool"),
        ({"messages": [u, _assistant("")]}, "empty_assistant"),
        ({"messages": [u, u, a]}, "role_order"),
        ({"messages": [a, u, a]}, "role_order"),
        ({"messages": [u, {"role": "tool", "content": "4"}, a]}, "role_order"),
        ({"messages": [_user("Count to three."), _assistant("one two three " + "and again one two three " * 12)]},
         "repetition_window"),
    ]
    lines: list[tuple[str, str | None]] = [(json.dumps(c), None) for c in clean]
    rng.shuffle(lines)
    for b, reason in bad:
        lines.insert(rng.randint(0, len(lines)), (b if isinstance(b, str) else json.dumps(b), reason))
    # duplicates go somewhere after their original: curation keeps the first occurrence
    copies = [({**c, "id": c["id"] + "-copy"}, "exact_duplicate") for c in rng.sample(clean, min(3, len(clean)))]
    copies += [(_near_copy(c, rng), "near_duplicate") for c in rng.sample(lookups, min(3, len(lookups)))]
    for copy, reason in copies:
        at = _index_of(lines, copy["id"].rsplit("-", 1)[0])
        lines.insert(rng.randint(at + 1, len(lines)), (json.dumps(copy), reason))
    return lines


def _index_of(lines: list[tuple[str, str | None]], conv_id: str) -> int:
    """Position of the clean line whose conversation id is conv_id."""
    marker = json.dumps({"id": conv_id})[1:-1]  # '"id": "<id>"'
    return next(i for i, (line, reason) in enumerate(lines) if reason is None and marker in line)


def generate_sft_world(out_dir: str | Path, seed: int, per_domain: int = 200, long_context: int = 50,
                       eval_fraction: float = 0.05, n_entities: int = 3000) -> dict[str, Path]:
    """Write sft_<domain>.jsonl (train), sft_eval.jsonl (held out, all domains) and
    sft_dirty.jsonl (a lookup/arithmetic sample with planted faults); returns name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, held_out = {}, []
    for domain in DOMAINS:
        convs = domain_conversations(domain, long_context if domain == "long_context" else per_domain, seed, n_entities)
        train = [c for c in convs if not is_eval(c, seed, eval_fraction)]
        held_out += [c for c in convs if is_eval(c, seed, eval_fraction)]
        paths[domain] = _write(out_dir / f"sft_{domain}.jsonl", [json.dumps(c) for c in train])
    paths["eval"] = _write(out_dir / "sft_eval.jsonl", [json.dumps(c) for c in held_out])
    sample = domain_conversations("lookup", 40, seed + 1) + domain_conversations("arithmetic", 40, seed + 1)
    paths["dirty"] = _write(out_dir / "sft_dirty.jsonl", [line for line, _ in dirty_lines(sample, seed)])
    return paths


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
