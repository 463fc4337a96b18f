"""The Mamba benchmark times transformers' functions against ours and reports their ratio."""

from __future__ import annotations

import json

import pytest
from transformers.models.nemotron_h import modeling_nemotron_h

from tests.benchmarks.scripts import load_benchmark


def test_every_case_is_timed_both_ways_and_the_ratios_are_theirs(capsys):
    bench = load_benchmark("mamba_scan")
    assert bench.main(["--rounds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["scan"]) == set(bench.SCAN_SHAPES)
    for case in [*out["scan"].values(), out["step"]]:
        assert case["transformers"] > 0 and case["ours"] > 0
        assert case["speedup"] == pytest.approx(case["transformers"] / case["ours"])
    assert out["step_speedup"] == out["step"]["speedup"]
    assert out["packed"]["packed_over_unpacked"] == pytest.approx(out["packed"]["packed"] / out["packed"]["unpacked"])


def test_the_reference_functions_are_set_only_for_the_call():
    bench = load_benchmark("mamba_scan")
    seen = []
    ours = modeling_nemotron_h.mamba2_chunk_scan
    run = bench.with_functions(modeling_nemotron_h, {"mamba2_chunk_scan": "theirs"},
                               lambda: seen.append(modeling_nemotron_h.mamba2_chunk_scan))
    run()
    assert seen == ["theirs"] and modeling_nemotron_h.mamba2_chunk_scan is ours
