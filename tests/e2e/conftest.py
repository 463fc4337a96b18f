"""Shared by the SFT and gate end-to-end tests: one tiny pretraining per test session.

Pretraining is the expensive part of every later stage's test, so it runs once, into a
workdir the tests reuse: `stagewise run ... --stages pretrain,sft` with the same pretrain
settings finds the finished pretrain stage directory and trains nothing there, and the
`--stages sft` variants start from its checkpoint through `model.from`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
PRETRAIN_TOKENS = 163_840  # 40 steps: well below the unigram baseline, a base model worth fine-tuning
PRETRAIN_SETS = [f"stages.pretrain.tokens={PRETRAIN_TOKENS}", "stages.pretrain.checkpoint_every_tokens=81920"]
# SFT as the SFT and RL end-to-end tests run it (the RL test reuses the SFT test's finished stage):
# stage 1 at the recipe's own budget, stage 2 two steps, smaller evaluations.
SFT_STAGE2_TOKENS = 16_384
SFT_SETS = [
    f"stages.sft.stages[1].tokens={SFT_STAGE2_TOKENS}",
    "stages.sft.data.heldout_limit=100", "stages.sft.eval_limit=30", "eval.chat=[world_chat_format]",
    # the recipe's stage-1 gate at a bar this weaker base (40 pretraining steps) clears: the answer's
    # form, on the lower end of its 95% interval (the recipe's gate reads bounds too)
    "stages.sft.stages[0].gate.all=[{metric: eval/sft_dev/format_match, bound: lower, op: '>=', value: 0.1}]",
]

# RL and distillation as the demo runs them (held-out pass@1 over 8 samples per prompt, every held-out
# prompt): the e2e model is weaker and its gains smaller, so the tests assert their sign. Held-out
# scoring is half of these stages' time; 16 samples per prompt cost CI three minutes.
RL_SETS: list[str] = []


@dataclass(frozen=True)
class Pretrained:
    workdir: Path
    checkpoint: Path
    sets: list[str]
    """The --set values that reproduce this pretraining (same stage directory: reused)."""


def stagewise(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess (as a user would), CI=1 for plain progress output."""
    cmd = [sys.executable, "-m", "stagewise.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CI="1"), timeout=timeout)


def sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.fixture(scope="session")
def cli():
    """`cli(*args)` runs stagewise; `cli.sets(*k=v)` spreads --set flags; `cli.summary(proc)` parses --json output."""
    def run(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
        return stagewise(*args, timeout=timeout)

    run.sets, run.summary, run.tiny, run.sft_sets, run.sft_stage2_tokens = sets, summary_of, TINY, SFT_SETS, SFT_STAGE2_TOKENS
    run.rl_sets = RL_SETS
    return run


@pytest.fixture(scope="session")
def tiny_pretrain(tmp_path_factory) -> Pretrained:
    workdir = tmp_path_factory.mktemp("tiny-sft")
    values = [f"workdir={workdir}", *PRETRAIN_SETS]
    summary = summary_of(stagewise("run", str(TINY), "--stages", "pretrain", *sets(*values), "--json"))
    return Pretrained(workdir, Path(summary["stages"][0]["checkpoint"]), values)

