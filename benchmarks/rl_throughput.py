"""RL throughput: one-step off-policy rollouts against synchronous ones, and what each learns.

    python benchmarks/rl_throughput.py [--checkpoint DIR] [--rows DIR] [--steps 20] [--threads 1] [--json]

All three modes run in this one process, one after the other, from the same checkpoint (loaded
afresh for each), with the same seed, prompts, group size and step count, built from the
library pieces the RL stage uses: eval/rl_wiring.py's RLWiring (chat-templated prompts, verifier
rewards), data/rl_sampler.py's sampler, model/rl_batches.py's RolloutBatches (rollouts,
dynamic sampling, advantages), model/objectives/grpo.py's GRPOObjective and
model/trainer.py's Trainer.
- synchronous: each step samples its rollouts from its own starting weights, then trains;
- off-policy:  step s+1's rollouts are sampled in a background thread, from the weights
               before step s trains, while step s trains (the batch is one update stale);
- off-policy, process: the same, but the background thread hands the sampling to a worker
               process (model/rollout/process.py, backend "hf-process", --worker-threads
               torch threads) and waits on a pipe: the two no longer share one GIL.

Measured per mode: the wall time of the loop, from the start of Trainer.fit() to the last
step's logged metrics (so neither the checkpoint fit() writes at its end nor the rollout
of a step that will never train is counted); tokens/s = (response tokens generated +
response tokens trained) / that time; the mean accuracy reward (the verifier's 0/1) over
the last 5 steps' rollouts; and, after training, held-out accuracy on rl_eval.jsonl rows of
the trained domains: greedy (one temperature-0 answer) and pass@1 (the mean over
--heldout-samples sampled answers). The ratio column compares each mode with synchronous.

The prompts are drawn uniformly within each domain (no difficulty profile or curriculum:
both cost rollouts that are not the loop being measured), with the same seed in every mode,
so all train on the same prompts at every step. Off-policy can only gain where sampling
and training can run at the same time: on a GPU, or a CPU with free cores. In a thread on a
CPU, `generate` and a tiny model's training step are mostly Python and take turns on the GIL
(measured on 2 shared cores at load 3.7-4.8, --threads 1, three runs: 0.76-0.79x sync's
tokens/s); the worker process removes that contention, not the one for cores (same runs:
0.78-1.08x sync, with the very same rollouts and updates as the thread). Both off-policy
modes also do more work than sync: the extra full forward that gives `old_logprobs` (about
40% of their rollout-side time here). On a 2-core CPU shared with other work, all compete
for the same cores; the table notes a load average above the core count. There use
`--threads 1`: with more intra-op threads than free cores one mode can run 10x slower than
the other for no reason of its own (measured: sync 29 s/step with 2 threads at load 6
against 2 s/step with 1 thread), and the ratio says nothing.

Defaults: the newest demo SFT checkpoint (runs/tiny/stages/sft-stage2-*/step-*; `stagewise
demo` makes one) and the newest demo RL rows (runs/tiny/rl_world/*/); exit 2 when either is
missing and not given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from stagewise.eval.heldout import round_robin  # noqa: E402

MODES = ("sync", "off-policy", "off-policy-process")
LABELS = {"sync": "sync", "off-policy": "off-policy", "off-policy-process": "off-policy, process"}
LAST = 5  # steps whose train reward is averaged


def newest(pattern: str, root: Path = ROOT) -> Path | None:
    """The most recently modified directory matching `pattern` under `root`, if any."""
    found = [p for p in root.glob(pattern) if p.is_dir()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def default_rows(root: Path = ROOT) -> Path | None:
    found = [p for p in root.glob("runs/tiny/rl_world/*") if (p / "rl_eval.jsonl").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


class Setup:
    """What both modes share: tokenizer, task rows, prompts, the reward function."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from stagewise.data.chat import install_chat_template
        from stagewise.eval.heldout import end_ids
        from stagewise.eval.rewards import RewardConfig
        from stagewise.eval.rl_wiring import RLWiring, load_rows

        self.tokenizer = AutoTokenizer.from_pretrained(str(args.checkpoint))
        if not self.tokenizer.chat_template:
            install_chat_template(self.tokenizer)
        train = [r for d in args.domains for r in load_rows(args.rows / f"rl_{d}.jsonl", d, None, None)]
        heldout = [r for r in load_rows(args.rows / "rl_eval.jsonl", "heldout", None, None) if r.domain in args.domains]
        heldout = round_robin(heldout, lambda r: r.domain, args.heldout)
        self.wiring = RLWiring(self.tokenizer, train + heldout,
                               RewardConfig(accuracy=1.0, format=args.format_weight), reasoning=False)
        self.by_domain: dict[str, list[tuple[str, float]]] = {}
        for r in train:
            self.by_domain.setdefault(r.domain, []).append((r.id, 0.5))
        self.heldout_ids = [r.id for r in heldout]
        self.end_ids = end_ids(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.seq_length = max(len(p.ids) for p in self.wiring.prompts.values()) + args.max_new_tokens


def heldout(generator, setup: Setup, args) -> dict[str, float]:
    """Greedy and pass@1 held-out accuracy over all held-out prompts (each prompt weighs the same)."""
    from stagewise.eval.rl_wiring import by_domain
    from stagewise.model.rl_batches import pass_rates

    if not setup.heldout_ids:
        return {}
    prompts = [setup.wiring.prompts[i] for i in setup.heldout_ids]
    greedy = by_domain(pass_rates(generator, prompts, setup.wiring.score, 1, args.max_new_tokens, 0.0, args.seed),
                       setup.wiring)
    sampled = by_domain(pass_rates(generator, prompts, setup.wiring.score, args.heldout_samples, args.max_new_tokens,
                                   args.temperature, args.seed), setup.wiring)
    return {"greedy": greedy["all"], "pass_at_1": sampled["all"]}


def run_mode(mode: str, setup: Setup, args, device: torch.device, workdir: Path) -> dict:
    """One full RL loop (see the module docstring); returns its measurements."""
    from stagewise.model.build import load_model
    from stagewise.model.rollout import make_generator

    policy = load_model(args.checkpoint, device=device)
    if mode == "off-policy-process":
        generator = make_generator("hf-process", policy, setup.end_ids, setup.pad_id, threads=args.worker_threads)
    else:
        generator = make_generator("hf", policy, setup.end_ids, setup.pad_id, device=device)
    try:
        return _run_mode(mode, setup, args, device, workdir, policy, generator)
    finally:
        if hasattr(generator, "close"):
            generator.close()


def _run_mode(mode: str, setup: Setup, args, device: torch.device, workdir: Path, policy, generator) -> dict:
    from stagewise.data.rl_sampler import CurriculumSampler
    from stagewise.model.config import OptimizerConfig, ScheduleConfig, TrainConfig
    from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective
    from stagewise.model.rl_batches import RolloutBatches, RolloutSettings
    from stagewise.model.trainer import Trainer

    ratios = {d: 1.0 for d in sorted(setup.by_domain)}
    sampler = CurriculumSampler(setup.by_domain, ratios, args.prompts_per_step, args.steps, None, args.seed)
    settings = RolloutSettings(group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                               temperature=args.temperature, off_policy=mode != "sync")
    steps: list[dict[str, float]] = []
    batches = RolloutBatches(policy, generator, setup.wiring.prompts, sampler, setup.wiring.score, settings,
                             args.seed, setup.pad_id)
    rows = args.prompts_per_step * args.group_size
    cfg = TrainConfig(tokens=args.steps * setup.seq_length * rows, seq_length=setup.seq_length, global_batch=rows,
                      micro_batch=math.gcd(rows, args.micro_batch), lb_loss_coeff=0.0, precision="auto",
                      optimizer=OptimizerConfig(lr=args.lr, min_lr=args.lr, weight_decay=0.0),
                      schedule=ScheduleConfig(kind="constant"))
    stamps: list[float] = []

    def log(records) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stamps.extend(time.perf_counter() for _ in records)
        steps.extend(dict(metrics) for _, _, metrics in records)  # the engine logs each batch's rl/ metrics

    trainer = Trainer(policy, cfg, batches, GRPOObjective(GRPOConfig(temperature=args.temperature)),
                      workdir / mode, stage="rl", tokenizer_dir=str(args.checkpoint), recipe_hash="bench", log=log,
                      device=device, progress=False)
    with trainer:
        started = time.perf_counter()
        try:
            trainer.fit()
        finally:
            batches.close()
    wall = stamps[-1] - started
    generated = sum(m["rl/response_length"] * m["rl/groups"] * args.group_size for m in steps)
    tail = steps[-LAST:]
    generator.sync_weights(policy.state_dict())
    with torch.no_grad():
        after = heldout(generator, setup, args)
    return {
        "mode": mode, "steps": len(steps), "wall_s": wall, "step_s": wall / max(len(steps), 1),
        "generated_tokens": int(generated), "trained_tokens": int(batches.trained_tokens),
        "tokens_per_s": (generated + batches.trained_tokens) / wall,
        "rollout_s_per_step": sum(m["rl/rollout_seconds"] for m in steps) / max(len(steps), 1),
        "train_accuracy_last": sum(m["rl/reward/accuracy"] for m in tail) / max(len(tail), 1),
        "kept_groups_mean": sum(m["rl/kept_groups"] for m in steps) / max(len(steps), 1),
        "heldout": after,
    }


def run(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    hf_logging.set_verbosity_error()  # the "mamba_ssm is not installed" fallback notice
    setup = Setup(args)
    from stagewise.model.build import load_model
    from stagewise.model.rollout import make_generator

    start = make_generator("hf", load_model(args.checkpoint, device=device), setup.end_ids, setup.pad_id,
                           device=device)
    with torch.no_grad():
        before = heldout(start, setup, args)
    del start
    modes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            torch.manual_seed(args.seed)
            modes[mode] = run_mode(mode, setup, args, device, Path(tmp))
    sync, off, proc = modes["sync"], modes["off-policy"], modes["off-policy-process"]
    return {
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "checkpoint": str(args.checkpoint), "rows": str(args.rows), "domains": list(args.domains),
        "steps": args.steps, "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "threads": torch.get_num_threads(),
        "heldout_prompts": len(setup.heldout_ids), "heldout_samples": args.heldout_samples,
        "start": {"heldout": before}, "modes": modes,
        "ratio_tokens_per_s": off["tokens_per_s"] / sync["tokens_per_s"],
        "ratio_steps_per_s": sync["wall_s"] / off["wall_s"],
        "ratio_tokens_per_s_process": proc["tokens_per_s"] / sync["tokens_per_s"],
        "ratio_steps_per_s_process": sync["wall_s"] / proc["wall_s"],
        "worker_threads": args.worker_threads,
        "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
    }


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RL throughput: {r['steps']} steps x {r['prompts_per_step']} prompts x G={r['group_size']}, "
                        f"<= {r['max_new_tokens']} new tokens, {r['device']}, {r['threads']} threads")
    for name in ("mode", "wall s", "s/step", "rollout s/step", "tok/s", "vs sync", f"train acc last {LAST}",
                 "held-out greedy", "held-out pass@1"):
        table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=name == "mode")
    fmt = lambda h, k: f"{h[k]:.3f}" if k in h else "-"  # noqa: E731
    start = r["start"]["heldout"]
    table.add_row("start", "", "", "", "", "", "", fmt(start, "greedy"), fmt(start, "pass_at_1"))
    ratios = {"sync": 1.0, "off-policy": r["ratio_tokens_per_s"], "off-policy-process": r["ratio_tokens_per_s_process"]}
    for mode in MODES:
        m, ratio = r["modes"][mode], ratios[mode]
        table.add_row(LABELS[mode], f"{m['wall_s']:.1f}", f"{m['step_s']:.2f}", f"{m['rollout_s_per_step']:.2f}",
                      f"{m['tokens_per_s']:,.0f}", f"{ratio:.2f}x", f"{m['train_accuracy_last']:.3f}",
                      fmt(m["heldout"], "greedy"), fmt(m["heldout"], "pass_at_1"))
    console = Console()
    if not console.is_terminal:  # piped or captured: rich would squeeze the table into 80 columns
        console = Console(width=120)
    console.print(table)
    console.print(f"off-policy / sync: tokens/s {r['ratio_tokens_per_s']:.2f}x, steps/s {r['ratio_steps_per_s']:.2f}x "
                  f"(held-out: {r['heldout_prompts']} prompts, pass@1 over {r['heldout_samples']} samples)")
    console.print(f"off-policy, process / sync: tokens/s {r['ratio_tokens_per_s_process']:.2f}x, "
                  f"steps/s {r['ratio_steps_per_s_process']:.2f}x (rollout worker: {r['worker_threads']} threads)")
    if r["device"] == "cpu" and r["load_avg_1m"] > r["cpu_count"]:
        console.print(f"[yellow]note: load average {r['load_avg_1m']:.1f} on {r['cpu_count']} CPUs: other processes "
                      "share these cores; timings are noisy and off-policy's overlap has no free core to use"
                      + (" (try --threads 1: oversubscribed OpenMP threads slow steps 10x and more)"
                         if r["threads"] > 1 else ""))


