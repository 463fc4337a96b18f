"""Bad lines of a pretraining source: exit-2 errors naming file and line, or skipped and counted."""

from __future__ import annotations

import pytest

from stagewise.data.config import SourceConfig
from stagewise.data.errors import BadInput
from stagewise.data.sources import SourceError, iter_texts

BAD_JSONL = (b'{"text": "one"}\n'
             b'{"text": \n'                 # 2: malformed JSON
             b'[1, 2]\n'                    # 3: not an object
             b'{"body": "x"}\n'             # 4: no text field
             b'{"text": 7}\n'               # 5: text not a string
             b'{"text": "caf\xe9"}\n'       # 6: not UTF-8
             b'{"text": "two"}\n')


@pytest.mark.parametrize("line,why", [(2, "malformed JSON"), (3, "expected a JSON object"), (4, "text: missing text field"),
                                      (5, "text: expected a string, got int"), (6, "not valid UTF-8")])
def test_each_bad_line_is_named_with_file_and_line(tmp_path, line, why):
    lines = BAD_JSONL.splitlines(keepends=True)
    f = tmp_path / "src.jsonl"
    f.write_bytes(lines[0] + lines[line - 1])
    with pytest.raises(SourceError) as e:
        list(iter_texts(SourceConfig(name="s", path=str(f)), tmp_path))
    assert f"src.jsonl:2: {why}" in str(e.value)
    assert isinstance(e.value, BadInput)  # the CLI's one bad-input type: exit 2


def test_skip_drops_and_counts_bad_lines(tmp_path):
    f = tmp_path / "src.jsonl"
    f.write_bytes(BAD_JSONL)
    counts: dict[str, int] = {}
    texts = list(iter_texts(SourceConfig(name="s", path=str(f), on_bad_line="skip"), tmp_path, bad_lines=counts))
    assert texts == ["one", "two"]
    assert counts == {"s": 5}


def test_txt_with_a_bad_line(tmp_path):
    f = tmp_path / "src.txt"
    f.write_bytes(b"good one\n\nbad \xff line\nstill good\n")
    with pytest.raises(SourceError, match=r"src.txt:3: not valid UTF-8"):
        list(iter_texts(SourceConfig(name="t", path=str(f)), tmp_path))
    counts: dict[str, int] = {}
    texts = list(iter_texts(SourceConfig(name="t", path=str(f), on_bad_line="skip"), tmp_path, bad_lines=counts))
    assert texts == ["good one", "still good"] and counts == {"t": 1}


def test_truncated_parquet_is_bad_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "src.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(1000)]}), f)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(SourceError, match="src.parquet"):
        list(iter_texts(SourceConfig(name="p", path=str(f)), tmp_path))
