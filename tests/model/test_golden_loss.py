"""Golden loss curve for the `tiny` preset (torchtitan's debug-model test): a short fixed run on
CPU in fp32 must reproduce the stored per-step loss and gradient norm, so a change anywhere in
the numerics (model build, initialisation, the objective, the engine's accumulation, clipping,
AdamW, the LR schedule, a library upgrade) fails CI instead of passing unnoticed.

The data is made here from integer arithmetic only (no RNG library whose stream could change),
the seed is fixed and torch runs on one thread (CPU kernels are deterministic at a fixed thread
count), so the run is reproducible to the bit on one machine. The tolerance (1e-6 relative)
only absorbs summation-order differences between CPU instruction sets: on the machine that
wrote the curve (AVX-512), forcing ATen's AVX2 or scalar kernels (ATEN_CPU_CAPABILITY=avx2 or
default) moved no value by more than 2.4e-7 relative, while any change to the model or the
training step moves the first steps by far more than 1e-6.

A deliberate change (a new init, a fixed bug, a torch or transformers upgrade) regenerates the
curve; review the diff of the JSON before committing it:

    STAGEWISE_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/model/test_golden_loss.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden" / "tiny_loss.json"
REGEN = os.environ.get("STAGEWISE_REGEN_GOLDEN") == "1"
RTOL = 1e-6
VOCAB, SEQ, GLOBAL, MICRO, STEPS, SEED = 512, 64, 8, 4, 10, 0
KEYS = ("train/loss", "train/lm_loss", "train/lb_loss", "train/grad_norm", "train/lr")


class ArithmeticRows:
    """Row r of step i: an arithmetic progression mod VOCAB with one token in 8 replaced by a
    value from a linear congruential sequence, so the model has a pattern to learn and noise
    to fail on. Loader protocol (next_batch / state_dict / load_state_dict)."""

    def __init__(self) -> None:
        self.i = 0

    def next_batch(self) -> torch.Tensor:
        rows = []
        for r in range(GLOBAL):
            start, stride, x = (self.i * 7919 + r * 104729) % VOCAB, 1 + (self.i + r) % 3, self.i * GLOBAL + r
            row = []
            for t in range(SEQ + 1):
                x = (1103515245 * x + 12345) % 2**31
                row.append(x % VOCAB if t % 8 == 7 else (start + stride * t) % VOCAB)
            rows.append(row)
        self.i += 1
        return torch.tensor(rows, dtype=torch.long)

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = int(state["i"])


def run_tiny(out_dir: Path) -> dict[str, list[float]]:
    """STEPS optimiser steps of `tiny` (2 micro-batches each, warmup then minus-sqrt decay)."""
    from transformers.utils import logging as hf_logging

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig, TrainConfig
    from stagewise.model.objectives import LMObjective
    from stagewise.model.trainer import Trainer

    hf_logging.set_verbosity_error()
    cfg = TrainConfig(tokens=STEPS * SEQ * GLOBAL, seq_length=SEQ, global_batch=GLOBAL, micro_batch=MICRO,
                      precision="fp32", optimizer={"lr": 3e-3, "min_lr": 3e-5},
                      schedule={"kind": "wsd", "warmup_tokens": 2 * SEQ * GLOBAL, "decay_tokens": 4 * SEQ * GLOBAL})
    model = build_model(ModelConfig(preset="tiny"), vocab_size=VOCAB, seed=SEED)
    rows: list[tuple[int, int, dict]] = []
    Trainer(model, cfg, ArithmeticRows(), LMObjective(cfg.lb_loss_coeff), out_dir, "pretrain", None, "golden",
            log=rows.extend, progress=False).fit()
    assert [step for step, _, _ in rows] == list(range(1, STEPS + 1))
    return {key: [float(m[key]) for _, _, m in rows] for key in KEYS}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_reproduces_the_golden_loss_curve(tmp_path, one_thread):
    got = run_tiny(tmp_path)
    if REGEN:
        doc = {"about": "tests/model/test_golden_loss.py: tiny preset, fp32, CPU, 1 thread; regenerate with "
                        "STAGEWISE_REGEN_GOLDEN=1", "torch": torch.__version__, "curves": got}
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
        pytest.skip(f"regenerated {GOLDEN}")
    want = json.loads(GOLDEN.read_text())["curves"]
    assert set(want) == set(KEYS)
    for key in KEYS:
        assert got[key] == pytest.approx(want[key], rel=RTOL, abs=1e-12), key
    assert got["train/lm_loss"][-1] < got["train/lm_loss"][0] - 0.5  # and the run does learn
