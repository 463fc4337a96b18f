"""End to end: `stagewise ablate` of two SFT blends (with and without the format domain) from the
session's pretrained checkpoint, at a tenth of SFT's tokens.

Both variants must finish, each its own MLflow run tagged with its variant and nested under one
`ablate-sft` run, which keeps the comparison (JSON, text, PNG). The comparison's values are checked
against what each variant's run logged in MLflow, and the variant trained without format data must
not beat the one trained with it on held-out format answers. The module sorts after the SFT test's
(the world and curation that test made in the shared workdir are reused here).
"""

from __future__ import annotations

import pytest

NO_FORMAT = [f"no_format:stages.sft.stages[{i}].blend.weights.format=0" for i in (0, 1)]


@pytest.fixture(scope="module")
def ablation(tiny_pretrain, cli):
    proc = cli("ablate", str(cli.tiny), "--stage", "sft", "--from", str(tiny_pretrain.checkpoint), "--budget", "0.05",
               "--variant", "with_format", *(a for v in NO_FORMAT for a in ("--variant", v)),
               *cli.sets(*tiny_pretrain.sets, *cli.sft_sets, "stages.sft.data.heldout_limit=100"), "--json")
    return cli.summary(proc)


@pytest.mark.slow
def test_both_variants_run_under_one_parent_with_the_comparison(ablation):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ablation["tracking_uri"])
    parent = client.get_run(ablation["run_id"])
    assert parent.info.run_name == "ablate-sft" and parent.data.tags["stagewise.ablation"] == "sft"
    assert [v["name"] for v in ablation["variants"]] == ["with_format", "no_format"]
    for v in ablation["variants"]:
        run = client.get_run(v["run_id"])
        assert run.data.tags["mlflow.parentRunId"] == ablation["run_id"] and run.info.status == "FINISHED"
        assert run.data.tags["stagewise.variant"] == v["name"]
        assert run.data.metrics[v["target"]] == pytest.approx(v["value"])
    artifacts = {a.path for a in client.list_artifacts(ablation["run_id"], "reports")}
    assert {"reports/ablation.json", "reports/ablation.txt", "reports/ablation.png"} <= artifacts
    assert parent.data.params["ablation.variant.no_format"].count("format=0") == 2


@pytest.mark.slow
def test_the_comparison_holds_each_variants_logged_scores(ablation):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ablation["tracking_uri"])
    logged = {v["name"]: client.get_run(v["run_id"]).data.metrics for v in ablation["variants"]}
    rows = {r["metric"]: r["values"] for r in ablation["comparison"]["rows"]}
    assert ablation["comparison"]["target"] == "eval/sft_dev/exact_match" and len(rows) > 5
    for metric, values in rows.items():
        for name, value in values.items():
            assert logged[name][metric] == pytest.approx(value), (metric, name)
    fmt = rows["eval/sft_dev/format_match_format"]
    assert fmt["no_format"] <= fmt["with_format"]  # no format conversations: no better at format answers