def add_demo_inputs(p: argparse.ArgumentParser) -> None:
    """--checkpoint and --rows, defaulting to what `stagewise demo` leaves (`newest`, `default_rows`)."""
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="start checkpoint (default: newest runs/tiny/stages/sft-stage2-*/step-*)")
    p.add_argument("--rows", type=Path, default=None,
                   help="directory of RL rows: rl_<domain>.jsonl + rl_eval.jsonl (default: newest runs/tiny/rl_world/*/)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_demo_inputs(p)
    p.add_argument("--domains", default="arithmetic,format", help="comma-separated domains to train on")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per mode")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=64, help="responses per forward/backward")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--format-weight", type=float, default=0.1, help="weight of the format reward (accuracy: 1)")
    p.add_argument("--heldout", type=int, default=48, help="held-out prompts scored (round-robin over domains)")
    p.add_argument("--heldout-samples", type=int, default=4, help="samples per held-out prompt for pass@1")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--worker-threads", type=int, default=1,
                   help="torch CPU threads of the rollout worker process (mode off-policy, process)")
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = p.parse_args(argv)
    args.domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    if args.checkpoint is None:
        args.checkpoint = newest("runs/tiny/stages/sft-stage2-*/step-*")
        if args.checkpoint is None:
            print("no SFT checkpoint under runs/tiny/stages/sft-stage2-*/step-*: run `stagewise demo` first, "
                  "or give --checkpoint DIR", file=sys.stderr)
            return 2
    if args.rows is None:
        args.rows = default_rows()
        if args.rows is None:
            print("no RL rows under runs/tiny/rl_world/*/: run `stagewise demo` first (its rl stage writes them), "
                  "or give --rows DIR", file=sys.stderr)
            return 2
    if not (args.checkpoint / "config.json").is_file():
        print(f"--checkpoint {args.checkpoint}: not a checkpoint (no config.json)", file=sys.stderr)
        return 2
    missing = [f"rl_{d}.jsonl" for d in args.domains if not (args.rows / f"rl_{d}.jsonl").is_file()]
    missing += [] if (args.rows / "rl_eval.jsonl").is_file() else ["rl_eval.jsonl"]
    if missing:
        print(f"--rows {args.rows}: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
