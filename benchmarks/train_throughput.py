"""Training throughput: the engine's Trainer against a bare PyTorch loop, and the loader.

    python benchmarks/train_throughput.py [--steps N] [--preset tiny] [--json]

Same model (one initialisation copied twice), same fixed batch, same geometry:
- bare:   for each micro-batch: forward, cross-entropy, backward; AdamW step; zero_grad
          (same AdamW implementation flags and autocast as the engine, so only the engine's
          own work differs);
- engine: model.trainer.Trainer with default settings: schedule, clipping, gradient stats,
          NaN guard, routing and activation monitors, metric buffering, logging each step.
The two are timed in alternating short rounds after warmup and the median step time of
each counts, so a neighbour's load on a shared machine hits both alike. On a busy shared
CPU use `--threads 1`: with more intra-op threads than free cores, OpenMP hand-offs make
steps 10-75x slower and the timings meaningless. The engine's time runs from its
first to its last logged step of a round, which leaves out the checkpoint fit() writes at
its end. The target is engine / bare >= 0.95.

The data loader is timed on PretrainBatches.next_batch over a small prepared dataset
(synthetic text through data.prepare), or over an in-memory token array when the data
package is missing: its tokens/s should be far above the training rate.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from stagewise.model.config import ModelConfig, TrainConfig  # noqa: E402
from stagewise.model.objectives import LMObjective  # noqa: E402
from stagewise.model.optim import speed_flags  # noqa: E402
from stagewise.model.step import autocast, resolve_precision  # noqa: E402
from stagewise.model.trainer import Trainer  # noqa: E402


class FixedBatches:
    """The loader protocol over one fixed batch."""

    def __init__(self, batch: torch.Tensor) -> None:
        self.batch, self.n = batch, 0

    def next_batch(self) -> torch.Tensor:
        self.n += 1
        return self.batch

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(preset: str, vocab: int, device: torch.device) -> torch.nn.Module:
    from stagewise.model.build import build_model

    return build_model(ModelConfig(preset=preset), vocab_size=vocab, seed=0, device=device)


def bare_loop(model, batch, cfg: TrainConfig, device):
    """A closure running one plain training step (the baseline)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optimizer.lr, betas=cfg.optimizer.betas,
                            weight_decay=cfg.optimizer.weight_decay, **speed_flags(params))
    amp = resolve_precision(cfg.precision, device)
    micros = batch.split(cfg.micro_batch)

    def step() -> None:
        for micro in micros:
            with autocast(device, amp):
                logits = model(input_ids=micro[:, :-1], use_cache=False).logits
                loss = F.cross_entropy(logits.flatten(0, 1), micro[:, 1:].flatten()) / len(micros)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_bare(step, steps: int, device) -> list[float]:
    """Seconds of each of `steps` bare steps."""
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def time_engine(trainer: Trainer, stamps: list[float], steps: int) -> list[float]:
    """Seconds of each of `steps` engine steps: gaps between consecutive logged steps."""
    stamps.clear()
    trainer.fit(until_tokens=trainer.tokens_seen + (steps + 1) * trainer.cfg.tokens_per_step)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def loader_rate(seq: int, global_batch: int, vocab: int, workdir: Path, batches: int) -> tuple[float, str]:
    """Tokens/s of PretrainBatches.next_batch on a small prepared dataset (or a fallback)."""
    try:
        from stagewise.data.config import DataConfig, PhaseConfig, SourceConfig, TokenizerConfig
        from stagewise.data.loader import PretrainBatches
        from stagewise.data.prepare import prepare_data
    except ImportError:
        return _in_memory_rate(seq, global_batch, vocab, batches), "in-memory array (no data package)"
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(3000)]
    with open(workdir / "bench.jsonl", "w") as f:
        for _ in range(4000):
            f.write(json.dumps({"text": " ".join(rng.choice(words, size=int(rng.integers(50, 400))))}) + "\n")
    data = DataConfig(sources=[SourceConfig(name="bench", path=str(workdir / "bench.jsonl"))])
    prepared = prepare_data(data, TokenizerConfig(vocab_size=min(vocab, 4096)), workdir, 0, workdir, progress=False)
    total = 10**12
    loader = PretrainBatches(prepared, [PhaseConfig(name="all", blend={"bench": 1.0})], {"bench": 1e6},
                             seq, global_batch, total, seed=0)
    loader.next_batch()
    t0 = time.perf_counter()
    for _ in range(batches):
        loader.next_batch()
    n_tok = prepared.sources["bench"].train_tokens
    return batches * seq * global_batch / (time.perf_counter() - t0), f"PretrainBatches, prepared ({n_tok:,} tokens)"


