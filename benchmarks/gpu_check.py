"""GPU check rows: our engine's pretrain rate and MFU, a vLLM rollout batch, a Megatron-Bridge log, one table.

    python benchmarks/gpu_pretrain.py pretrain [--preset small] [--steps 20] --out ROW.json
    python benchmarks/gpu_pretrain.py vllm [--preset small] --out ROW.json
    python benchmarks/gpu_pretrain.py megatron-log LOG --global-batch 8 --seq-length 2048 --out ROW.json
    python benchmarks/gpu_pretrain.py row --what W --status S --note N --out ROW.json
    python benchmarks/gpu_pretrain.py table ROW.json...

benchmarks/gpu_check.sh runs each measurement in its own process under a timeout (a crash or a
hang of one leaves the others standing; vLLM and the trainer never hold the GPU at once) and
prints the rows together. Each row is a small JSON dict: what, status (ok | not installed |
failed | skipped), tokens_per_s, mfu, kernels, note.

- pretrain: a `--preset` model from model/build.py, trained by model/trainer.py's Trainer in bf16
  on CUDA over one fixed random batch (the loader is not what is measured). tokens/s and MFU are
  the Trainer's own per-step metrics (train/tokens_per_s, train/mfu: model/mfu.py, the dense
  bf16 peak of the GPU's data sheet), the median over the steps after `--warmup`. The kernels
  column says whether the Mamba-2 layers can take mamba-ssm's and causal-conv1d's kernels
  (model/packed.py kernels_available; versions from model/runtime.py mamba_kernels): without
  them transformers falls back to its PyTorch scan, several times slower, which is exactly the
  regression this check exists to catch.
- vllm: the same preset, randomly initialised, saved as an HF checkpoint and loaded by vLLM's
  offline engine (no tokenizer: token-id prompts); one batch of `--prompts` x `--n` sampled
  responses of `--max-new-tokens` (ignore_eos, so every response is full length); tokens/s =
  generated tokens / the generate call's wall time. That is the rollout side of the RL stage
  (model/rollout/vllm.py drives a vLLM server the same way).
- megatron-log: Megatron-Bridge runs in its own environment (gpu_check.sh launches its
  run_recipe.py under torchrun there); this reads the `elapsed time per iteration (ms)` and
  `throughput per GPU (TFLOP/s/GPU)` its training log prints and makes them tokens/s and MFU.

Only the `pretrain` and `vllm` measurements need a GPU; the parsing and the table do not.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STATUSES = ("ok", "not installed", "failed", "skipped")

_MB_ITER = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_MB_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+)")


def make_row(what: str, status: str, tokens_per_s: float | None = None, mfu: float | None = None,
             kernels: str = "", note: str = "", **extra: Any) -> dict[str, Any]:
    """One row of the table (extra keys are kept in the JSON, not shown)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    return {"what": what, "status": status, "tokens_per_s": tokens_per_s, "mfu": mfu,
            "kernels": kernels, "note": note, **extra}


