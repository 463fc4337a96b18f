"""End to end: `stagewise run` killed with SIGKILL mid-stage, rerun with `--resume`, ends with
weights `torch.equal` to an uninterrupted run's (CPU, same seed), once in pretraining, once
in an SFT sub-stage and once in RL (whose pending one-step off-policy batch is part of the checkpoint).

Kept cheap: one workdir for the module (a small world, prepared once), 12 short pretraining
steps in two phases (checkpoints every 4 steps) and a 12-step SFT stage 1 on a small
conversation world with no benchmark suite and no gate. The uninterrupted run goes first; the stage's step
directories are then moved aside, so the killed run trains the same directories from scratch
and the comparison is between two complete runs of the same recipe (every step directory of
the stage: for SFT both sub-stages). A kill that came too late (no checkpoint short of the
end) fails the test rather than passing it vacuously.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stagewise.model import checkpoint as ck

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
STEP_TOKENS = 8 * 128  # pretraining steps of 8 rows x 128 tokens, 2 micro-batches (accumulation order matters)
PRETRAIN = [
    "data.world.stdlib_files=20", "data.world.facts=500", "data.world.arithmetic=300", "data.world.retrieval=20",
    "data.world.noisy=100", "tokenizer.vocab_size=1024",
    "stages.pretrain.seq_length=128", "stages.pretrain.global_batch=8", "stages.pretrain.micro_batch=4",
    f"stages.pretrain.tokens={12 * STEP_TOKENS}", f"stages.pretrain.checkpoint_every_tokens={4 * STEP_TOKENS}",
    f"stages.pretrain.schedule.warmup_tokens={2 * STEP_TOKENS}", "stages.pretrain.val_tokens=4096",
]
SFT_STEP = 4 * 512  # stage 1: 4 packs of 512
SFT = [
    f"stages.sft.stages[0].tokens={12 * SFT_STEP}", f"stages.sft.stages[0].checkpoint_every_tokens={3 * SFT_STEP}",
    f"stages.sft.stages[0].schedule.warmup_tokens={2 * SFT_STEP}", "stages.sft.stages[0].micro_batch=2",
    "stages.sft.stages[1].tokens=8192", "stages.sft.stages[1].schedule.warmup_tokens=4096",
    "stages.sft.data.world.per_domain=150", "stages.sft.data.world.long_context=6",
    "stages.sft.data.heldout_limit=4", "stages.sft.eval_suite=null",
    "stages.sft.stages[0].gate=null",  # the recipe's gate wants a full stage 1; resuming is what is tested here
]

RL = [  # 12 GRPO steps of 4 prompts x 4 rollouts, one-step off-policy, checkpoints every 3 steps
    "stages.rl.data.world.per_domain=40", "stages.rl.steps=12", "stages.rl.checkpoint_every_steps=3",
    "stages.rl.prompts_per_step=4", "stages.rl.rollout.group_size=4", "stages.rl.rollout.max_new_tokens=8",
    "stages.rl.filter.samples=4", "stages.rl.data.heldout_limit=8", "stages.rl.data.heldout_samples=2",
]


def command(workdir: Path, stages: str, extra: list[str], resume: bool = False) -> list[str]:
    args = [sys.executable, "-m", "stagewise.cli", "run", str(TINY), "--stages", stages]
    for value in (f"workdir={workdir}", *extra):
        args += ["--set", value]
    return args + (["--resume"] if resume else [])


def run(cmd: list[str], timeout: int = 600) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CI="1"), timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def trained(pattern: str) -> list[str]:
    """Checkpoints matching `pattern` past step 0 (a stage evaluated before training saves its start)."""
    return [p for p in glob.glob(pattern) if not p.endswith("step-00000000")]


def run_and_kill(cmd: list[str], pattern: str, timeout: float = 600) -> None:
    """Start `cmd`, SIGKILL it as soon as a trained checkpoint matching `pattern` exists, and
    clean up whatever it had started (Prefect's temporary server) once it is dead."""
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the run before its checkpoint
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, CI="1"), start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not trained(pattern):
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"the run ended (rc {proc.returncode}) before any checkpoint {pattern}:\n"
                            + log.read()[-5000:])
            if time.monotonic() > deadline:
                pytest.fail(f"no checkpoint {pattern} within {timeout} s")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the dead run's children (its Prefect server)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


