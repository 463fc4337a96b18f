"""The GPU check's parts, each one row of its table: what a bare GPU machine answers that a CPU cannot.

    python benchmarks/gpu_check.py pretrain [--mamba kernels|torch] [--preset small] --out ROW.json
    python benchmarks/gpu_check.py sft | rl | quant | vllm [--out ROW.json]
    python benchmarks/gpu_check.py megatron-log LOG --global-batch 8 --seq-length 2048 --out ROW.json
    python benchmarks/gpu_check.py row --what W --status S --note N --out ROW.json
    python benchmarks/gpu_check.py table ROW.json... [--json FILE]
    python benchmarks/gpu_check.py covers IMPORTS.json...

benchmarks/gpu_check.sh runs each part in its own process under its own timeout (a crash or a
hang of one leaves the others' rows; vLLM and the trainer never hold the GPU at once) and prints
the rows together. A row is a small JSON dict: what, status (ok | not installed | failed |
skipped), tokens_per_s, mfu, kernels, note, and whatever else the part measured.

- pretrain: a `--preset` model (model/build.py) trained by model/trainer.py's Trainer in bf16 on
  one fixed random batch (the loader is not what is measured); tokens/s and MFU are the Trainer's
  own metrics (train/tokens_per_s, train/mfu: model/mfu.py), the median over the steps after
  `--warmup`. `--mamba kernels` lets the Mamba-2 layers take the kernels that import
  (model/mamba_kernels.py: mamba-ssm's Triton SSD scan, causal-conv1d where built), `--mamba
  torch` makes them run our PyTorch scan and conv (model/mamba_torch.py): the two rows side by
  side are what the kernels are worth. Peak GPU memory is set against `stagewise inspect`'s
  estimate for the same preset, sequence length and micro-batch (model/inspect.py).
- sft: one SFT step on packed rows (several conversations per row, seq_idx apart;
  data/sft_packs.py's PackedBatches, model/objectives/sft.py), after a warmup step.
- rl: one GRPO step with its rollouts: model/rl_batches.py's RolloutBatches sampling through our
  in-process generator (model/rollout/hf.py), rewards by token parity (what is timed is the loop,
  not a verifier), model/objectives/grpo.py's objective; rollout tokens/s and the step's time.
- quant: the `tiny` preset trained a little on a learnable token stream, then AutoQuantize
  (quant/plan.py: modelopt scores, our knapsack, NVFP4/FP8/BF16 under 6 effective bits) and
  calibration on CUDA with modelopt's kernels, and the same on the CPU with our NVFP4 emulation:
  effective bits and held-out loss delta of each, side by side.
- vllm: the preset, randomly initialised, through vLLM's offline engine (token-id prompts), one
  rollout batch's tokens/s; `not installed` where vllm does not import (the wheelhouse does not
  carry it: gigabytes).
- megatron-log: Megatron-Bridge runs in its own environment (gpu_check.sh launches its
  run_recipe.py under torchrun there); this reads the iteration times and TFLOP/s of its log.

`--device cpu` runs a part at toy size on the CPU: the rehearsal `gpu_check.sh --dry-run` runs,
so the code a lent GPU's minutes go to has run before. `--imports-out FILE` records which
distributions a part imported; `covers` checks those against the GPU image's packages
(benchmarks/gpu_image_packages.txt) and the wheelhouse (`python3 dev.py gpu-wheelhouse`).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # stagewise/ and dev.py of this checkout, installed or not

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
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (("what", "left"), ("status", "left"), ("tokens/s", "right"), ("MFU", "right"),
                         ("kernels", "left"), ("note", "left")):
        table.add_column(col, justify=justify)
    for r in rows:
        tps = "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}"
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        table.add_row(*(escape(str(cell)) for cell in (r["what"], r["status"], tps, mfu, r.get("kernels") or "",
                                                       r.get("note") or "")))
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


# ------------------------------------------------------------------------------------------ sizes


GPU_SIZES = {"seq_length": 2048, "global_batch": 16, "micro_batch": 8, "warmup": 3, "steps": 10, "vocab": 4096,
             "rl_prompts": 8, "rl_group": 8, "rl_new_tokens": 128, "quant_train_steps": 200}
"""What each part runs on a GPU (the small preset fills a fraction of an H100: the point is the
kernels and the code path, each part inside its own timeout)."""
TOY_SIZES = {"seq_length": 64, "global_batch": 4, "micro_batch": 2, "warmup": 1, "steps": 1, "vocab": 512,
             "rl_prompts": 2, "rl_group": 2, "rl_new_tokens": 8, "quant_train_steps": 2}
"""The CPU rehearsal's sizes (`--device cpu`): every line of a part runs, in seconds."""