def _in_memory_rate(seq: int, global_batch: int, vocab: int, batches: int) -> float:
    tokens = np.random.default_rng(0).integers(0, vocab, 10_000_000, dtype=np.uint16)
    t0 = time.perf_counter()
    cursor = 0
    for _ in range(batches):
        out = np.empty((global_batch, seq + 1), dtype=np.int64)
        for r in range(global_batch):
            out[r] = tokens[cursor: cursor + seq + 1]
            cursor = (cursor + seq + 1) % (len(tokens) - seq - 1)
        torch.from_numpy(out)
    return batches * seq * global_batch / (time.perf_counter() - t0)


def run(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    hf_logging.set_verbosity_error()  # the "mamba_ssm is not installed" fallback notice
    tps = args.seq_length * args.global_batch
    rounds = -(-args.steps // args.round_steps)
    cfg = TrainConfig(tokens=(args.warmup + rounds * (args.round_steps + 1)) * tps, seq_length=args.seq_length,
                      global_batch=args.global_batch, micro_batch=args.micro_batch)
    base = build(args.preset, args.vocab, device)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, args.vocab, (args.global_batch, args.seq_length + 1), generator=gen).to(device)
    bare_model, engine_model = copy.deepcopy(base), copy.deepcopy(base)
    del base
    bare = bare_loop(bare_model, batch, cfg, device)
    stamps: list[float] = []

    def log(rows) -> None:
        sync(device)
        stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(engine_model, cfg, FixedBatches(batch), LMObjective(cfg.lb_loss_coeff), Path(tmp) / "ckpt",
                          "bench", None, "bench", log=log, device=device, progress=False)
        for _ in range(args.warmup):
            bare()
        trainer.fit(until_tokens=args.warmup * tps)
        bare_s, engine_s = [], []
        for _ in range(rounds):
            bare_s += time_bare(bare, args.round_steps, device)
            engine_s += time_engine(trainer, stamps, args.round_steps)
        loader_tok_s, loader_kind = loader_rate(args.seq_length, args.global_batch, args.vocab, Path(tmp), 200)
    bare_tok_s, engine_tok_s = tps / statistics.median(bare_s), tps / statistics.median(engine_s)
    return {
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "preset": args.preset, "params": sum(p.numel() for p in engine_model.parameters()),
        "seq_length": args.seq_length, "global_batch": args.global_batch, "micro_batch": args.micro_batch,
        "steps": len(bare_s), "rounds": rounds, "threads": torch.get_num_threads(),
        "bare_tokens_per_s": bare_tok_s, "engine_tokens_per_s": engine_tok_s, "ratio": engine_tok_s / bare_tok_s,
        "bare_step_s": bare_s, "engine_step_s": engine_s,
        "loader_tokens_per_s": loader_tok_s, "loader": loader_kind, "loader_over_train": loader_tok_s / engine_tok_s,
        "target_ratio": 0.95, "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
    }


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"train throughput: {r['preset']} ({r['params']:,} params), {r['device']}, "
                        f"{r['global_batch']}x{r['seq_length']} (micro {r['micro_batch']})")
    table.add_column("what")
    table.add_column("tokens/s", justify="right")
    table.add_column("vs bare / vs engine", justify="right")
    table.add_row("bare PyTorch loop", f"{r['bare_tokens_per_s']:,.0f}", "1.00")
    ok = "ok" if r["ratio"] >= r["target_ratio"] else "BELOW TARGET"
    table.add_row("engine Trainer", f"{r['engine_tokens_per_s']:,.0f}", f"{r['ratio']:.3f} ({ok}, target 0.95)")
    table.add_row(f"loader: {r['loader']}", f"{r['loader_tokens_per_s']:,.0f}", f"{r['loader_over_train']:,.0f}x training")
    console = Console()
    console.print(table)
    if r["device"] == "cpu" and r["load_avg_1m"] > r["cpu_count"]:
        console.print(f"[yellow]note: load average {r['load_avg_1m']:.1f} on {r['cpu_count']} CPUs: other processes "
                      "share these cores; timings are noisy (try --threads 1)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps of each loop (median step counts)")
    p.add_argument("--round-steps", type=int, default=5, help="steps per alternating bare/engine round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = p.parse_args(argv)
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