def final_checkpoint(stage_glob: str) -> Path:
    dirs = glob.glob(stage_glob)
    assert len(dirs) == 1, dirs
    ckpt = ck.latest_checkpoint(dirs[0])
    assert ckpt is not None, dirs[0]
    return ckpt


def assert_same_tensors(a: Path, b: Path) -> None:
    """Every tensor of model.safetensors (and of the optimizer state) equal, bit for bit."""
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sorted(wa) == sorted(wb)
    assert [k for k in sorted(wa) if not torch.equal(wa[k], wb[k])] == []
    oa, ob = ck.load_trainer_state(a).optimizer["state"], ck.load_trainer_state(b).optimizer["state"]
    assert sorted(oa) == sorted(ob)
    same = lambda x, y: torch.equal(torch.as_tensor(x), torch.as_tensor(y))  # noqa: E731
    differ = [(i, k) for i in oa for k in oa[i] if not same(oa[i][k], ob[i][k])]
    assert differ == []


def kill_and_resume(workdir: Path, stages: str, extra: list[str], stage: str, kill_in: str) -> int:
    """Move the uninterrupted run's `<stage>-*` step directories aside (their finish markers would
    make a rerun reuse them), rerun `stages` and SIGKILL it once `<kill_in>-*` holds a trained
    checkpoint, rerun with --resume, then compare the final checkpoint of every step directory
    with the reference's. Returns the step the killed run had reached."""
    root, aside = workdir / "stages", workdir / f"reference-{stage}"
    aside.mkdir()
    for d in glob.glob(str(root / f"{stage}-*")):
        shutil.move(d, aside / Path(d).name)
    references = {d.name: ck.latest_checkpoint(d) for d in aside.iterdir() if ck.latest_checkpoint(d)}
    run_and_kill(command(workdir, stages, extra), str(root / f"{kill_in}-*" / "step-*"))
    killed = final_checkpoint(str(root / f"{kill_in}-*"))
    assert killed.parent.name in references, (killed.parent.name, sorted(references))  # same content hash
    killed_at, total = ck.read_meta(killed).step, ck.read_meta(references[killed.parent.name]).step
    assert killed_at < total, f"killed too late: the run had already saved step {killed_at} of {total}"
    run(command(workdir, stages, extra, resume=True))
    for name, reference in sorted(references.items()):
        resumed = ck.latest_checkpoint(root / name)
        assert resumed is not None and resumed.name == reference.name, (name, resumed)
        assert_same_tensors(reference, resumed)
    return killed_at


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The uninterrupted pretraining + SFT run (its stage directories are the references)."""
    wd = tmp_path_factory.mktemp("crash-resume")
    run(command(wd, "pretrain,sft", PRETRAIN + SFT))
    return wd


@pytest.mark.slow
def test_sigkill_mid_pretraining_then_resume_is_bit_identical(workdir):
    assert 4 <= kill_and_resume(workdir, "pretrain", PRETRAIN, "pretrain", "pretrain") < 12


@pytest.mark.slow
def test_sigkill_mid_sft_then_resume_is_bit_identical(workdir):
    # pretraining is finished and reused (same settings); the kill lands in SFT stage 1, and
    # stage 2 (whose step hash names stage 1's weights) must come out the same too
    assert 3 <= kill_and_resume(workdir, "pretrain,sft", PRETRAIN + SFT, "sft", "sft-stage1") < 12


@pytest.mark.slow
def test_sigkill_mid_rl_then_resume_is_bit_identical(workdir):
    # the reference: pretraining and SFT reused, RL trained once uninterrupted; the killed run's
    # resume must train the very rollout batches (sampled one step behind) the reference trained
    run(command(workdir, "pretrain,sft,rl", PRETRAIN + SFT + RL))
    assert 3 <= kill_and_resume(workdir, "pretrain,sft,rl", PRETRAIN + SFT + RL, "rl", "rl") < 12
