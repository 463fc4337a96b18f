"""Checkpoint I/O: round trip, safe loading, and atomicity under failures and SIGKILL."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stagewise.model import checkpoint as ck
from stagewise.model.checkpoint import CheckpointMeta, TrainerState
from stagewise.model.rng import capture_rng, restore_rng

REPO = Path(__file__).resolve().parents[2]


def _meta(step, **kw):
    return CheckpointMeta(stage="pretrain", step=step, tokens_seen=step * 64, recipe_hash="abc123", **kw)


def _state(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, 9))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    return TrainerState(
        optimizer=opt.state_dict(),
        progress={"step": 3, "tokens_seen": 192},
        rng=capture_rng(),
        loader={"i": 3, "nested": {"a": [1, 2]}},
        monitors={"routing": {"window": 20, "history": {"2": [[1, 0, 3, 0]]}}},
    )


def _logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def test_round_trip(tmp_path, tiny_model, tokenizer_dir):
    path = ck.save_checkpoint(tmp_path / "step-3", tiny_model, tokenizer_dir, _meta(3, extra={"k": 1}), _state(tiny_model))
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "stagewise.json", "trainer_state"} <= names
    meta = ck.read_meta(path)
    assert (meta.stage, meta.step, meta.tokens_seen, meta.recipe_hash, meta.extra) == ("pretrain", 3, 192, "abc123", {"k": 1})
    assert meta.weight_sha256 == ck.weights_sha256(path) and len(meta.weight_sha256) == 64
    x = torch.randint(0, 256, (2, 12))
    loaded = AutoModelForCausalLM.from_pretrained(path)
    torch.testing.assert_close(_logits(loaded, x), _logits(tiny_model, x), rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(path).eos_token == "<|eos|>"
    state = ck.load_trainer_state(path)
    assert state.progress == {"step": 3, "tokens_seen": 192}
    assert state.loader == {"i": 3, "nested": {"a": [1, 2]}}
    assert state.monitors["routing"]["history"]["2"] == [[1, 0, 3, 0]]
    assert set(state.optimizer["state"]) == set(range(len(list(tiny_model.parameters()))))


def test_trainer_state_loads_with_weights_only(tmp_path, tiny_model):
    path = ck.save_checkpoint(tmp_path / "c", tiny_model, None, _meta(1), _state(tiny_model))
    for name in ("optimizer.pt", "rng.pt", "monitors.pt"):
        torch.load(path / "trainer_state" / name, weights_only=True)  # raises on any pickled object
    json.loads((path / "trainer_state" / "state.json").read_text())


def test_rng_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(state)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])


def test_load_weights_into_existing_model_with_mtp(tmp_path, model_factory):
    from stagewise.model.mtp import attach_mtp

    src, dst = model_factory(seed=1), model_factory(seed=2)
    attach_mtp(src, 2), attach_mtp(dst, 2)
    path = ck.save_checkpoint(tmp_path / "c", src, None, _meta(1))
    assert ck.load_trainer_state(path) is None
    ck.load_weights_into(dst, path)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name


def test_list_and_latest_ignore_temp_and_incomplete_dirs(tmp_path, tiny_model):
    assert ck.list_checkpoints(tmp_path / "none") == [] and ck.latest_checkpoint(tmp_path) is None
    for step in (20, 3, 100):
        ck.save_checkpoint(tmp_path / f"step-{step:08d}", tiny_model, None, _meta(step))
    (tmp_path / ".tmp-step-00000200-999").mkdir()
    (tmp_path / "no-meta").mkdir()
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000020", "step-00000100"]
    assert ck.latest_checkpoint(tmp_path).name == "step-00000100"
    ck.remove_checkpoint(tmp_path / "step-00000100")
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"
    assert not any(p.name.startswith(".trash") for p in tmp_path.iterdir())


def test_save_over_an_existing_name_replaces_it(tmp_path, model_factory):
    ck.save_checkpoint(tmp_path / "c", model_factory(seed=1), None, _meta(1))
    second = model_factory(seed=2)
    path = ck.save_checkpoint(tmp_path / "c", second, None, _meta(2))
    assert ck.read_meta(path).step == 2
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def _assert_previous_intact(stage_dir, good, model):
    assert ck.list_checkpoints(stage_dir) == [good]
    assert ck.read_meta(good).weight_sha256 == ck.weights_sha256(good)
    x = torch.randint(0, 256, (1, 8))
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(good), x), _logits(model, x))


def test_failure_midway_leaves_previous_checkpoint(tmp_path, tiny_model, tokenizer_dir, monkeypatch):
    state = _state(tiny_model)
    good = ck.save_checkpoint(tmp_path / "step-00000001", tiny_model, tokenizer_dir, _meta(1), state)

    def broken(dest, state):  # the model and tokenizer files are written by now
        assert any(p.name == "model.safetensors" for p in dest.parent.iterdir())
        raise OSError("disk full")

    monkeypatch.setattr(ck, "_write_trainer_state", broken)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(tmp_path / "step-00000002", tiny_model, tokenizer_dir, _meta(2), state)
    assert not (tmp_path / "step-00000002").exists()
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())  # cleaned on error
    _assert_previous_intact(tmp_path, good, tiny_model)


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch
    from safetensors.torch import save_file
    from stagewise.model import checkpoint as ck

    target, marker = map(Path, sys.argv[1:3])

    class Model:  # a stand-in: importing transformers would triple the test's time
        def save_pretrained(self, d):
            os.makedirs(d, exist_ok=True)  # as transformers does
            save_file({"w": torch.zeros(1000)}, str(Path(d) / "model.safetensors"))
            (Path(d) / "config.json").write_text("{}")

    real = ck._fsync_tree

    def slow_fsync(root):
        marker.write_text(str(root))  # every file is written, nothing published yet
        time.sleep(120)
        real(root)

    ck._fsync_tree = slow_fsync
    ck.save_checkpoint(target, Model(), None, ck.CheckpointMeta("pretrain", 2, 128, "abc123"))
    """
)