def _device(args):
    """The part's device: cuda (refused with exit 2 where torch sees none) or cpu (the rehearsal)."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device: this part needs one GPU (--device cpu rehearses it)",
              file=sys.stderr)
        raise SystemExit(2)
    return torch.device(args.device)


def _sizes(device) -> dict[str, int]:
    return GPU_SIZES if device.type == "cuda" else TOY_SIZES


def _preset(args, device) -> str:
    """The preset a part runs: its own on a GPU; on the CPU `tiny`, which has every layer kind."""
    return args.preset if device.type == "cuda" else "tiny"


def _device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (rehearsal)"


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def kernels_column(device, mamba: str = "kernels") -> str:
    """Which Mamba-2 functions take a kernel on `device` and which run ours (model/mamba_kernels.py)."""
    from stagewise.model import mamba_kernels

    mamba_kernels.disable(mamba == "torch")
    return mamba_kernels.describe(device.type)


def _fixed_batches(batch):
    """benchmarks/train_throughput.py's loader over one fixed batch (what is timed is the training step)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_throughput", ROOT / "benchmarks" / "train_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FixedBatches(batch)


def _median_rate(rows: list[dict[str, float]], warmup: int) -> tuple[float, float | None, int]:
    timed = rows[warmup:] or rows[-1:]
    tps = statistics.median(r["train/tokens_per_s"] for r in timed)
    mfu = statistics.median(r["train/mfu"] for r in timed) if all("train/mfu" in r for r in timed) else None
    return tps, mfu, len(timed)


def _peak_memory(device) -> int | None:
    import torch

    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


# ------------------------------------------------------------------------------------------ the parts


def run_pretrain(args) -> dict[str, Any]:
    """The `pretrain` row (see the module docstring)."""
    device = _device(args)
    import torch

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig, TrainConfig
    from stagewise.model.inspect import inspect_model
    from stagewise.model.objectives import LMObjective
    from stagewise.model.trainer import Trainer

    _quiet_transformers()
    size, preset = _sizes(device), _preset(args, device)
    kernels = kernels_column(device, args.mamba)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = TrainConfig(tokens=(size["warmup"] + size["steps"]) * size["seq_length"] * size["global_batch"],
                      seq_length=size["seq_length"], global_batch=size["global_batch"], micro_batch=size["micro_batch"],
                      precision=precision)
    model = build_model(ModelConfig(preset=preset), vocab_size=size["vocab"], seed=0, device=device)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, size["vocab"], (size["global_batch"], size["seq_length"] + 1), generator=gen).to(device)
    rows: list[dict[str, float]] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, _fixed_batches(batch), LMObjective(cfg.lb_loss_coeff), Path(tmp) / "ckpt",
                          "gpu-check", None, "gpu-check", log=lambda buf: rows.extend(m for _, _, m in buf),
                          device=device, progress=False)
        trainer.fit()
    peak = _peak_memory(device)
    estimate = inspect_model(ModelConfig(preset=preset), size["vocab"], size["seq_length"], size["micro_batch"],
                             precision).memory.total_bytes
    tps, mfu, n = _median_rate(rows, size["warmup"])
    memory = "" if peak is None else f"; peak {peak / 2**30:.2f} GiB vs inspect's {estimate / 2**30:.2f} GiB"
    return make_row(f"ours: pretrain ({preset}, Mamba-2 {'kernels' if args.mamba == 'kernels' else 'our scan'})",
                    "ok", tokens_per_s=tps, mfu=mfu, kernels=kernels,
                    note=f"{n} steps, {size['global_batch']}x{size['seq_length']} (micro {size['micro_batch']}), "
                         f"{precision}, {_device_name(device)}{memory}",
                    params=sum(p.numel() for p in model.parameters()), final_loss=rows[-1].get("train/loss"),
                    peak_memory_bytes=peak, inspect_estimate_bytes=estimate,
                    memory_over_estimate=None if peak is None else peak / estimate)


