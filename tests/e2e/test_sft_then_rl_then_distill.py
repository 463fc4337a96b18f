"""End to end: sft -> rl -> distill in one `stagewise run recipes/tiny.yaml --stages pretrain,sft,rl,distill`.

Pretraining, SFT and RL are the session's (tests/e2e/conftest.py: the SFT and RL tests' settings, so
the run finds all three finished and trains nothing there; this module sorts after test_sft_then_rl.py,
which must be the one to train RL). The stage is the recipe's block as the demo runs it: an
arithmetic teacher that is the RL stage's checkpoint, a format teacher trained inside the stage from
SFT's checkpoint, then the student (SFT's checkpoint) distilled from both. Checks what a user relies
on: each teacher is the checkpoint it should be (the trained one starts where the student does), the
trained teacher's run and each round's run sit under the `distill` run in MLflow with their metrics,
held-out pass@1 of the student and of every teacher is logged, the `distill` alias and the
closing-table row exist, and the student gains. A second, short run with `rounds: 2` and two trained
teachers retrains both from round 1's student.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def distill_run(tiny_pretrain, cli):
    proc = cli("run", str(cli.tiny), "--stages", "pretrain,sft,rl,distill",
               *cli.sets(*tiny_pretrain.sets, *cli.sft_sets, *cli.rl_sets), "--json")
    summary = cli.summary(proc)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=summary["tracking_uri"], registry_uri=summary["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name(summary["experiment"]).experiment_id])
    return summary, client, runs


def _one(runs, name):
    found = [r for r in runs if r.info.run_name == name]
    assert found, sorted(r.info.run_name for r in runs)
    return max(found, key=lambda r: r.info.start_time)


def _history(client, run, name):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)]


@pytest.mark.slow
def test_each_teacher_is_its_checkpoint_and_the_trained_one_starts_where_the_student_does(distill_run):
    summary, client, runs = distill_run
    assert [s["stage"] for s in summary["stages"]] == ["pretrain", "sft", "rl", "distill"]
    sft, rl = summary["stages"][1], summary["stages"][2]
    assert rl["reused"]  # the RL test trained it
    distill = _one(runs, "distill")
    assert distill.data.tags["stagewise.start_checkpoint"] == sft["checkpoint"]
    assert distill.data.tags["stagewise.teacher.arithmetic"] == rl["checkpoint"]
    assert not [r for r in runs if r.info.run_name == "distill-teacher-arithmetic"]  # a stage teacher: not trained
    teacher = _one(runs, "distill-teacher-format")
    assert Path(distill.data.tags["stagewise.teacher.format"]).parent.name.startswith("distill-teacher-format-")
    assert teacher.data.tags["stagewise.start_checkpoint"] == sft["checkpoint"]
    assert teacher.data.tags["mlflow.parentRunId"] == distill.info.run_id
    # trained on its own domain only (and scored by the distill run, not by itself)
    assert {k for k in teacher.data.metrics if k.startswith("rl/train_accuracy/")} == {"rl/train_accuracy/format"}
    assert not any(k.startswith(("rl/test/", "rl/dev/")) for k in teacher.data.metrics)
    round1 = _one(runs, "distill/round-1")
    assert round1.data.tags["mlflow.parentRunId"] == distill.info.run_id
    steps = len(_history(client, round1, "distill/reverse_kl"))
    assert steps > 0
    for name in ("distill/reverse_kl/arithmetic", "distill/reverse_kl/format", "distill/logprob_gap/format",
                 "distill/train_accuracy/arithmetic", "distill/clip_fraction", "distill/is_masked_fraction",
                 "distill/rollout_tokens_per_s", "distill/teacher_tokens_per_s", "train/tokens_per_s"):
        assert [s for s, _ in _history(client, round1, name)] == list(range(1, steps + 1)), name
    version = client.get_model_version_by_alias(summary["experiment"], "distill")
    assert version.tags["stagewise.checkpoint"].endswith(f"step-{steps:08d}")
    from tests.e2e.prefect_reads import stage_edges

    # distillation reads its student (SFT) and its stage teacher (RL): the graph's edges, not pretraining
    assert stage_edges(summary["prefect_flow_run_id"])["distill"] == {"sft", "rl"}


@pytest.mark.slow
def test_the_student_gains_what_its_teachers_gained(distill_run):
    summary, client, runs = distill_run
    m = summary["stages"][3]["metrics"]
    print("distill " + ", ".join(
        f"{d}: student {m[f'base/distill/test/student/pass_at_1/{d}']:.3f} -> "
        f"{m[f'distill/test/student/pass_at_1/{d}']:.3f}, teacher {m[f'distill/test/teacher/pass_at_1/{d}']:.3f}"
        for d in ("arithmetic", "format")))
    # a teacher's gain over the student's start is per domain and, on this weak e2e model, within the
    # sampling noise of ~150 prompts: the recovered share is reported exactly where a teacher gained
    gained = [d for d in ("arithmetic", "format") if m[f"distill/teacher_gain/{d}"] > 0]
    assert gained, m
    for d in ("arithmetic", "format"):
        assert (f"distill/recovered/{d}" in m) == (d in gained), (d, m)
    assert m["distill/test/student/pass_at_1/all"] > m["base/distill/test/student/pass_at_1/all"], m
    distill = _one(runs, "distill")
    assert [s for s, _ in _history(client, distill, "distill/test/student/pass_at_1/all")] == [0, 1]
    assert m["distill/retained"] in (0.0, 1.0) and "distill/chat/worst_delta" in m
    row = summary["stages"][3]
    assert row["metric"] == "distill/test/student/pass_at_1/all" and row["after"] > row["before"]


@pytest.mark.slow
def test_every_claimed_gain_carries_its_interval_and_the_verdict_it_supports(distill_run):
    """SFT, RL (reused: its row as trained) and distillation: the gain's 95% interval over the held-out
    items around after - before, the verdict read off it, the bounds on the stage run and the
    per-item results an artifact there."""
    from stagewise.eval.intervals import verdict

    summary, client, _ = distill_run
    for row in summary["stages"][1:]:
        gain = row["after"] - row["before"]
        assert row["items"] >= 5 and row["gain_low"] <= gain + 1e-9 <= row["gain_high"] + 2e-9, row
        assert row["verdict"] == verdict(row["gain_low"], row["gain_high"], True, row["tolerance"]), row
        metrics = client.get_run(row["run_id"]).data.metrics
        assert metrics[f"{row['metric']}_gain_low"] == pytest.approx(row["gain_low"]), row["stage"]
    distill = summary["stages"][3]
    items = {a.path for a in client.list_artifacts(distill["run_id"], "heldout/distill/test/student")}
    assert items == {"heldout/distill/test/student/items_00000000.json",
                     "heldout/distill/test/student/items_00000001.json"}


@pytest.mark.slow
def test_a_second_round_retrains_the_teachers_from_the_first_rounds_student(tiny_pretrain, cli):
    trained = "rl: {steps: 2, filter: null, data: {heldout_limit: 8}}"  # rounds > 1: every teacher trained here
    short = ["stages.distill.steps=3", "stages.distill.rounds=2", "stages.distill.eval_suite=null",
             f"stages.distill.teachers=[{{name: arithmetic, domains: [arithmetic], {trained}}}, "
             f"{{name: format, domains: [format], {trained}}}]",
             "stages.distill.checkpoint_every_steps=null", "stages.rl.data.heldout_limit=16"]
    summary = cli.summary(cli("run", str(cli.tiny), "--stages", "pretrain,sft,distill",
                              *cli.sets(*tiny_pretrain.sets, *cli.sft_sets, *cli.rl_sets, *short), "--json"))
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=summary["tracking_uri"], registry_uri=summary["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name(summary["experiment"]).experiment_id],
                              filter_string="tags.`mlflow.runName` LIKE 'distill%'", order_by=["start_time DESC"])
    round2 = next(r for r in runs if r.info.run_name == "distill/round-2")
    round1 = client.get_model_version_by_alias(summary["experiment"], "distill-round-1")
    round1_student = round1.tags["stagewise.checkpoint"]
    for name in ("distill/round-2", "distill-teacher-arithmetic-round2", "distill-teacher-format-round2"):
        run = next(r for r in runs if r.info.run_name == name)
        assert Path(run.data.tags["stagewise.start_checkpoint"]).resolve() == Path(round1_student), name
    assert round2.data.tags["mlflow.parentRunId"] == next(r for r in runs if r.info.run_name == "distill").info.run_id
    distill = next(r for r in runs if r.info.run_name == "distill")
    assert [s for s, _ in sorted((m.step, m.value) for m in client.get_metric_history(
        distill.info.run_id, "distill/test/student/pass_at_1/all"))] == [0, 1, 2]
