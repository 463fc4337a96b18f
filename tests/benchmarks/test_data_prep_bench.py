"""The corpus-build benchmark: its generated corpus, and one whole run at a tiny size (every executor, the
two-node cluster, the ratios it reports taken from the runs it made)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark


def test_the_generated_corpus_has_its_files_size_and_planted_copies(tmp_path):
    bench = load_benchmark("data_prep")
    out = bench.generate(tmp_path / "c", gb=0.004, files=4)
    files = sorted(out.glob("part-*.jsonl"))
    assert [f.name for f in files] == [f"part-{i:05d}.jsonl" for i in range(4)]
    assert 0.004e9 <= sum(f.stat().st_size for f in files) < 0.006e9
    texts = [json.loads(line)["text"] for f in files for line in f.read_text().splitlines()]
    assert 0.004 < 1 - len(set(texts)) / len(texts) < 0.02  # ~1% exact copies (a copy may be copied again)
    assert 0.003 < sum("quartz" in t for t in texts) / len(texts) < 0.02  # ~1% near copies
    assert bench.generate(tmp_path / "c", gb=0.004, files=4) == out  # made once, reused
    small = bench.first_files(out, 2)
    assert sorted(p.name for p in small.iterdir()) == ["part-00000.jsonl", "part-00001.jsonl"]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_tiny_run_reports_every_executor_and_identical_outputs(tmp_path, capsys):
    bench = load_benchmark("data_prep")
    assert bench.main(["--gb", "0.004", "--small-gb", "0.001", "--files", "4", "--workdir", str(tmp_path),
                       "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    runs = r["runs"]
    assert set(runs) == {"in_process", "ray1", "ray2", "ray2_small", "two_nodes"}
    assert r["identical"] is True and runs["two_nodes"]["nodes"] == 2 and runs["ray2"]["workers"] == 2
    assert runs["ray2"]["duplicates"]["exact"] > 0 and runs["ray2"]["duplicates"]["near"] > 0
    assert r["ray2_over_ray1"] == pytest.approx(runs["ray2"]["tokens_per_s"] / runs["ray1"]["tokens_per_s"])
    assert r["ray2_over_in_process"] == pytest.approx(runs["ray2"]["tokens_per_s"] / runs["in_process"]["tokens_per_s"])
    assert r["driver_rss_ratio"] == pytest.approx(runs["ray2"]["driver_peak_rss_mb"] / runs["ray2_small"]["driver_peak_rss_mb"])
    assert runs["ray2_small"]["input_bytes"] < runs["ray2"]["input_bytes"] == runs["in_process"]["input_bytes"]