def _packed_rows(n_rows: int, length: int, vocab: int, seed: int) -> dict:
    """Packed SFT rows: up to four conversations a row (seq_idx), 60% of positions supervised, none
    across a boundary (numpy, as data/sft_packs.py's packs)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (n_rows, length))
    seq = np.zeros((n_rows, length), dtype=np.int32)
    for r in range(n_rows):
        for cut in sorted(rng.choice(np.arange(1, length - 1), size=rng.integers(0, 4), replace=False)):
            seq[r, cut:] += 1
    labels = np.where(rng.random((n_rows, length)) < 0.6, np.roll(ids, -1, axis=1), -100)
    last = np.ones((n_rows, length), dtype=bool)
    last[:, :-1] = seq[:, 1:] != seq[:, :-1]
    labels[last] = -100
    pos = np.zeros_like(ids)
    for r in range(n_rows):
        starts = np.r_[0, np.flatnonzero(np.diff(seq[r])) + 1]
        for a, b in zip(starts, np.r_[starts[1:], length]):
            pos[r, a:b] = np.arange(b - a)
    return {"input_ids": ids.astype(np.int64), "labels": labels.astype(np.int64), "position_ids": pos.astype(np.int64),
            "seq_idx": seq}


def run_sft(args) -> dict[str, Any]:
    """The `sft` row: one packed SFT step after a warmup step."""
    device = _device(args)
    from stagewise.data.sft_packs import PackedBatches
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig, TrainConfig
    from stagewise.model.objectives.sft import SFTObjective
    from stagewise.model.trainer import Trainer

    _quiet_transformers()
    size, preset = _sizes(device), _preset(args, device)
    kernels = kernels_column(device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    rows = _packed_rows(2 * size["global_batch"], size["seq_length"], size["vocab"], seed=0)
    cfg = TrainConfig(tokens=2 * size["seq_length"] * size["global_batch"], seq_length=size["seq_length"],
                      global_batch=size["global_batch"], micro_batch=size["micro_batch"], precision=precision)
    model = build_model(ModelConfig(preset=preset), vocab_size=size["vocab"], seed=0, device=device)
    logs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, PackedBatches(rows, size["global_batch"], seed=0), SFTObjective("conversation"),
                          Path(tmp) / "ckpt", "gpu-check", None, "gpu-check",
                          log=lambda buf: logs.extend(m for _, _, m in buf), device=device, progress=False)
        trainer.fit()
    tps, mfu, _ = _median_rate(logs, 1)
    conversations = int((rows["seq_idx"].max(axis=1) + 1).sum())
    return make_row(f"ours: SFT step, packed ({preset})", "ok", tokens_per_s=tps, mfu=mfu, kernels=kernels,
                    note=f"{size['global_batch']}x{size['seq_length']} packed ({conversations} conversations in "
                         f"{len(rows['input_ids'])} rows), loss {logs[-1]['train/lm_loss']:.3f}, {_device_name(device)}",
                    lm_loss=logs[-1]["train/lm_loss"])


def _parity(prompt, group) -> dict[str, list[float]]:
    """Reward 1 when a response's first token is even: rewards that vary inside a group."""
    acc = [float(bool(r.response_ids) and r.response_ids[0] % 2 == 0) for r in group]
    return {"accuracy": acc, "total": acc}


