"""End to end: `stagewise run recipes/tiny.yaml --stages pretrain,merge,long_context` on CPU.

Checks what a user relies on: the command finishes, the validation loss falls well below
the unigram baseline, the final checkpoint loads with transformers, MLflow holds the
parent and nested stage runs with the engine's metrics, merges are scored next to the
trained checkpoints at every checkpoint, and the long-context stage reports retrieval and
per-length loss before and after. One run serves all the tests (pretraining is the cost).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.prefect_reads import from_prefect, stage_edges

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 400_000  # enough to beat the unigram baseline clearly, short enough for CI


def _command(workdir: Path, stages: str) -> list[str]:
    return [
        sys.executable, "-m", "stagewise.cli", "run", str(ROOT / "recipes" / "tiny.yaml"),
        "--stages", stages,
        "--set", f"workdir={workdir}", "--set", f"stages.pretrain.tokens={TOKENS}",
        "--set", "stages.pretrain.checkpoint_every_tokens=49152",
        "--set", "stages.merge.windows_tokens=[98304,196608]", "--set", "stages.merge.val_tokens=16384",
        "--set", "eval.mc=[world_arithmetic_mc]", "--set", "stages.merge.eval_suite=mc",
        "--set", "stages.merge.eval_limit=5",
        "--set", "stages.long_context.tokens=49152", "--set", "stages.long_context.needle_per_length=8",
        "--set", "stages.long_context.data.doc_qa.documents=120", "--json",
    ]


def _run(cmd: list[str]) -> dict:
    """The run's --json summary, with what its terminal showed under "stderr" (a key of this test's)."""
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}  # as a user's shell has it
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(env, CI="1"), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {**json.loads(proc.stdout[proc.stdout.index("{"):]), "stderr": proc.stderr}


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny")
    return workdir, _run(_command(workdir, "pretrain,merge,long_context"))


@pytest.mark.slow
def test_a_rerun_trains_nothing_and_prefect_reports_the_steps_cached(pipeline_run):
    """Nothing is trained, merged or evaluated again: the same checkpoints are handed on, every stage
    run says reused, the whole rerun takes under a minute, and Prefect shows each reused step as Cached
    with its step hash as the cache key."""
    import time

    from mlflow import MlflowClient

    workdir, first = pipeline_run
    started = time.monotonic()
    again = _run(_command(workdir, "pretrain,merge,long_context"))
    seconds = time.monotonic() - started
    assert seconds < 60, f"the rerun took {seconds:.0f} s"
    assert [s["checkpoint"] for s in again["stages"]] == [s["checkpoint"] for s in first["stages"]]
    client = MlflowClient(tracking_uri=again["tracking_uri"])
    for stage in again["stages"]:
        assert client.get_run(stage["run_id"]).data.tags.get("stagewise.reused") == "true", stage["stage"]
        assert stage["reused"]
    assert again["stages"][1]["metrics"] == first["stages"][1]["metrics"]
    assert [(s["before"], s["after"]) for s in again["stages"]] == [(s["before"], s["after"]) for s in first["stages"]]
    # a reused stage's time is what it cost when it was trained (its MLflow run's), not the reuse's
    for was, now in zip(first["stages"], again["stages"]):
        assert now["seconds"] >= 0.5 * was["seconds"], (was["stage"], was["seconds"], now["seconds"])
    runs = from_prefect(again["prefect_flow_run_id"], "tasks")
    names = [r.name.rsplit("-", 1)[0] for r in runs]
    assert "train" not in names and "validation-loss" not in names and "needle-eval" not in names, names
    reused = [r for r in runs if r.name.startswith("reuse-step")]
    assert len(reused) == 3 and all(r.state.name == "Cached" and r.state.is_completed() for r in reused)
    keyed = {f"{r.state.message.split(':')[0]}-{r.state.state_details.cache_key}" for r in reused}
    assert keyed == {Path(s["stage_dir"]).name for s in again["stages"]}  # Prefect's key names the directory
    data = [r for r in runs if r.name.startswith("prepare-data")]
    assert len(data) == 1 and data[0].state.name == "Cached"


PROGRESS = re.compile(r"\d+%\||it/s\]|━━|Running (generate_until|loglikelihood) requests|LOAD_(GLOBAL|ATTR)")


@pytest.mark.slow
def test_the_flow_logs_hold_what_a_person_reads_and_no_progress_bars(pipeline_run):
    """Read through the Prefect API: each stage says it started, what it handed on; no bar, no library dump."""
    _, summary = pipeline_run
    messages = [log.message for log in from_prefect(summary["prefect_flow_run_id"], "logs")]
    assert not [m for m in messages if PROGRESS.search(m)], [m for m in messages if PROGRESS.search(m)][:5]
    for stage in ("pretrain", "merge", "long_context"):
        assert any(m.startswith(f"{stage}: starting on cpu/fp32") for m in messages), stage
        assert any(m.startswith(f"{stage}: hands on ") for m in messages), stage


@pytest.mark.slow
def test_the_terminal_is_quiet_and_the_log_file_keeps_the_rest(pipeline_run):
    """Our lines and bars on the terminal; Prefect's lifecycle lines, library warnings and library bars
    only in <workdir>/logs/ (where every line of ours is too)."""
    workdir, summary = pipeline_run
    terminal = summary["stderr"]
    for noise in ("Finished in state", "Beginning flow run", "falling back to its reference", "Loading weights",
                  "Starting temporary server", "FutureWarning", "UserWarning", "loss nan"):
        assert noise not in terminal, (noise, terminal[-3000:])
    assert "pretrain: hands on " in terminal and "long_context: hands on " in terminal
    log = Path(summary["log_file"])
    assert log.parent == workdir.resolve() / "logs"
    kept = log.read_text()
    # Prefect's lifecycle lines are kept (transformers' "falling back to its reference" warning no longer
    # comes up in these stages: their Mamba layers run our functions, model/mamba_torch.py)
    assert "Finished in state Completed()" in kept and "Starting temporary server" in kept
    assert "pretrain: hands on " in kept


@pytest.mark.slow
def test_the_prefect_run_pages_tell_the_story(pipeline_run):
    """The pipeline's flow run carries the closing table and the link to its MLflow run, each stage's
    its row; the graph's edges are what each stage reads (merge: pretraining; long context: pretraining,
    and the merge that handed it on)."""
    _, summary = pipeline_run
    arts = {a.key: a for a in from_prefect(summary["prefect_flow_run_id"], "artifacts")}
    assert {"stagewise-closing-table", "stagewise-mlflow-run", "stagewise-stage-pretrain", "stagewise-stage-merge",
            "stagewise-stage-long-context"} <= set(arts)
    assert str(arts["stagewise-closing-table"].flow_run_id) == summary["prefect_flow_run_id"]
    assert summary["mlflow_run_url"] in arts["stagewise-mlflow-run"].data
    assert summary["mlflow_run_url"].endswith(f"/runs/{summary['mlflow_run_id']}?workflowType=machine_learning")
    for stage in summary["stages"]:
        row = arts[f"stagewise-stage-{stage['stage'].replace('_', '-')}"]
        assert str(row.flow_run_id) != summary["prefect_flow_run_id"] and stage["run_id"] in row.data
    assert stage_edges(summary["prefect_flow_run_id"]) == {
        "pretrain": set(), "merge": {"pretrain"}, "long_context": {"pretrain", "merge"}}


@pytest.mark.slow
def test_the_pipeline_run_keeps_the_closing_table(pipeline_run, tmp_path):
    from mlflow import MlflowClient

    _, summary = pipeline_run
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    parent = client.get_run(summary["stages"][0]["run_id"]).data.tags["mlflow.parentRunId"]
    assert {a.path for a in client.list_artifacts(parent, "reports")} >= {
        "reports/closing_table.json", "reports/closing_table.png", "reports/closing_table.txt",
        "reports/pipeline_report.png", "reports/pipeline_report.html"}
    html = Path(summary["workdir"]) / "reports" / "pipeline_report.html"
    assert "long_context" in html.read_text() and "data:image/png;base64," in html.read_text()
    from tests.eval.test_pipeline_report_browser import check_in_chromium

    check_in_chromium(html, tmp_path / "pipeline_report_screenshot.png")  # a person opens it in a browser
    table = json.loads(Path(client.download_artifacts(parent, "reports/closing_table.json")).read_text())
    assert [r["stage"] for r in table["stages"]] == ["pretrain", "merge", "long_context"]
    pre = summary["stages"][0]
    assert pre["metric"] == "eval/validation/loss" and pre["before"] > pre["after"] + 1.0  # untrained -> trained
    assert pre["tokens"] == TOKENS // 4096 * 4096 and pre["seconds"] > 0
    for row, stage in zip(table["stages"], summary["stages"]):
        assert {k: row[k] for k in ("metric", "before", "after", "tokens", "run_id")} == \
               {k: stage[k] for k in ("metric", "before", "after", "tokens", "run_id")}
    # the parent run reads as the table in MLflow: its description, each stage's target a metric
    described = client.get_run(parent).data
    assert "| stage | metric | before -> after |" in described.tags["mlflow.note.content"]
    assert described.metrics["pretrain/eval/validation/loss"] == pytest.approx(pre["after"])
    assert described.metrics["pretrain/eval/validation/loss_before"] == pytest.approx(pre["before"])


@pytest.mark.slow
def test_the_pipelines_mlflow_run_reads_in_the_mlflow_ui(pipeline_run, tmp_path):
    """The link `stagewise run` prints, on `mlflow server` over the run's store, in headless Chromium:
    the model-training view (runs, not the GenAI traces), the closing table as the run's description,
    each stage's target among its metrics."""
    from tests.e2e.servers import MlflowServer, chromium_page
    from tests.eval.test_pipeline_report_browser import _chromium

    _, summary = pipeline_run
    server = MlflowServer(tmp_path, store=summary["tracking_uri"])
    server.start()
    try:
        url = summary["mlflow_run_url"].replace("http://127.0.0.1:5000", server.uri)
        html = chromium_page(_chromium(), url, tmp_path, tmp_path / "mlflow_ui_parent_run.png")
        experiment = chromium_page(_chromium(), url.split("/runs/")[0] + "?workflowType=machine_learning", tmp_path)
    finally:
        server.stop()
    text = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<style[^>]*>.*?</style>", " ", html, flags=re.S)).split())
    assert "Description What each stage bought" in text, text[:3000]
    for row in summary["stages"]:
        assert f"{row['stage']}/{row['metric']}" in text  # the stage targets, the parent run's metrics
    shown = " ".join(re.sub(r"<[^>]+>", " ", experiment).split())
    assert "matching run" in shown and "No data available for the selected time range" not in shown  # runs, not traces


