"""eval/harness.py library_bars_off: a quiet run drops the bars libraries draw past TQDM_DISABLE."""

from __future__ import annotations

import logging

import tqdm

from stagewise.eval.harness import library_bars_off


def test_bars_drawn_past_tqdm_disable_are_dropped_and_other_lines_logged(monkeypatch, capsys, caplog):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with caplog.at_level(logging.WARNING, logger="lm_eval.stderr"), library_bars_off():
        for _ in tqdm.tqdm(range(3), desc="Running generate_until requests", disable=False):  # as lm-eval passes it
            pass
        import sys

        print("a library's own line", file=sys.stderr)
        sys.stderr.write("an unfinished last line")
    err = capsys.readouterr().err
    assert "Running generate_until" not in err and "a library's own line" not in err
    assert [r.getMessage() for r in caplog.records if r.name == "lm_eval.stderr"] == [
        "a library's own line", "an unfinished last line"]


def test_without_tqdm_disable_nothing_changes(monkeypatch, capsys):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    with library_bars_off():
        for _ in tqdm.tqdm(range(3), desc="a bar a --verbose run shows", disable=False):
            pass
    assert "a bar a --verbose run shows" in capsys.readouterr().err
