"""Write the local benchmark items (eval/benchmarks/data/*.jsonl) from the demo world's generators.

    python -m stagewise.eval.benchmarks.build_tasks            # rewrite the files (byte-identical when nothing changed)
    python -m stagewise.eval.benchmarks.build_tasks --check    # exit 1 if a committed file is stale

The items test skills, not the world's invented entities: those depend on the recipe's
seed, while a benchmark must mean the same thing for every recipe. So every task draws
from its own fixed RNG (`rng_for(0, "eval/<task>")`) and reuses the world's renderers
(`render_problem`'s "Compute ...", `render_retrieval`'s records), so the prompts look like
the pretraining text the tiny model has seen. The files are committed; a test checks that
this script still reproduces them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

from stagewise.data.world._common import rng_for
from stagewise.data.world.arithmetic import Problem, make_problem, make_small_problem
from stagewise.data.world.retrieval import WORDS, make_retrieval, render_retrieval

DATA_DIR = Path(__file__).resolve().parent / "data"
N_ITEMS = 100
Row = dict[str, object]


def _problems(rng: random.Random, n: int) -> list[tuple[str, Problem]]:
    """40% one-digit, 40% two-digit, 20% the world's own (multi-digit) problems: headroom at every size."""
    out = []
    for i in range(n):
        tier = ("1-digit", "2-digit", "world")[0 if i % 5 < 2 else 1 if i % 5 < 4 else 2]
        p = make_problem(rng) if tier == "world" else make_small_problem(rng, 1 if tier == "1-digit" else 2)
        out.append((tier, p))
    return out


def _compute_prompt(p: Problem) -> str:
    """The first and last lines of `render_problem`, without the worked steps in between."""
    return f"Compute {p.question}.\nAnswer:"


def world_arithmetic(rng: random.Random) -> list[Row]:
    """Question -> the final answer, in one line (exact match)."""
    return [{"kind": tier, "prompt": _compute_prompt(p), "target": str(p.answer)} for tier, p in _problems(rng, N_ITEMS)]


def _distractors(answer: int, rng: random.Random) -> list[int]:
    """Three wrong answers a careless adder would give: off by one, off by ten, digits swapped."""
    near = [answer + 1, answer - 1, answer + 10, answer - 10, answer + 2, answer * 10]
    s = str(abs(answer))
    if len(s) >= 2 and s[-1] != s[-2]:
        near.append(int(("-" if answer < 0 else "") + s[:-2] + s[-1] + s[-2]))
    pool = sorted({x for x in near if x != answer})
    return rng.sample(pool, 3)


def world_arithmetic_mc(rng: random.Random) -> list[Row]:
    """The same questions, four candidate answers scored by log-likelihood."""
    rows = []
    for tier, p in _problems(rng, N_ITEMS):
        choices = [p.answer, *_distractors(p.answer, rng)]
        rng.shuffle(choices)
        rows.append({"kind": tier, "prompt": _compute_prompt(p), "choices": [str(c) for c in choices],
                     "label": choices.index(p.answer)})
    return rows


def world_compare_mc(rng: random.Random) -> list[Row]:
    """Which of two numbers is larger (or smaller): two choices, same digits count half the time."""
    rows = []
    for i in range(N_ITEMS):
        width = rng.randint(1, 4)
        a = rng.randint(10 ** (width - 1) if width > 1 else 0, 10**width - 1)
        b = a
        while b == a:  # half the pairs share a length, so the model must read the digits
            bw = width if i % 2 else rng.randint(1, 4)
            b = rng.randint(10 ** (bw - 1) if bw > 1 else 0, 10**bw - 1)
        word = "larger" if i % 4 < 2 else "smaller"
        want = max(a, b) if word == "larger" else min(a, b)
        rows.append({"kind": word, "prompt": f"Which number is {word}: {a} or {b}?\nAnswer:",
                     "choices": [str(a), str(b)], "label": [a, b].index(want)})
    return rows


def world_sorting(rng: random.Random) -> list[Row]:
    """Sort 3-5 numbers ascending, or 3-5 of the world's words alphabetically."""
    rows = []
    for i in range(N_ITEMS):
        k = rng.randint(3, 5)
        if i % 2 == 0:
            items = [str(x) for x in rng.sample(range(100), k)]
            prompt, ordered = "Sort these numbers from smallest to largest", sorted(items, key=int)
        else:
            items = rng.sample(WORDS, k)
            prompt, ordered = "Sort these words alphabetically", sorted(items)
        rows.append({"kind": "numbers" if i % 2 == 0 else "words",
                     "prompt": f"{prompt}: {', '.join(items)}.\nAnswer:", "target": ", ".join(ordered)})
    return rows


def _lookup_prompt(rng: random.Random) -> tuple[str, str]:
    """A short key-value document in the world's format, cut before its answer."""
    doc = make_retrieval(rng, rng.randint(3, 8))
    text = render_retrieval(doc)
    return text[: text.rindex("\nAnswer:")], doc.value


def world_lookup(rng: random.Random) -> list[Row]:
    """Records in context, then 'what is the value of K?' -> the value (exact match)."""
    rows = []
    for _ in range(N_ITEMS):
        context, value = _lookup_prompt(rng)
        rows.append({"kind": "lookup", "prompt": f"{context}\nAnswer:", "target": value})
    return rows


def chat(user: str) -> str:
    """One user turn and the assistant header, as data/templates/chat.jinja writes them with
    reasoning off (the system line `reasoning: off` asks for a direct answer, no <think>)."""
    return f"<|im_start|>system\nreasoning: off<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def world_chat_format(rng: random.Random) -> list[Row]:
    """A chat turn whose answer must follow a format instruction: uppercase, or JSON."""
    rows = []
    for i in range(N_ITEMS):
        kind = ("uppercase", "json", "lookup-uppercase")[i % 3]
        if kind == "uppercase":
            word = rng.choice(WORDS)
            user, target = f"Write the word {word} in uppercase letters.", word.upper()
        elif kind == "json":
            p = make_small_problem(rng, rng.randint(1, 2))
            user = f'Compute {p.question}. Reply only with JSON of the form {{"answer": <number>}}.'
            target = json.dumps({"answer": p.answer})
        else:
            context, value = _lookup_prompt(rng)
            user, target = f"{context}\nReply with the value in uppercase letters.", value.upper()
        rows.append({"kind": kind, "prompt": chat(user), "target": target})
    return rows


TASKS: dict[str, Callable[[random.Random], list[Row]]] = {
    "world_arithmetic": world_arithmetic,
    "world_sorting": world_sorting,
    "world_lookup": world_lookup,
    "world_chat_format": world_chat_format,
    "world_arithmetic_mc": world_arithmetic_mc,
    "world_compare_mc": world_compare_mc,
}


def render(name: str) -> str:
    """The JSONL text of one task (ids are the row numbers)."""
    rows = TASKS[name](rng_for(0, f"eval/{name}"))
    return "".join(json.dumps({"id": i, **row}, ensure_ascii=False) + "\n" for i, row in enumerate(rows))


def build(out_dir: Path = DATA_DIR, check: bool = False) -> list[str]:
    """Write every task's JSONL (or, with check, list the ones whose file differs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = []
    for name in TASKS:
        path, text = out_dir / f"{name}.jsonl", render(name)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
            if not check:
                path.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    stale = build(args.out, args.check)
    verb = "stale" if args.check else "written"
    print(f"{verb}: {', '.join(stale) or 'none'} ({args.out})")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
