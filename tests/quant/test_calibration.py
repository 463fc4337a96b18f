"""Calibration batches: windows from each stream's end in turn, and text files with located errors."""

from __future__ import annotations

import numpy as np
import pytest

from stagewise.data.errors import BadInput
from stagewise.quant.calibration import read_texts, stream_batches


def test_windows_come_from_each_streams_end_in_turn():
    streams = {"a": np.arange(0, 40), "b": np.arange(100, 120)}
    batches = stream_batches(streams, n_batches=2, batch_size=2, seq_length=10)
    rows = [list(r) for b in batches for r in b["input_ids"].tolist()]
    assert rows[0] == list(range(30, 40)) and rows[1] == list(range(110, 120))  # a's end, then b's end
    assert rows[2] == list(range(20, 30)) and rows[3] == list(range(100, 110))
    assert all((b["labels"] == b["input_ids"]).all() for b in batches)


def test_too_little_text_is_refused():
    with pytest.raises(BadInput, match="no validation stream holds 64 tokens"):
        stream_batches({"a": np.arange(10)}, 1, 1, 64)


def test_calibration_file_errors_name_file_and_line(tmp_path):
    good = tmp_path / "c.jsonl"
    good.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert read_texts(good) == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one"}\n{"txt": 1}\n')
    with pytest.raises(BadInput, match=r"bad.jsonl:2: text"):
        read_texts(bad)
    plain = tmp_path / "p.txt"
    plain.write_text("some words\nmore words\n")
    assert read_texts(plain) == ["some words\nmore words\n"]
