"""`engine: megatron` for long context, end to end on CPU against a stand-in Megatron-Bridge
(tests/engines/fake_engines/megatron.py): pretraining (launched too: the stand-in trains nothing,
so the run stays short), then the base checkpoint imported, one torchrun launch at the block's single length on the long-context blend (the
prepared sources' and the document-QA shards as indexed datasets), the export adopted, handed on
and scored by the stage's needle evaluation, and a failing rank failing the stage."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stagewise.data.indexed_format import read_indexed
from stagewise.data.shards import TokenShard
from tests.engines.fake_engines.megatron import run_stagewise

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "recipes" / "tiny.yaml"
SETS = [  # pretraining: 8 steps of 4 x 64 tokens; long context: 2 steps of 4 x 128; both on 2 "GPUs"
    "stages.pretrain.tokens=2048", "stages.pretrain.seq_length=64", "stages.pretrain.global_batch=4",
    "stages.pretrain.micro_batch=2", "stages.pretrain.schedule.warmup_tokens=256",
    "stages.pretrain.val_tokens=1024", "stages.pretrain.eval_suite=null",
    "data.world={facts: 30, arithmetic: 30, stdlib_files: 2, retrieval: 5, noisy: 10}", "tokenizer.vocab_size=300",
    "stages.long_context.tokens=1024",
    "stages.long_context.data={lengths: [{length: 128, share: 1.0}], global_batch_tokens: 512, micro_batch_tokens: 256,"
    " doc_qa: {documents: 12, entities: 30, min_paragraphs: 1, max_paragraphs: 3}}",
    "stages.long_context.needle_lengths=[128]", "stages.long_context.needle_per_length=2",
]


def run(workdir: Path, fake, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_stagewise(TINY, "pretrain,long_context", ["pretrain", "long_context"], fake,
                         [f"workdir={workdir}", *SETS, *extra], env)


@pytest.fixture(scope="module")
def finished(fake_megatron, tmp_path_factory):
    """Pretraining then long context on the stand-in engine: (workdir, the CLI's process)."""
    workdir = tmp_path_factory.mktemp("lc-megatron") / "work"
    return workdir, run(workdir, fake_megatron)


@pytest.mark.slow
def test_long_context_trains_its_blend_at_one_length_on_megatron_and_hands_on_the_export(finished):
    workdir, proc = finished
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    pre, lc = summary["stages"]
    ckpt = Path(lc["checkpoint"])
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "long_context" and meta["step"] == 2 and meta["tokens_seen"] == 1024
    assert meta["extra"] == {"engine": "megatron"} and meta["parent"] == pre["checkpoint"]
    assert (ckpt / "tokenizer.json").is_file() and len(list(ckpt.glob("*.safetensors"))) == 1
    assert "loss/128" in lc["metrics"]  # the needle evaluation's delta, scored by us on the adopted export

    stage_dir = ckpt.parent
    (launch,) = [json.loads(line) for line in (stage_dir / "megatron" / "launches.jsonl").read_text().splitlines()]
    argv = launch["argv"]
    assert launch["world_size"] == 2 and argv[argv.index("--mode") + 1] == "pretrain"
    assert argv[argv.index("--dataset") + 1] == "megatron-indexed"
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    assert (opts["dataset.seq_length"], opts["train.global_batch_size"], opts["train.micro_batch_size"]) == (
        "128", "4", "2")
    assert opts["train.train_iters"] == "2" and opts["scheduler.lr_decay_style"] == '"constant"'
    assert opts["checkpoint.pretrained_checkpoint"] == f'"{stage_dir / "megatron-import" / "iter_0000000"}"'
    paths, weights = json.loads(opts["dataset.blend"])
    from mlflow import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    blend = dict(zip((Path(p).name for p in paths), weights))
    ours = json.loads(Path(client.download_artifacts(lc["run_id"], "long_context/blend.json")).read_text())
    assert blend == pytest.approx(ours) and blend["doc_qa"] == pytest.approx(0.2)  # what our loader would sample
    assert "noisy" not in blend  # the last phase's blend, downscaled
    doc_qa = next(Path(p) for p in paths if p.endswith("/doc_qa"))
    assert doc_qa.parent.name.startswith("doc_qa-") and doc_qa.parent.name.endswith("-megatron")
    shard = TokenShard.open(doc_qa.parent.parent / doc_qa.parent.name.removesuffix("-megatron") / "train")
    assert [d.tolist() for d in read_indexed(doc_qa)] == [
        shard.tokens[a:b].tolist() for a, b in zip(shard.doc_offsets[:-1], shard.doc_offsets[1:])]

    logs = {a.path for a in client.list_artifacts(lc["run_id"], "launch")}
    assert logs == {f"launch/megatron-{k}.log" for k in ("import", "train", "export")}
    assert [m.value for m in client.get_metric_history(lc["run_id"], "megatron/lm_loss")] == [9.5]
    logged = [line for line in (proc.stderr + proc.stdout).splitlines() if "Task run 'launch-engine" in line]
    assert any(line.endswith("megatron-train |  [iteration     2/    2] lm loss: 9.5") for line in logged), logged


@pytest.mark.slow
def test_a_failing_rank_fails_long_context_and_hands_on_nothing(finished, fake_megatron):
    workdir, _ = finished
    before = sorted(workdir.glob("stages/long_context-*/step-*"))
    proc = run(workdir, fake_megatron, "stages.long_context.optimizer.lr=2.0e-3",
               env={"FAKE_MEGATRON_FAIL": "1"})  # another lr: a new long-context step, pretraining reused
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "megatron-train exited with status 1" in text and "CUDA error: out of memory" in text
    assert sorted(workdir.glob("stages/long_context-*/step-*")) == before