def format_table(rows: list[dict[str, Any]], title: str = "GPU check") -> str:
    """The rows as a rich table, rendered to text (no colour: it goes to logs too)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (("what", "left"), ("status", "left"), ("tokens/s", "right"), ("MFU", "right"),
                         ("kernels", "left"), ("note", "left")):
        table.add_column(col, justify=justify)
    for r in rows:
        tps = "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}"
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        table.add_row(r["what"], r["status"], tps, mfu, r.get("kernels") or "", r.get("note") or "")
    console = Console(width=160, no_color=True, force_terminal=False, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def parse_megatron_log(text: str, global_batch: int, seq_length: int, peak_tflops: float | None,
                       skip: int = 2) -> dict[str, Any]:
    """A Megatron-Bridge row from its training log: the median iteration time and TFLOP/s/GPU over
    the logged iterations after the first `skip` (warmup: compilation, allocator growth).

    peak_tflops: the GPU's dense bf16 peak in TFLOP/s (None: no MFU). status `failed` when the log
    has no iteration lines (the run died or never reached training)."""
    times = [float(m) for m in _MB_ITER.findall(text)]
    tflops = [float(m) for m in _MB_TFLOPS.findall(text)]
    if not times:
        return make_row("Megatron-Bridge: pretrain", "failed", note="no `elapsed time per iteration` in its log")
    kept = times[skip:] or times[-1:]
    step_ms = statistics.median(kept)
    tf = statistics.median(tflops[skip:] or tflops[-1:]) if tflops else None
    mfu = tf / peak_tflops if tf is not None and peak_tflops else None
    return make_row("Megatron-Bridge: pretrain", "ok", tokens_per_s=global_batch * seq_length / (step_ms / 1000.0),
                    mfu=mfu, note=f"{len(kept)} iterations, {step_ms:.0f} ms each, {global_batch}x{seq_length}",
                    step_ms=step_ms, tflops_per_gpu=tf)


def gpu_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of a GPU by name, in TFLOP/s (model/mfu.py's table); None when unknown."""
    from stagewise.model.mfu import GPU_PEAK_BF16

    return next((peak / 1e12 for key, peak in GPU_PEAK_BF16 if key in name), None)


def _need_cuda():
    import torch

    if not torch.cuda.is_available():
        print("gpu_pretrain: torch sees no CUDA device: this measurement needs one GPU", file=sys.stderr)
        raise SystemExit(2)
    return torch.device("cuda")


def kernels_column(device) -> str:
    """Whether Mamba-2 gets the mamba-ssm / causal-conv1d kernels on `device`, with their versions."""
    from stagewise.model.packed import kernels_available
    from stagewise.model.runtime import mamba_kernels

    return ("yes: " if kernels_available(device) else "no: ") + mamba_kernels(device.type)


class _FixedBatches:
    """The loader protocol over one fixed batch (what is timed is the training step)."""

    def __init__(self, batch) -> None:
        self.batch, self.n = batch, 0

    def next_batch(self):
        self.n += 1
        return self.batch

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def run_pretrain(args) -> dict[str, Any]:
    """The `pretrain` row (see the module docstring)."""
    device = _need_cuda()
    import torch
    from transformers.utils import logging as hf_logging

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig, TrainConfig
    from stagewise.model.objectives import LMObjective
    from stagewise.model.trainer import Trainer

    hf_logging.set_verbosity_error()
    steps = args.warmup + args.steps
    cfg = TrainConfig(tokens=steps * args.seq_length * args.global_batch, seq_length=args.seq_length,
                      global_batch=args.global_batch, micro_batch=args.micro_batch, precision="bf16")
    model = build_model(ModelConfig(preset=args.preset), vocab_size=args.vocab, seed=0, device=device)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, args.vocab, (args.global_batch, args.seq_length + 1), generator=gen).to(device)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, _FixedBatches(batch), LMObjective(cfg.lb_loss_coeff), Path(tmp) / "ckpt",
                          "gpu-check", None, "gpu-check", log=lambda buf: rows.extend(m for _, _, m in buf),
                          device=device, progress=False)
        trainer.fit()
    timed = rows[args.warmup:] or rows[-1:]
    tps = statistics.median(r["train/tokens_per_s"] for r in timed)
    mfu = statistics.median(r["train/mfu"] for r in timed) if all("train/mfu" in r for r in timed) else None
    return make_row(f"ours: pretrain ({args.preset})", "ok", tokens_per_s=tps, mfu=mfu, kernels=kernels_column(device),
                    note=f"{len(timed)} steps, {args.global_batch}x{args.seq_length} (micro {args.micro_batch}), bf16, "
                         f"{torch.cuda.get_device_name(device)}",
                    params=sum(p.numel() for p in model.parameters()),
                    final_loss=rows[-1].get("train/loss") if rows else None)