def test_sigkill_during_save_leaves_previous_checkpoint(tmp_path, tiny_model):
    good = ck.save_checkpoint(tmp_path / "step-00000001", tiny_model, None, _meta(1))
    marker = tmp_path.parent / f"{tmp_path.name}-marker"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "step-00000002"), str(marker)],
        env=env, cwd=REPO, stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "child never reached the fsync"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    debris = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-step-00000002-")]
    assert len(debris) == 1 and (debris[0] / "model.safetensors").exists()
    assert not (tmp_path / "step-00000002").exists()
    _assert_previous_intact(tmp_path, good, tiny_model)
    # A later save under the same name clears the dead process's temp dir.
    ck.save_checkpoint(tmp_path / "step-00000002", tiny_model, None, _meta(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000002"]


def test_an_engine_export_is_adopted_with_its_meta_and_tokenizer(tmp_path, tiny_checkpoint):
    from stagewise.model.checkpoint import CheckpointMeta, adopt_checkpoint, read_meta, weights_sha256

    export = tmp_path / "export"
    export.mkdir()
    for name in ("config.json", "model.safetensors"):
        (export / name).write_bytes((tiny_checkpoint / name).read_bytes())
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes((tiny_checkpoint / "tokenizer.json").read_bytes())
    (tok / "config.json").write_text("{}")  # never over the model's own config
    out = adopt_checkpoint(export, tmp_path / "stage" / "step-00000010", tok,
                           CheckpointMeta(stage="pretrain", step=10, tokens_seen=640, recipe_hash="h", parent="p"))
    meta = read_meta(out)
    assert (meta.step, meta.tokens_seen, meta.parent) == (10, 640, "p")
    assert meta.weight_sha256 == weights_sha256(tiny_checkpoint)
    assert (out / "tokenizer.json").is_file() and (out / "config.json").read_text() != "{}"
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out) is not None
    (export / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        adopt_checkpoint(export, tmp_path / "stage" / "step-2", None, meta)
    assert not (tmp_path / "stage" / "step-2").exists()
