"""How much the RL stage gains, and how much that depends on the seed: SFT -> RL for several seeds
from one base checkpoint, each seed's RL test pass@1 gain with its 95% interval, and the mean.

    python benchmarks/learning.py [--recipe tiny] [--seeds 3] [--first-seed 1] [--checkpoint DIR]
                                  [--workdir runs/learning] [--set KEY=VALUE ...] [--json]

Why: one demo run gives one RL gain, and the gain moves with everything upstream of RL: two SFT
checkpoints that differ only in floating-point rounding gave +0.035 and +0.10 with the same RL
block. A change to the RL recipe is judged here, over seeds, not on one run.

What runs, each in its own `stagewise run ... --json` (as a user would, one process a seed):
- the base: the recipe's stages before SFT (pretraining, merging, long context), once, in
  `<workdir>/base` with the recipe's seed; an unchanged rerun reuses it (`--checkpoint DIR` skips
  it and starts every seed from DIR);
- per seed S: `--stages sft,rl --set seed=S --set model.from=<base>` in `<workdir>/seed-S`. The
  seed is the recipe's: it draws the SFT and RL worlds (the demo's conversations and task rows,
  and so the dev/test split of the held-out prompts), the packing order, every sample and the
  prompts' order. The whole SFT -> RL chain differs between seeds; the base does not.

Reported per seed (the RL stage's closing-table row): test pass@1 before -> after, the gain and its
paired-bootstrap 95% interval over the test prompts (eval/intervals.py), the verdict; and dev
pass@1 after RL (`dev_after`), which is what a change to the RL block may be tuned on (test only
reports). `mean_gain` is the mean of the seeds' test gains. Every `--set` goes to every run.
Time: the demo's SFT and RL stages per seed (about 4 minutes on 2 idle cores), plus the base once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RL_TARGET = "rl/test/pass_at_1/all"
RL_DEV = "rl/dev/pass_at_1/all"


class RunFailed(RuntimeError):
    """A `stagewise run` ended non-zero: its command and the end of what it printed."""


def stagewise_run(recipe: str, stages: list[str], sets: list[str], timeout_s: float) -> dict:
    """`stagewise run RECIPE --stages ... --set ... --json` in a subprocess; its parsed summary."""
    cmd = [sys.executable, "-m", "stagewise.cli", "run", recipe, "--stages", ",".join(stages), "--json"]
    for value in sets:
        cmd += ["--set", value]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, CI=os.environ.get("CI", "1")))
    if proc.returncode != 0:
        raise RunFailed(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def stages_before_sft(recipe: str, sets: list[str]) -> list[str]:
    """The recipe's stages that run before SFT, in pipeline order (what SFT's start comes from)."""
    from stagewise.cli.options import load
    from stagewise.recipe.schema import STAGE_ORDER

    loaded = load(recipe, sets)
    if loaded.recipe.stages.sft is None or loaded.recipe.stages.rl is None:
        raise ValueError(f"{recipe}: the benchmark needs stages.sft and stages.rl")
    return [s for s in STAGE_ORDER[:STAGE_ORDER.index("sft")] if getattr(loaded.recipe.stages, s) is not None]


def seed_row(seed: int, summary: dict) -> dict:
    """One seed's figures from its run's summary: the RL row of the closing table, dev pass@1 after."""
    rl = next(s for s in summary["stages"] if s["stage"] == "rl")
    if rl["metric"] != RL_TARGET or rl["gain_low"] is None:
        raise ValueError(f"seed {seed}: the RL row reports {rl['metric']!r} without an interval")
    return {"seed": seed, "before": rl["before"], "after": rl["after"], "gain": rl["after"] - rl["before"],
            "low": rl["gain_low"], "high": rl["gain_high"], "verdict": rl["verdict"], "items": rl["items"],
            "dev_after": rl["metrics"].get(RL_DEV), "seconds": {s["stage"]: s["seconds"] for s in summary["stages"]},
            "workdir": summary.get("workdir")}


def aggregate(rows: list[dict], base: str) -> dict:
    """The JSON the benchmark prints: every seed's row, the mean gain, how many intervals exclude 0."""
    gains = [r["gain"] for r in rows]
    return {"seeds": rows, "mean_gain": sum(gains) / len(gains) if gains else None,
            "intervals_above_zero": sum(r["low"] > 0 for r in rows), "base_checkpoint": base}


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="RL test pass@1 over seeds (SFT -> RL from one base checkpoint)")
    for name in ("seed", "before", "after", "gain [95% interval]", "verdict", "dev after", "SFT s", "RL s"):
        table.add_column(name, justify="right")
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for r in result["seeds"]:
        table.add_row(str(r["seed"]), f"{r['before']:.4f}", f"{r['after']:.4f}",
                      f"{r['gain']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]", r["verdict"] or "-",
                      "-" if r["dev_after"] is None else f"{r['dev_after']:.4f}",
                      fmt(r["seconds"].get("sft")), fmt(r["seconds"].get("rl")))
    console = Console()
    console.print(table)
    console.print(f"mean gain {result['mean_gain']:+.4f}; intervals above zero: "
                  f"{result['intervals_above_zero']} of {len(result['seeds'])}; base {result['base_checkpoint']}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python benchmarks/learning.py --seeds 3 --json")
    p.add_argument("--recipe", default="tiny", help="a recipe file or a shipped recipe's name (default: tiny)")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    p.add_argument("--first-seed", type=int, default=1, help="seeds are FIRST, FIRST+1, ... (default 1)")
    p.add_argument("--checkpoint", help="start every seed's SFT here instead of the recipe's stages before SFT")
    p.add_argument("--workdir", default="runs/learning", help="the base's and each seed's workdirs go under it")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override for every run (repeatable)")
    p.add_argument("--timeout-s", type=float, default=3600, help="per `stagewise run` (default 3600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from stagewise.data.errors import BadInput

    args = parse(argv)
    workdir = Path(args.workdir).resolve()
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    try:
        base = args.checkpoint
        if base is None:
            before = stages_before_sft(args.recipe, args.sets)
            say(f"base: {','.join(before)} in {workdir / 'base'} (reused when unchanged)")
            summary = stagewise_run(args.recipe, before, [*args.sets, f"workdir={workdir / 'base'}"], args.timeout_s)
            base = summary["stages"][-1]["checkpoint"]
        elif not Path(base).is_dir():
            say(f"--checkpoint {base}: not a directory")
            return 2
        rows = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            started = time.perf_counter()
            say(f"seed {seed}: sft -> rl in {workdir / f'seed-{seed}'}")
            summary = stagewise_run(args.recipe, ["sft", "rl"], [*args.sets, f"seed={seed}", f"model.from={base}",
                                                                 f"workdir={workdir / f'seed-{seed}'}"], args.timeout_s)
            rows.append(seed_row(seed, summary))
            r = rows[-1]
            say(f"seed {seed}: RL test pass@1 {r['before']:.4f} -> {r['after']:.4f}, {r['gain']:+.4f} "
                f"[{r['low']:+.4f}, {r['high']:+.4f}] ({time.perf_counter() - started:.0f} s)")
    except BadInput as e:  # the recipe or a --set refused before anything ran
        say(str(e))
        return 2
    except (RunFailed, ValueError) as e:  # a run failed, or its RL row has no interval to report
        say(str(e))
        return 1
    result = aggregate(rows, str(base))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