class _EveryPrompt:
    """The sampler protocol: every prompt, every step (deterministic)."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def sample(self, step: int, attempt: int) -> list[str]:
        return list(self.ids)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def run_rl(args) -> dict[str, Any]:
    """The `rl` row: one synchronous GRPO step, its rollouts sampled in process."""
    device = _device(args)
    import random

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig, OptimizerConfig, ScheduleConfig, TrainConfig
    from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective
    from stagewise.model.rl_batches import Prompt, RolloutBatches, RolloutSettings
    from stagewise.model.rollout.hf import HFGenerator
    from stagewise.model.trainer import Trainer

    _quiet_transformers()
    size, preset = _sizes(device), _preset(args, device)
    kernels = kernels_column(device)
    end, pad = 2, 0
    rnd = random.Random(0)
    prompts = {f"p{i}": Prompt(f"p{i}", "parity", tuple(rnd.randrange(3, size["vocab"]) for _ in range(32)))
               for i in range(size["rl_prompts"])}
    model = build_model(ModelConfig(preset=preset), vocab_size=size["vocab"], seed=0, device=device)
    settings = RolloutSettings(group_size=size["rl_group"], max_new_tokens=size["rl_new_tokens"], temperature=1.0,
                               off_policy=False, max_refills=0)
    generator = HFGenerator(model, [end], pad, device=device)
    batches = RolloutBatches(model, generator, prompts, _EveryPrompt(sorted(prompts)), _parity, settings, seed=0,
                             pad_id=pad)
    rows = size["rl_prompts"] * size["rl_group"]
    seq = 32 + size["rl_new_tokens"]
    cfg = TrainConfig(tokens=seq * rows, seq_length=seq, global_batch=rows, micro_batch=min(rows, 8), lb_loss_coeff=0.0,
                      precision="bf16" if device.type == "cuda" else "fp32",
                      optimizer=OptimizerConfig(lr=1e-5, min_lr=1e-5, weight_decay=0.0),
                      schedule=ScheduleConfig(kind="constant"))
    logs: list[dict[str, float]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, batches, GRPOObjective(GRPOConfig(temperature=1.0)), Path(tmp) / "ckpt", "rl",
                          None, "gpu-check", log=lambda buf: logs.extend(m for _, _, m in buf), device=device,
                          progress=False)
        with trainer:
            try:
                trainer.fit()
            finally:
                batches.close()
    wall = time.perf_counter() - started
    (m,) = logs
    generated = m["rl/response_length"] * m["rl/groups"] * size["rl_group"]
    rollout_s = m["rl/rollout_seconds"]
    return make_row(f"ours: RL rollout + GRPO step ({preset})", "ok", tokens_per_s=generated / rollout_s,
                    kernels=kernels,
                    note=f"{size['rl_prompts']} prompts x {size['rl_group']}, {size['rl_new_tokens']} new tokens: "
                         f"rollout {rollout_s:.1f} s, step {wall - rollout_s:.1f} s; {_device_name(device)}",
                    rollout_s=rollout_s, step_s=wall - rollout_s, generated_tokens=generated)


def _markov_batches(vocab: int, n: int, batch: int, length: int, seed: int) -> list[dict]:
    """Token rows from a fixed sparse Markov chain (each token has 4 likely successors): a stream
    a tiny model learns in a few hundred steps, so quantization has a loss to lose."""
    import torch

    g = torch.Generator().manual_seed(1234)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g)
    g.manual_seed(seed)
    out = []
    for _ in range(n):
        tok = torch.randint(0, vocab, (batch,), generator=g)
        cols = [tok]
        for _ in range(length - 1):
            tok = successors[tok, torch.randint(0, 4, (batch,), generator=g)]
            cols.append(tok)
        ids = torch.stack(cols, dim=1)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def _mean_loss(model, batches: list[dict], device) -> float:
    import torch

    with torch.no_grad():
        return sum(float(model(**{k: v.to(device) for k, v in b.items()}).loss) for b in batches) / len(batches)


def _quantize_on(model, calib: list[dict], held: list[dict], device) -> dict[str, Any]:
    """AutoQuantize `model` (a copy, moved to `device`) under 6 effective bits: the plan, its bits, loss before/after."""
    from stagewise.quant.config import QuantizeConfig
    from stagewise.quant.operators import operators
    from stagewise.quant.plan import copy_model, effective_bits, quantize_with_plan, search_plan

    model = copy_model(model).to(device).eval()
    ops = operators(model)  # before quantize_with_plan wraps the modules in place (then they count otherwise)
    on = [{k: v.to(device) for k, v in b.items()} for b in calib]
    before = _mean_loss(model, held, device)
    cfg = QuantizeConfig(effective_bits=6.0, calib_batches=len(on), score_batches=len(on))
    t0 = time.perf_counter()
    plan = search_plan(copy_model(model), on, cfg, device.type)
    quantized = quantize_with_plan(model, plan, on, device.type)
    seconds = time.perf_counter() - t0
    after = _mean_loss(quantized, held, device)
    counts: dict[str, int] = {}
    for fmt in plan.formats.values():
        counts[fmt] = counts.get(fmt, 0) + 1
    return {"bits": effective_bits(plan, ops), "before": before, "after": after, "delta": after - before,
            "formats": counts, "seconds": seconds}


def run_quant(args) -> dict[str, Any]:
    """The `quant` row: AutoQuantize of a briefly trained tiny model on `--device` and on the CPU."""
    device = _device(args)
    import torch

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    _quiet_transformers()
    size = _sizes(device)
    vocab, length = 512, 64
    model = build_model(ModelConfig(preset="tiny"), vocab_size=vocab, seed=0, device=device)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = _markov_batches(vocab, size["quant_train_steps"], 16, length, seed=1)
    model.train()
    for b in train:
        loss = model(**{k: v.to(device) for k, v in b.items()}).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    model.eval()
    calib = _markov_batches(vocab, 4, 8, length, seed=2)
    held = _markov_batches(vocab, 4, 16, length, seed=3)
    here = _quantize_on(model, calib, held, device)
    cpu = here if device.type == "cpu" else _quantize_on(model.cpu(), calib, held, torch.device("cpu"))
    fmt = ", ".join(f"{n} {f}" for f, n in sorted(here["formats"].items()))
    note = (f"{_device_name(device)}: {here['bits']:.2f} bits, loss {here['before']:.3f} -> {here['after']:.3f} "
            f"({here['delta']:+.4f}; {fmt}); CPU emulation: {cpu['bits']:.2f} bits, delta {cpu['delta']:+.4f}")
    return make_row("modelopt: AutoQuantize (tiny)", "ok", note=note, effective_bits=here["bits"],
                    loss_delta=here["delta"], cpu_effective_bits=cpu["bits"], cpu_loss_delta=cpu["delta"],
                    formats=here["formats"], seconds=here["seconds"], cpu_seconds=cpu["seconds"])


def run_vllm(args) -> dict[str, Any]:
    """The `vllm` row (see the module docstring); `not installed` when vllm does not import."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return make_row("vLLM: rollout batch", "not installed",
                        note="vllm is not in the wheelhouse (gigabytes); a machine with `stagewise[gpu]` has it")
    device = _device(args)
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
                    note=f"{args.prompts} prompts x n={args.n}, {args.max_new_tokens} new tokens, {_device_name(device)}",
                    generated_tokens=generated, wall_s=wall)