@pytest.mark.slow
def test_validation_loss_beats_unigram_baseline(pipeline_run):
    _, summary = pipeline_run
    assert [s["stage"] for s in summary["stages"]] == ["pretrain", "merge", "long_context"]
    metrics = summary["stages"][0]["metrics"]
    assert metrics["validation_loss"] < metrics["validation_unigram_baseline"] - 1.0, metrics


@pytest.mark.slow
def test_final_checkpoint_loads_with_transformers(pipeline_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, summary = pipeline_run
    ckpt = Path(summary["stages"][0]["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok("The capital of", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[-1] >= len(tok) and torch.isfinite(logits).all()
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "pretrain" and meta["tokens_seen"] > 0


@pytest.mark.slow
def test_mlflow_holds_parent_and_stage_runs(pipeline_run):
    from mlflow import MlflowClient

    _, summary = pipeline_run
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    exp = client.get_experiment_by_name(summary["experiment"])
    # This pipeline run's parent and its children (a rerun test adds another pipeline run).
    parent_id = client.get_run(summary["stages"][0]["run_id"]).data.tags["mlflow.parentRunId"]
    runs = [r for r in client.search_runs([exp.experiment_id])
            if parent_id in (r.info.run_id, r.data.tags.get("mlflow.parentRunId"))]
    stage_runs = [r for r in runs if r.data.tags.get("stagewise.stage") == "pretrain"]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(stage_runs) == 1 and len(parents) == 1
    assert {r.data.tags.get("stagewise.stage") for r in runs} >= {"pretrain", "merge", "long_context"}
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in runs if r is not parents[0])
    assert parents[0].data.tags.get("prefect.flow_run_id")
    metrics = stage_runs[0].data.metrics
    for name in ("train/lm_loss", "train/lb_loss", "train/grad_norm", "train/params_norm", "train/num_zeros",
                 "train/lr", "train/tokens_per_s", "tokens_seen", "eval/validation/loss"):
        assert name in metrics, (name, sorted(metrics))
    assert any(k.startswith("moe/") and k.endswith("/max_vio") for k in metrics)
    assert any(k.startswith("act/") and k.endswith("/rms") for k in metrics)
    history = client.get_metric_history(stage_runs[0].info.run_id, "train/lm_loss")
    assert len(history) >= 10 and history[-1].value < history[0].value
    artifacts = [a.path for a in client.list_artifacts(stage_runs[0].info.run_id, "reports")]
    assert "reports/pretrain_loss.png" in artifacts


def _stage_run(summary, stage):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    run_id = next(s["run_id"] for s in summary["stages"] if s["stage"] == stage)
    return client, run_id


@pytest.mark.slow
def test_merges_are_scored_next_to_trained_checkpoints(pipeline_run):
    _, summary = pipeline_run
    client, run_id = _stage_run(summary, "merge")
    trained = client.get_metric_history(run_id, "merge/trained/loss")
    small = client.get_metric_history(run_id, "merge/98304/loss")
    large = client.get_metric_history(run_id, "merge/196608/loss")
    assert len(trained) >= 8  # every pretraining checkpoint
    assert len(small) == len(trained) - 2 and len(large) == len(trained) - 4  # windows that fit
    suite = client.get_metric_history(run_id, "merge/98304/world_arithmetic_mc/acc")
    assert len(suite) == len(small)  # the eval suite scores every merge too
    merge = summary["stages"][1]
    best = merge["metrics"]["best_merge_loss"]
    assert best == pytest.approx(min(m.value for m in small + large))
    handed_merge = merge["checkpoint"] != summary["stages"][0]["checkpoint"]
    assert handed_merge == (best < merge["metrics"]["trained_loss"])
    manifest = Path(merge["checkpoint"]) / "merge_manifest.json"
    assert manifest.exists() == handed_merge
    artifacts = [a.path for a in client.list_artifacts(run_id, "reports")]
    assert "reports/merge_vs_trained.png" in artifacts


@pytest.mark.slow
def test_long_context_reports_before_and_after(pipeline_run):
    from transformers import AutoModelForCausalLM

    _, summary = pipeline_run
    client, run_id = _stage_run(summary, "long_context")
    for length in (256, 1024, 2048):
        acc = client.get_metric_history(run_id, f"eval/needle/{length}/accuracy")
        loss = client.get_metric_history(run_id, f"eval/loss/{length}")
        assert len(acc) >= 2 and len(loss) >= 2  # before (step 0) and after
        assert {m.step for m in acc} >= {0}
    train = client.get_metric_history(run_id, "train/lm_loss")
    assert len(train) == 3  # 49,152 tokens at 16,384 tokens per step
    lc = summary["stages"][2]
    assert Path(lc["checkpoint"]).parent.name.startswith("long_context-")
    AutoModelForCausalLM.from_pretrained(lc["checkpoint"])


@pytest.mark.slow
def test_each_stage_version_has_its_alias_and_parent_link(pipeline_run):
    """A person opening a registered version can walk back to the data it was trained on."""
    from mlflow import MlflowClient

    _, summary = pipeline_run
    client = MlflowClient(tracking_uri=summary["tracking_uri"], registry_uri=summary["tracking_uri"])
    versions = {s: client.get_model_version_by_alias(summary["experiment"], s) for s in ("pretrain", "merge", "long_context")}
    pre, merge, lc = versions["pretrain"], versions["merge"], versions["long_context"]
    assert "stagewise.parent_version" not in pre.tags and Path(pre.tags["stagewise.data"]).is_dir()
    assert merge.tags["stagewise.parent_version"] in {str(v.version) for v in client.search_model_versions(
        f"name = '{summary['experiment']}'") if v.tags.get("stagewise.stage") == "pretrain"}
    assert client.get_model_version(summary["experiment"], lc.tags["stagewise.parent_version"]).tags["stagewise.checkpoint"] \
        == merge.tags["stagewise.checkpoint"]  # long context started from what merge handed on
    for v in versions.values():
        assert v.tags["stagewise.recipe_hash"] and v.tags["stagewise.pipeline_run"] and v.tags["stagewise.prefect_flow_run"]
        assert v.tags["stagewise.weights"] == "artifact" and (Path(v.source) / "model.safetensors").is_file()
