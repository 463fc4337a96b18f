"""lm-eval on an in-memory model: local tasks offline, metric keys, suites and task-name errors."""

from __future__ import annotations

import math

import pytest

from stagewise.eval.harness import (
    UnknownSuiteError,
    UnknownTaskError,
    headline_metrics,
    resolve_suite,
    run_tasks,
    task_manager,
)

WORLD = ["world_arithmetic", "world_arithmetic_mc", "world_chat_format", "world_compare_mc", "world_lookup",
         "world_sorting"]


def test_resolve_suite():
    assert resolve_suite({"quick": ["world_lookup"], "full": ["world"]}, "quick") == ["world_lookup"]


def test_unknown_suite_lists_the_suites():
    with pytest.raises(UnknownSuiteError, match=r"'quik'.*did you mean 'quick'.*full, quick"):
        resolve_suite({"quick": ["world_lookup"], "full": ["world"]}, "quik")
    with pytest.raises(UnknownSuiteError, match="defines no suites"):
        resolve_suite({}, "quick")


def test_headline_metrics_names():
    results = {
        "world_lookup": {"alias": "world_lookup", "exact_match,strip": 0.25, "exact_match_stderr,strip": 0.1},
        "arc_easy": {"acc,none": 0.5, "acc_norm,none": 0.6, "acc_stderr,none": "N/A"},
        "gsm8k": {"exact_match,strict-match": 0.1, "exact_match,flexible-extract": 0.2},
    }
    assert headline_metrics(results) == {
        "arc_easy/acc": 0.5, "arc_easy/acc_norm": 0.6, "gsm8k/exact_match/flexible-extract": 0.2,
        "gsm8k/exact_match/strict-match": 0.1, "world_lookup/exact_match": 0.25,
    }


def test_local_tasks_load_offline_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data paths must not depend on the current directory
    tm = task_manager(["world"])
    loaded = tm.load(["world"])["tasks"]
    assert sorted(loaded) == WORLD
    for name, task in loaded.items():
        docs = list(task.test_docs())
        assert len(docs) == 100, name
        assert docs[0]["prompt"]


def test_local_task_names_do_not_index_lm_evals_own():
    assert "arc_easy" not in task_manager(["world_lookup"]).all_tasks


def test_run_tasks_returns_finite_metrics_under_the_expected_keys(tiny_lm):
    model, tokenizer = tiny_lm
    model.train()
    result = run_tasks(model, tokenizer, ["world_arithmetic", "world_compare_mc"], limit=5, batch_size=8)
    assert set(result.metrics) == {"world_arithmetic/exact_match", "world_compare_mc/acc", "world_compare_mc/acc_norm"}
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in result.metrics.values())
    assert result.raw["results"]["world_arithmetic"]["exact_match,strip"] == result.metrics["world_arithmetic/exact_match"]
    assert result.raw["n-samples"]["world_compare_mc"]["effective"] == 5
    assert model.training  # handed back in the mode it came in
    import json

    json.dumps(result.raw, allow_nan=False)


@pytest.mark.slow
def test_the_world_suite_runs_end_to_end(tiny_lm):
    model, tokenizer = tiny_lm
    result = run_tasks(model, tokenizer, ["world"], limit=5, batch_size=16)
    expected = {f"{t}/exact_match" for t in WORLD if not t.endswith("_mc")}
    expected |= {f"{t}/{m}" for t in WORLD if t.endswith("_mc") for m in ("acc", "acc_norm")}
    assert set(result.metrics) == expected
    assert all(math.isfinite(v) for v in result.metrics.values())


@pytest.mark.slow
def test_unknown_task_names_the_nearest(tiny_lm):
    with pytest.raises(UnknownTaskError, match="world_lokup.*world_lookup"):
        run_tasks(*tiny_lm, ["world_lokup"], limit=1)