PARTS = {"pretrain": run_pretrain, "sft": run_sft, "rl": run_rl, "quant": run_quant, "vllm": run_vllm}


# ------------------------------------------------------------------------------------------ imports


def loaded_distributions() -> dict[str, str]:
    """Distribution name -> version of every installed package this process imported (stdlib and
    this checkout's own code left out)."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    owners = packages_distributions()
    found: dict[str, str] = {}
    for name in {m.split(".")[0] for m in list(sys.modules)}:
        if name in sys.stdlib_module_names or name.startswith("_") or name in ("stagewise", "__main__"):
            continue
        for dist in owners.get(name, []):
            if dist.lower() == "stagewise":
                continue
            try:
                found[canonical(dist)] = version(dist)
            except PackageNotFoundError:
                pass
    return dict(sorted(found.items()))


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path = ROOT / "benchmarks" / "gpu_image_packages.txt") -> dict[str, tuple[str | None, bool]]:
    """The GPU image's packages: name -> (version where known, kept as it is even against our pins)."""
    image: dict[str, tuple[str | None, bool]] = {}
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            image[canonical(words[0])] = (words[1] if len(words) > 1 and words[1] != "keep" else None,
                                          "keep" in words[1:])
    return image


def wheelhouse_pins() -> dict[str, tuple[str, str]]:
    """The wheelhouse's distributions: name -> (version, why it travels), from dev.py's GPU_WHEELS."""
    import dev

    return {canonical(pin.split("==")[0]): (pin.split("==")[1], why) for pin, why in dev.GPU_WHEELS.items()}


def our_requirements() -> dict[str, str]:
    """pyproject.toml's runtime requirements: name -> specifier."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonical(r.name): str(r.specifier) for r in map(Requirement, deps)}


GPU_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
"""The GPU machine, for the environment markers of requirements (its python3 is CPython 3.12 on x86-64 Linux)."""


def _requires(dist: str) -> list[tuple[str, str]]:
    """(name, specifier) of what `dist`, as installed here, requires on the GPU machine (extras left out)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        reqs = requires(dist) or []
    except PackageNotFoundError:
        return []
    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(GPU_MARKERS):
            out.append((canonical(req.name), str(req.specifier)))
    return out


