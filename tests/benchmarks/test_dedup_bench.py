"""The dedup benchmark runs ours, datasketch and rensa's own LSH on the same planted corpus and reports
each one's recall, precision and speed ratio (datasketch is in the dev extra)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark

pytest.importorskip("datasketch")


def test_every_side_finds_the_planted_copies_and_the_ratios_are_theirs(capsys):
    bench = load_benchmark("dedup")
    bench.main(["--n", "400", "--repeat", "1", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["documents"] == 400 and r["planted"] == 40 and r["bands"] * r["rows"] == 128
    for side in ("ours", "datasketch", "rensa_lsh"):
        assert r[side]["planted_recall"] == 1.0 and r[side]["precision"] == 1.0, side
    for side in ("datasketch", "rensa_lsh"):
        assert r[f"speed_ratio_ours_over_{side}"] == pytest.approx(r["ours"]["docs_per_s"] / r[side]["docs_per_s"])
        assert r[side]["agreement_with_ours"] == 1.0
