"""`engine: megatron` for SFT, end to end on CPU against a stand-in Megatron-Bridge
(tests/engines/fake_engines/megatron.py): per sub-stage the kept conversations exported as chat rows,
import -> torchrun training with `--dataset local-jsonl` read through the chat preprocessing ->
export, the second sub-stage starting from the first one's adopted export, the final export handed
on and scored by the stage's held-out evaluation, and a failing rank failing the stage."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.engines.fake_engines.megatron import run_stagewise

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "recipes" / "tiny.yaml"
SETS = [  # stage1: 2 steps of 2 packs x 512 tokens; stage2: 2 steps of 2 x 1024, on 2 "GPUs"
    "stages.sft.data.world={per_domain: 30, long_context: 2, eval_fraction: 0.1}",
    "stages.sft.data.heldout_limit=3", "stages.sft.eval_suite=null",
    "stages.sft.stages[0].tokens=2048", "stages.sft.stages[0].global_batch=2", "stages.sft.stages[0].micro_batch=1",
    "stages.sft.stages[0].schedule.warmup_tokens=1024",
    "stages.sft.stages[1].tokens=4096", "stages.sft.stages[1].seq_length=1024", "stages.sft.stages[1].micro_batch=1",
    "stages.sft.stages[1].schedule.warmup_tokens=2048", "stages.sft.stages[1].normalization=token",
    # a gate at stage 1's end (the only kind a launched sub-stage takes): read from the export's evaluation
    "stages.sft.stages[0].gate={eval_every_tokens: 2048, all: [{metric: eval/sft_dev/loss, op: '>', value: 0}]}",
]


def run(workdir: Path, fake, start: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_stagewise(TINY, "sft", ["sft"], fake, [f"workdir={workdir}", f"model.from={start}", *SETS, *extra], env)


@pytest.fixture(scope="module")
def finished(fake_megatron, tiny_checkpoint, tmp_path_factory):
    """One SFT run on the stand-in engine: (workdir, the CLI's process)."""
    workdir = tmp_path_factory.mktemp("sft-megatron") / "work"
    return workdir, run(workdir, fake_megatron, tiny_checkpoint)


def _launches(stage_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (stage_dir / "megatron" / "launches.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_each_sub_stage_trains_its_conversations_on_megatron_and_the_last_export_is_handed_on(finished):
    workdir, proc = finished
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    result = summary["stages"][0]
    ckpt = Path(result["checkpoint"])
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "sft" and meta["step"] == 2 and meta["tokens_seen"] == 2 * 2 * 1024
    assert meta["extra"] == {"engine": "megatron"} and (ckpt / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    assert "<|im_start|>" in AutoTokenizer.from_pretrained(ckpt).chat_template  # the chat start's tokenizer
    assert len(list(ckpt.glob("*.safetensors"))) == 1  # the export's weights only, not the start's as well
    assert "eval/sft_test/loss" in result["metrics"] and "eval/sft_dev/loss" in result["metrics"]  # scored by us on the handed-on export
    gate = result["gate"]  # stage 1's gate decided on its export's dev evaluation, after the launch
    assert (gate["substage"], gate["action"], gate["held"], gate["tokens_seen"]) == ("stage1", "stop", True, 2048), gate
    assert result["note"] == "stage1 gate: stop at 2,048 of 2,048 tokens (rule held)"

    stage1, stage2 = (next((workdir / "stages").glob(f"sft-{n}-*")) for n in ("stage1", "stage2"))
    from stagewise.store.steps import finished as record

    first = record(stage1)["checkpoint"]["path"]
    assert meta["parent"] == first  # stage2 starts from stage1's adopted export
    rows = (stage1 / "megatron-data" / "training.jsonl").read_text().splitlines()
    report = json.loads((stage1 / "megatron-data" / "report.json").read_text())
    assert len(rows) == report["conversations"] > 0 and 0 < report["reasoning_off"] < len(rows)
    packing = json.loads(next((workdir / "sft_data").glob("packed-stage1-*/report.json")).read_text())["packing"]
    assert (report["conversations"], report["dropped"]) == (packing["conversations"], packing["dropped"])
    keys = {tuple(json.loads(r)) for r in rows}  # no template variables: Megatron-Bridge 0.6.2 never reads them
    assert keys <= {("id", "messages"), ("id", "messages", "tools")} and ("id", "messages") in keys

    (one,), (two,) = _launches(stage1), _launches(stage2)
    assert one["world_size"] == 2 and one["rows"] == len(rows) and one["supervised"] > 0
    argv = one["argv"]
    assert argv[argv.index("--mode") + 1] == "sft" and argv[argv.index("--dataset") + 1] == "local-jsonl"
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    assert opts["dataset.dataset_root"] == f'"{stage1 / "megatron-data"}"'
    assert opts["dataset.preprocessing"] == "null"
    assert opts["+dataset.preprocessing"] == ('{_target_:"megatron.bridge.data.sft_processing.'
                                              'ChatSFTPreprocessingConfig",loss_mode:"assistant"}')
    assert argv.index("dataset.preprocessing=null") < argv.index(f"+dataset.preprocessing={opts['+dataset.preprocessing']}")
    assert opts["train.train_iters"] == "2" and opts["dataset.seq_length"] == "512"
    assert opts["dataset.offline_packing_specs"] == ('{_target_:"megatron.bridge.data.packing.PackedSequenceSpecs",'
                                                     'packed_sequence_size:512,pad_seq_to_mult:1}')
    assert opts["checkpoint.pretrained_checkpoint"] == f'"{stage1 / "megatron-import" / "iter_0000000"}"'
    tokenizer = Path(json.loads(opts["tokenizer.tokenizer_model"]))
    (start,) = (workdir / "sft_data").glob("start-*")  # the chat start: its tokenizer, in the form 0.6.2 reads
    assert tokenizer == stage1 / "megatron-tokenizer" and not list(tokenizer.glob("*.safetensors"))
    assert (tokenizer / "tokenizer.json").read_bytes() == (start / "tokenizer.json").read_bytes()
    two_opts = dict(a.split("=", 1) for a in two["argv"] if "=" in a)
    assert two_opts["dataset.seq_length"] == "1024" and two_opts["dataset.dataset_root"].endswith('megatron-data"')

    from mlflow import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    sub_runs = client.search_runs([client.get_run(result["run_id"]).info.experiment_id],
                                  "tags.`stagewise.substage` = 'stage1'")
    logs = {a.path for a in client.list_artifacts(sub_runs[0].info.run_id, "launch")}
    assert logs == {f"launch/megatron-{k}-stage1.log" for k in ("import", "train", "export")}
    assert [m.value for m in client.get_metric_history(sub_runs[0].info.run_id, "megatron/lm_loss")] == [9.5]
    logged = [line for line in (proc.stderr + proc.stdout).splitlines() if "Task run 'launch-engine" in line]
    assert any(line.endswith("megatron-train-stage2 |  [iteration     2/    2] lm loss: 9.5") for line in logged), logged


@pytest.mark.slow
def test_a_failing_rank_fails_the_sub_stage_and_hands_on_nothing(finished, fake_megatron, tiny_checkpoint):
    workdir, _ = finished
    before = sorted(workdir.glob("stages/sft-stage1-*/step-*"))
    proc = run(workdir, fake_megatron, tiny_checkpoint, "stages.sft.stages[0].optimizer.lr=1.0e-3",
               env={"FAKE_MEGATRON_FAIL": "1"})  # another lr: a new stage1 step, the data reused
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "megatron-train-stage1 exited with status 1" in text and "CUDA error: out of memory" in text
    assert sorted(workdir.glob("stages/sft-stage1-*/step-*")) == before