def coverage_problems(loaded: dict[str, str]) -> list[str]:
    """What a bare GPU machine would lack to run the parts, and what the wheelhouse carries that they
    do not need: [] when the wheelhouse is exactly what the check needs.

    The roots are our own requirements (pyproject.toml) that the parts imported (`loaded`: what
    modelopt imports only because it is installed here, trl or datasets, is no root). From each
    root, its requirements as installed here (extras left out, markers for the GPU machine): one the
    image has at a version the requirer accepts needs nothing; anything else must be in the
    wheelhouse at a version every requirer accepts, and its own requirements are followed. The
    wheelhouse's `GPU only` entries (what only a GPU imports: mamba-ssm) go without dependencies and
    are not followed."""
    from packaging.specifiers import SpecifierSet

    image, pins, ours = read_image(), wheelhouse_pins(), our_requirements()
    problems: list[str] = []
    carried: set[str] = set()
    queue = [(dist, ours[dist], "pyproject.toml") for dist in sorted(ours) if dist in loaded]
    seen: set[tuple[str, str]] = set()
    while queue:
        dist, spec, by = queue.pop(0)
        if (dist, spec) in seen:
            continue
        seen.add((dist, spec))
        if dist in pins:
            have = pins[dist][0]
            if have not in SpecifierSet(spec, prereleases=True):
                problems.append(f"{dist}: the wheelhouse pins {have}, {by} asks {spec}")
            if dist not in carried:
                carried.add(dist)
                queue += [(name, s, dist) for name, s in _requires(dist)]
            continue
        if dist in image:
            have, keep = image[dist]
            if keep or have is None or have in SpecifierSet(spec, prereleases=True):
                continue
            problems.append(f"{dist}: the GPU image has {have}, {by} asks {spec}: carry it (dev.py GPU_WHEELS)")
            continue
        problems.append(f"{dist}: {by} needs it ({spec or 'any version'}), but it is neither in the GPU image "
                        f"nor in the wheelhouse (dev.py GPU_WHEELS)")
    for dist, (_, why) in pins.items():
        if dist not in carried and not why.startswith("GPU only"):
            problems.append(f"{dist}: in the wheelhouse, but nothing the parts import needs it")
    return problems


# ------------------------------------------------------------------------------------------ the command


def _write(row: dict[str, Any], out: str | None) -> None:
    text = json.dumps(row, indent=1)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)


def _read_rows(paths: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        try:
            rows.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as err:
            rows.append(make_row(Path(path).stem, "failed", note=f"no result ({err.__class__.__name__})"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in PARTS:
        s = sub.add_parser(name)
        s.add_argument("--preset", default="small", help="the preset on a GPU (the CPU rehearsal runs tiny)")
        s.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the rehearsal, toy sizes")
        s.add_argument("--out", help="write the row here (default: print it)")
        s.add_argument("--imports-out", help="write the distributions this part imported here (JSON)")
        if name == "pretrain":
            s.add_argument("--mamba", default="kernels", choices=["kernels", "torch"],
                           help="kernels: the Mamba-2 kernels that import; torch: our PyTorch scan and conv")
        if name == "vllm":
            s.add_argument("--vocab", type=int, default=4096)
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
    s.add_argument("--json", help="also write the rows here, as one JSON list")
    s = sub.add_parser("covers", help="check the wheelhouse against what the parts imported")
    s.add_argument("imports", nargs="+", help="--imports-out files of the parts")
    args = p.parse_args(argv)

    if args.cmd in PARTS:
        _write(PARTS[args.cmd](args), args.out)
        if args.imports_out:
            Path(args.imports_out).write_text(json.dumps(loaded_distributions(), indent=1) + "\n")
    elif args.cmd == "megatron-log":
        text = Path(args.log).read_text(errors="replace") if Path(args.log).exists() else ""
        _write(parse_megatron_log(text, args.global_batch, args.seq_length, gpu_peak_tflops(args.gpu_name)), args.out)
    elif args.cmd == "row":
        _write(make_row(args.what, args.status, note=args.note), args.out)
    elif args.cmd == "table":
        rows = _read_rows(args.rows)
        print(format_table(rows, args.title), end="")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    else:
        loaded: dict[str, str] = {}
        for path in args.imports:
            loaded |= json.loads(Path(path).read_text())
        problems = coverage_problems(loaded)
        for line in problems:
            print(f"gpu_check: {line}", file=sys.stderr)
        if problems:
            return 1
        print(f"gpu_check: the GPU image and the wheelhouse cover the {len(loaded)} distributions the parts import")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
