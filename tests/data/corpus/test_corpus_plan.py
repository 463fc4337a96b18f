"""The shard plan and a unit's reader: every document read exactly once, wherever the cuts fall."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data.config import SourceConfig
from stagewise.data.corpus.config import FilterConfig
from stagewise.data.corpus.filters import reject_reason
from stagewise.data.corpus.plan import make_plan, units_of
from stagewise.data.corpus.read import UnitReader
from stagewise.data.errors import BadInput


def read_all(sources, base, shard_bytes):
    units = units_of(make_plan(sources, base, None, shard_bytes))
    return units, [text for u in units for _, text in UnitReader(u)]


@pytest.mark.parametrize("shard_bytes", [1, 7, 64, 333, 4096, 10**9])
def test_jsonl_byte_ranges_read_every_line_once_in_order(tmp_path, shard_bytes):
    texts = [f"line {i} " + "x" * (i % 17) for i in range(120)]
    rows = [json.dumps({"text": t}) for t in texts]
    rows[5:5] = ["", "   "]  # blank lines are no documents
    (tmp_path / "a.jsonl").write_text("\n".join(rows))  # no newline at the end either
    units, got = read_all([SourceConfig(name="a", path="a.jsonl")], tmp_path, shard_bytes)
    assert got == texts
    size = (tmp_path / "a.jsonl").stat().st_size
    assert sum(u.bytes for u in units) == size and len(units) == max(1, -(-size // shard_bytes))


def test_a_bad_line_deep_in_a_later_unit_is_cited_by_its_line(tmp_path):
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(200)]
    lines[136] = json.dumps({"body": "no text here"})
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    src = SourceConfig(name="a", path="a.jsonl")
    with pytest.raises(BadInput, match=r"a\.jsonl:137: text: missing text field"):
        read_all([src], tmp_path, 500)
    units, got = read_all([src.model_copy(update={"on_bad_line": "skip"})], tmp_path, 500)
    assert len(got) == 199
    readers = [UnitReader(u) for u in units]
    for r in readers:
        list(r)
    assert sum(r.bad_lines for r in readers) == 1


def test_parquet_units_are_runs_of_row_groups_and_globs_pick_files_in_order(tmp_path):
    (tmp_path / "p").mkdir()
    for name in ("b-1.parquet", "a-2.parquet", "skip.txt"):
        if name.endswith(".parquet"):
            pq.write_table(pa.table({"text": [f"{name} row {i}" for i in range(50)]}), tmp_path / "p" / name,
                           row_group_size=10)
        else:
            (tmp_path / "p" / name).write_text("not matched")
    src = SourceConfig(name="p", path="p/*.parquet")
    units, got = read_all([src], tmp_path, 1)
    assert [u.file.rsplit("/", 1)[1] for u in units] == ["a-2.parquet"] * 5 + ["b-1.parquet"] * 5
    assert got == [f"a-2.parquet row {i}" for i in range(50)] + [f"b-1.parquet row {i}" for i in range(50)]
    whole, _ = read_all([src], tmp_path, 10**9)
    assert [(u.start, u.end) for u in whole] == [(0, 5), (0, 5)]
    with pytest.raises(BadInput, match="no files match"):
        read_all([SourceConfig(name="p", path="p/*.jsonl")], tmp_path, 1)


@pytest.mark.parametrize(("text", "reason"), [
    ("two words", "too_short"), ("three short words", None), ("!!! ??? ### ok", "symbol_heavy"),
    ("a\na\na\na\nb", "repeated_lines"), ("a\na\nb\nc", None), ("one two three " * 40, None)])
def test_filters_name_their_reason(text, reason):
    assert reject_reason(text, FilterConfig()) == reason
    assert reject_reason("x " * 50, FilterConfig(max_chars=20)) == "too_long"