def run_vllm(args) -> dict[str, Any]:
    """The `vllm` row (see the module docstring); `not installed` when vllm does not import."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return make_row("vLLM: rollout batch", "not installed", note="pip install 'stagewise[gpu]' (brings vllm)")
    device = _need_cuda()
    import torch

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(ModelConfig(preset=args.preset), vocab_size=args.vocab, seed=0)
        model.save_pretrained(tmp)
        del model
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=tmp, skip_tokenizer_init=True, dtype="bfloat16", seed=0, enforce_eager=args.eager,
                  gpu_memory_utilization=args.gpu_memory, max_model_len=args.prompt_len + args.max_new_tokens)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1, args.vocab, (args.prompts, args.prompt_len), generator=gen).tolist()
        prompts = [TokensPrompt(prompt_token_ids=row) for row in ids]
        params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_new_tokens, ignore_eos=True,
                                detokenize=False, seed=0)
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, detokenize=False), use_tqdm=False)  # warmup
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
    generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return make_row(f"vLLM: rollout batch ({args.preset})", "ok", tokens_per_s=generated / wall,
                    note=f"{args.prompts} prompts x n={args.n}, {args.max_new_tokens} new tokens, "
                         f"{torch.cuda.get_device_name(device)}",
                    generated_tokens=generated, wall_s=wall)


def _write(row: dict[str, Any], out: str | None) -> None:
    text = json.dumps(row, indent=1)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("pretrain", "vllm"):
        s = sub.add_parser(name)
        s.add_argument("--preset", default="small")
        s.add_argument("--vocab", type=int, default=4096)
        s.add_argument("--out")
        if name == "pretrain":
            s.add_argument("--steps", type=int, default=20, help="timed steps (median counts)")
            s.add_argument("--warmup", type=int, default=5, help="untimed steps first")
            s.add_argument("--seq-length", type=int, default=2048)
            s.add_argument("--global-batch", type=int, default=16)
            s.add_argument("--micro-batch", type=int, default=8)
        else:
            s.add_argument("--prompts", type=int, default=64)
            s.add_argument("--n", type=int, default=8)
            s.add_argument("--prompt-len", type=int, default=128)
            s.add_argument("--max-new-tokens", type=int, default=256)
            s.add_argument("--gpu-memory", type=float, default=0.5, help="vLLM gpu_memory_utilization")
            s.add_argument("--eager", action="store_true", help="no CUDA graphs (faster start, slower decode)")
    s = sub.add_parser("megatron-log")
    s.add_argument("log")
    s.add_argument("--global-batch", type=int, required=True)
    s.add_argument("--seq-length", type=int, required=True)
    s.add_argument("--gpu-name", default="", help="for the MFU peak (model/mfu.py's table)")
    s.add_argument("--out")
    s = sub.add_parser("row")
    s.add_argument("--what", required=True)
    s.add_argument("--status", required=True, choices=STATUSES)
    s.add_argument("--note", default="")
    s.add_argument("--out")
    s = sub.add_parser("table")
    s.add_argument("rows", nargs="+")
    s.add_argument("--title", default="GPU check")
    args = p.parse_args(argv)

    if args.cmd == "pretrain":
        _write(run_pretrain(args), args.out)
    elif args.cmd == "vllm":
        _write(run_vllm(args), args.out)
    elif args.cmd == "megatron-log":
        text = Path(args.log).read_text(errors="replace") if Path(args.log).exists() else ""
        _write(parse_megatron_log(text, args.global_batch, args.seq_length, gpu_peak_tflops(args.gpu_name)), args.out)
    elif args.cmd == "row":
        _write(make_row(args.what, args.status, note=args.note), args.out)
    else:
        rows = []
        for path in args.rows:
            try:
                rows.append(json.loads(Path(path).read_text()))
            except (OSError, json.JSONDecodeError) as err:
                rows.append(make_row(Path(path).stem, "failed", note=f"no result ({err.__class__.__name__})"))
        print(format_table(rows, args.title), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
