"""RL prompts from the demo world: NeMo Gym-style rows with a verifiable answer, from a seed.

The prompts are the SFT conversations' own (data/world/conversations.py makers), sampled from
another RNG stream (`rl-<domain>`), so RL asks what SFT taught, in the same words, without
replaying SFT's exact samples. Each row keeps the prompt (messages before the answer, and the
tools), the expected answer taken from the reference answer, and which verifier judges it:

    arithmetic  exact_answer   a small problem; expected_answer the integer
    format      json_answer    a small sum as {"answer": n}; expected_answer n
                uppercase      given words, or an entity's colour / region / emblem, in capitals
                               (the founded/founder JSON question has no verifier and is skipped)
    calculator  calculator     evaluate an expression with the tool; expected_answer its value,
                               `expression` the expression (for the reference call)
    sorting     sorting        numbers to sort; expected_answer the sorted list

`generate_rl_world` writes `rl_<domain>.jsonl` (train) and `rl_eval.jsonl` (held out by a
seeded hash of the prompt key, all domains, so no held-out prompt is trained on).
`reference_completion(row)` is the text a perfect policy would produce for a row: its
environment scores it 1.0 (the tests check every row).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from stagewise.data.chat import unit_hash
from stagewise.data.rl_rows import RLRow, prompt_key, prompt_messages, write_rows
from stagewise.data.world._common import rng_for
from stagewise.data.world.conversations import MAKERS
from stagewise.data.world.facts import make_entities

RL_DOMAINS = ("arithmetic", "format", "calculator", "sorting")
ENVIRONMENTS = {"arithmetic": ("exact_answer",), "format": ("json_answer", "uppercase"), "calculator": ("calculator",),
                "sorting": ("sorting",)}
"""The verifiers each domain's rows name (the table above; format: the `format_kinds` asked for),
known before any row is written (the recipe check of `engine: nemo_rl` maps them to NeMo Gym agents)."""


def _final_answer(conv: dict) -> str:
    return conv["messages"][-1]["content"]


def _row(conv: dict, domain: str, i: int) -> RLRow | None:
    """The RL row of an SFT conversation, or None when no verifier covers its answer."""
    messages = conv["messages"]
    first_answer = next(k for k, m in enumerate(messages) if m["role"] == "assistant")
    prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:first_answer]]
    answer = _final_answer(conv)
    extra: dict = {}
    if domain == "arithmetic":
        env, expected = "exact_answer", int(answer)
    elif domain == "sorting":
        env, expected = "sorting", [int(x) for x in answer.split(", ")]
    elif domain == "calculator":
        call = json.loads(messages[first_answer]["tool_calls"][0]["function"]["arguments"])
        env, expected = "calculator", int(messages[first_answer + 1]["content"])  # + - * of integers
        extra["expression"] = call["expression"]
    else:  # format
        try:
            obj = json.loads(answer)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and set(obj) == {"answer"}:
            env, expected = "json_answer", obj["answer"]
        elif obj is None:
            env, expected = "uppercase", answer
        else:
            return None
    params: dict = {"input": prompt}
    if conv.get("tools"):
        params["tools"] = conv["tools"]
    return RLRow.model_validate({"id": f"rl-{domain}-{i}", "domain": domain, "environment": env,
                                 "responses_create_params": params, "expected_answer": expected, **extra})


def in_reach(row: RLRow, max_digits: int | None, kinds: tuple[str, ...] | None) -> bool:
    """Whether a row belongs to the world asked for: every number in its prompt has at most
    `max_digits` digits (for the arithmetic answers, exact and JSON: mental arithmetic), and
    its verifier is one of `kinds` (None: any)."""
    env = getattr(row, "environment", None)
    if kinds is not None and env not in kinds:
        return False
    if max_digits is not None and env in ("exact_answer", "json_answer"):
        text = " ".join(m["content"] for m in prompt_messages(row))
        return all(len(n) <= max_digits for n in re.findall(r"\d+", text))
    return True


def domain_rows(domain: str, n: int, seed: int, n_entities: int = 3000, max_digits: int | None = None,
                kinds: tuple[str, ...] | None = None) -> list[RLRow]:
    """`n` rows of one domain with distinct prompts where the domain has enough of them,
    deterministic from the seed (stream `rl-<domain>`, not SFT's); with `max_digits` / `kinds`
    only the rows `in_reach` (drawn until there are n)."""
    if domain not in RL_DOMAINS:
        raise ValueError(f"unknown RL domain {domain!r}; known: {', '.join(RL_DOMAINS)}")
    rng = rng_for(seed, f"rl-{domain}")
    entities = make_entities(n_entities, seed) if domain == "format" else []

    def draw(i: int) -> RLRow | None:
        row = _row(MAKERS[domain](rng, entities), domain, i)
        return row if row is not None and in_reach(row, max_digits, kinds) else None

    rows, seen = [], set()
    for i in range(n):
        row = None
        for _ in range(100):  # a small domain may run out of new prompts: then repeats are allowed
            row = draw(i)
            if row is not None and prompt_key(row) not in seen:
                break
        for _ in range(10_000):  # only if 100 draws in a row were out of reach: keep drawing
            if row is not None:
                break
            row = draw(i)
        if row is None:
            raise ValueError(f"the {domain} domain has no rows with max_digits={max_digits}, kinds={kinds}")
        seen.add(prompt_key(row))
        rows.append(row)
    return rows


def is_eval_row(row: RLRow, seed: int, fraction: float) -> bool:
    """Held out: a seeded `fraction` of prompts, by prompt key (a prompt is never on both sides)."""
    return unit_hash(seed, "rl-eval:" + prompt_key(row)) < fraction


def generate_rl_world(out_dir: str | Path, seed: int, per_domain: int = 200, eval_fraction: float = 0.1,
                      n_entities: int = 3000, max_digits: int | None = None,
                      format_kinds: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Write rl_<domain>.jsonl (train) for every RL domain and rl_eval.jsonl (held out, all
    domains); returns domain (and "eval") -> path. `n_entities` must match the world's `facts`
    count for format questions to be about entities pretraining described; `max_digits` and
    `format_kinds` narrow the arithmetic and format rows (see `in_reach`)."""
    out_dir = Path(out_dir)
    paths, held_out = {}, []
    for domain in RL_DOMAINS:
        rows = domain_rows(domain, per_domain, seed, n_entities, max_digits,
                           format_kinds if domain == "format" else None)
        held_out += [r for r in rows if is_eval_row(r, seed, eval_fraction)]
        train = [r for r in rows if not is_eval_row(r, seed, eval_fraction)]
        paths[domain] = write_rows(out_dir / f"rl_{domain}.jsonl", train)
    paths["eval"] = write_rows(out_dir / "rl_eval.jsonl", held_out)
    return paths


def reference_completion(row: RLRow) -> str:
    """The completion a perfect policy gives for a row (what its environment scores 1.0): the
    answer alone, the JSON object, the words in capitals, the list, or the calculator call as
    data/templates/chat.jinja renders an assistant tool call."""
    env, expected = getattr(row, "environment", None), row.expected_answer
    if env == "exact_answer":
        return str(expected)
    if env == "json_answer":
        return json.dumps({"answer": expected})
    if env == "uppercase":
        return " ".join(str(expected).split()).upper()
    if env == "sorting":
        return ", ".join(map(str, expected))
    if env == "calculator":
        expression = getattr(row, "expression", None) or str(expected)
        return ('<tool_call>\n{"name": "calculator", "arguments": '
                + json.dumps({"expression": expression}) + "}\n</tool_call>")
    raise ValueError(f"row {row.id}: no reference completion for environment {env!r}")


__all__ = ["RL_DOMAINS", "domain_rows", "generate_rl_world", "is_eval_row", "reference_completion"]
