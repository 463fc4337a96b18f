"""Mamba-2 on the CPU: our PyTorch scan and conv (model/mamba_torch.py) against transformers' reference ones.

    python benchmarks/mamba_scan.py [--rounds 8] [--threads 0] [--json]

Same inputs, same process, timed in alternating rounds (the median of each counts, so a
neighbour's load hits both alike):
- scan:   the SSD chunk scan alone, forward + backward, at the demo's shapes (the tiny preset's
          8 heads x 32, 2 groups, state 32, chunk 32): RL/distillation rollouts (64 x 72 tokens),
          pretraining (8 x 256), long context (2 x 2048);
- step:   one pretraining step of the tiny preset (16 x 256 tokens, micro-batch 8, AdamW),
          transformers' functions installed against ours;
- packed: one SFT step (4 packs x 512 tokens, 9 documents a pack) through our functions, against
          the same rows unpacked: what keeping documents apart costs (transformers' reference
          refuses packed rows without mamba-ssm, so it has no figure here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

SCAN_SHAPES = {"rollouts 64x72": (64, 72), "pretrain 8x256": (8, 256), "long context 2x2048": (2, 2048)}


def alternate(candidates: dict, rounds: int) -> dict[str, float]:
    """Median milliseconds of each zero-argument callable, timed in alternating rounds after one warm call."""
    for fn in candidates.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def scan_case(batch: int, length: int, reference, ours, chunk: int = 32) -> dict:
    g = torch.Generator().manual_seed(0)
    heads, head_dim, groups, state = 8, 32, 2, 32
    x = torch.randn(batch, length, heads, head_dim, generator=g).requires_grad_()
    dt = torch.randn(batch, length, heads, generator=g).requires_grad_()
    A = (-torch.rand(heads, generator=g) * 4 - 0.5).requires_grad_()
    B = torch.randn(batch, length, groups, state, generator=g).requires_grad_()
    C = torch.randn(batch, length, groups, state, generator=g).requires_grad_()
    D, bias = torch.randn(heads, generator=g).requires_grad_(), torch.randn(heads, generator=g).requires_grad_()

    def run(fn):
        return lambda: fn(x, dt, A, B, C, chunk, D=D, dt_bias=bias, dt_softplus=True).sum().backward()

    return {"transformers": run(reference), "ours": run(ours)}


def tiny_model():
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    return build_model(ModelConfig(preset="tiny"), vocab_size=4096, seed=0)


def train_step(model, batch: torch.Tensor, micro: int, seq_idx: torch.Tensor | None = None):
    """A closure: forward, the output layer's cross-entropy, backward per micro-batch; AdamW step."""
    from stagewise.model.objectives.fused_ce import output_layer_cross_entropy
    from stagewise.model.optim import speed_flags
    from stagewise.model.packed import packed_hidden

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, **speed_flags(params))

    def step() -> None:
        per_micro = seq_idx.split(micro) if seq_idx is not None else [None] * len(batch)
        for rows, seqs in zip(batch.split(micro), per_micro):
            ids = rows[:, :-1]
            hidden = (model.model(input_ids=ids, use_cache=False).last_hidden_state if seqs is None
                      else packed_hidden(model, ids, None, seqs))
            loss = output_layer_cross_entropy(hidden.flatten(0, 1), model.lm_head.weight, rows[:, 1:].reshape(-1))
            (loss / rows.numel()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def with_functions(module, functions: dict, fn):
    """fn run with `functions` set on transformers' NemotronH module (restored after)."""
    def run() -> None:
        saved = {k: getattr(module, k) for k in functions}
        for k, v in functions.items():
            setattr(module, k, v)
        try:
            fn()
        finally:
            for k, v in saved.items():
                setattr(module, k, v)
    return run


def run(args) -> dict:
    from transformers.models.nemotron_h import modeling_nemotron_h as module

    from stagewise.model import mamba_torch

    hf_logging.set_verbosity_error()  # the "mamba_ssm is not installed" fallback notice
    mamba_torch.install()
    names = ["mamba2_chunk_scan", "causal_conv1d_fn", "mamba2_split_conv1d_scan_combined"]
    theirs = {n: getattr(module, n).stagewise_reference for n in names}
    out: dict = {"threads": torch.get_num_threads(), "rounds": args.rounds, "scan": {}}
    for label, (batch, length) in SCAN_SHAPES.items():
        ms = alternate(scan_case(batch, length, theirs["mamba2_chunk_scan"], mamba_torch.chunk_scan), args.rounds)
        out["scan"][label] = ms | {"speedup": ms["transformers"] / ms["ours"]}

    gen = torch.Generator().manual_seed(1)
    model = tiny_model()
    batch = torch.randint(3, 4096, (16, 257), generator=gen)
    step = train_step(model, batch, 8)
    ms = alternate({"transformers": with_functions(module, theirs, step), "ours": step}, args.rounds)
    out["step"] = ms | {"speedup": ms["transformers"] / ms["ours"], "tokens": 16 * 256}

    packs = torch.randint(3, 4096, (4, 513), generator=gen)
    seq_idx = torch.zeros(4, 512, dtype=torch.long)
    for r in range(4):
        for cut in sorted(torch.randint(1, 512, (8,), generator=gen).tolist()):
            seq_idx[r, cut:] += 1
    steps = {"unpacked": train_step(model, packs, 4), "packed": train_step(model, packs, 4, seq_idx)}
    ms = alternate(steps, args.rounds)
    out["packed"] = ms | {"packed_over_unpacked": ms["packed"] / ms["unpacked"]}
    out["step_speedup"] = out["step"]["speedup"]
    return out


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Mamba-2 on the CPU ({r['threads']} threads, median of {r['rounds']} alternating rounds)")
    for col, justify in (("what", "left"), ("transformers ms", "right"), ("ours ms", "right"), ("speedup", "right")):
        table.add_column(col, justify=justify)
    for label, m in r["scan"].items():
        table.add_row(f"scan fwd+bwd, {label}", f"{m['transformers']:.1f}", f"{m['ours']:.1f}", f"{m['speedup']:.2f}x")
    s = r["step"]
    table.add_row("tiny pretraining step, 16x256", f"{s['transformers']:.0f}", f"{s['ours']:.0f}",
                  f"{s['speedup']:.2f}x")
    p = r["packed"]
    table.add_row("SFT step 4x512, packed (ours) vs unpacked", "refuses", f"{p['packed']:.0f} vs {p['unpacked']:.0f}",
                  f"packing costs {p['packed_over_unpacked'] - 1:+.0%}")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="alternating timed rounds (the median counts)")
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
