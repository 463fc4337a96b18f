"""Row files: JSONL, parquet, Arrow, `datasets` save_to_disk directories and Hub shard folders read
back as the rows that were written, with their locations, split rules and located errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data import row_files
from stagewise.data.errors import BadInput
from stagewise.data.row_files import RowFileError, iter_rows, present, splits_of_folder

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2 + 2?"},
                             {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}]},
    {"id": "b", "messages": [{"role": "user", "content": "Compute 3 * 5."},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"type": "function", "function": {"name": "calculator",
                                                                    "arguments": "{\"expression\": \"3 * 5\"}"}}]},
                             {"role": "tool", "content": "15"},
                             {"role": "assistant", "content": "15"}]},
    {"id": "c", "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
]


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _read(path, split=None, **kw):
    return [(str(r.where), present(r.data)) for r in iter_rows(path, split, **kw)]


# --------------------------------------------------------------------------- single files

def test_jsonl_rows_and_lines(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\r\n", encoding="utf-8")
    rows = list(iter_rows(f))
    assert [(str(r.where), r.data) for r in rows] == [(f"{f}:1", ROWS[0]), (f"{f}:3", ROWS[1])]
    assert rows[1].line == json.dumps(ROWS[1])  # the line as written, newline (CRLF) left off


def test_parquet_rows_come_back_as_written_across_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(row_files, "BATCH_ROWS", 2)
    f = _parquet(tmp_path / "c.parquet", ROWS)
    assert _read(f) == [(f"{f}:row 0", ROWS[0]), (f"{f}:row 1", ROWS[1]), (f"{f}:row 2", ROWS[2])]


def test_arrow_ipc_file_and_stream(tmp_path):
    table = pa.Table.from_pylist([{"text": "one"}, {"text": "two"}])
    stream, file = tmp_path / "s.arrow", tmp_path / "f.arrow"
    with pa.ipc.new_stream(stream, table.schema) as w:
        w.write_table(table)
    with pa.ipc.new_file(file, table.schema) as w:
        w.write_table(table)
    assert _read(stream) == [(f"{stream}:row 0", {"text": "one"}), (f"{stream}:row 1", {"text": "two"})]
    assert _read(file) == [(f"{file}:row 0", {"text": "one"}), (f"{file}:row 1", {"text": "two"})]


def test_present_drops_nulls_at_every_depth_and_keeps_list_items():
    assert present({"a": None, "b": [{"c": None, "d": 1}, None], "e": {"f": None}}) == {"b": [{"d": 1}, None], "e": {}}


def test_mapping_arguments_of_different_shapes_come_back_as_written(tmp_path):
    """Arrow unifies the two argument objects into one struct; `present` undoes its null filling."""
    rows = [{"args": {"expression": "2 + 2"}}, {"args": {"city": "Oslo", "days": 3}}]
    f = _parquet(tmp_path / "a.parquet", rows)
    assert [r.data for r in iter_rows(f)] == [{"args": {"expression": "2 + 2", "city": None, "days": None}},
                                             {"args": {"expression": None, "city": "Oslo", "days": 3}}]
    assert [d for _, d in _read(f)] == rows


# --------------------------------------------------------------------------- datasets directories

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real `datasets` save_to_disk Dataset (two shards) and DatasetDict (train, test)."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("saved")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(root / "one"), num_shards=2)
    datasets.DatasetDict({"train": ds, "test": ds.select([2])}).save_to_disk(str(root / "dict"))
    return root


def test_save_to_disk_directory_reads_its_shards_in_order(saved):
    one = saved / "one"
    (one / "cache-0123.arrow").write_bytes((one / "data-00000-of-00002.arrow").read_bytes())  # a map() leftover
    got = _read(one)
    assert [d for _, d in got] == ROWS
    assert [w for w, _ in got] == [f"{one}/data-00000-of-00002.arrow:row 0", f"{one}/data-00000-of-00002.arrow:row 1",
                                   f"{one}/data-00001-of-00002.arrow:row 0"]


def test_save_to_disk_dataset_dict_reads_train_unless_a_split_is_named(saved):
    d = saved / "dict"
    assert [r["id"] for _, r in _read(d)] == ["a", "b", "c"]
    assert _read(d, "test") == [(f"{d}/test/data-00000-of-00001.arrow:row 0", ROWS[2])]
    with pytest.raises(RowFileError, match=r"dict: split: no split 'validation' \(splits: train, test\)"):
        _read(d, "validation")


# --------------------------------------------------------------------------- Hub shard folders

def test_hub_sharded_parquet_with_splits(tmp_path):
    root = tmp_path / "hub"
    _parquet(root / "data" / "train-00000-of-00002.parquet", ROWS[:2])
    _parquet(root / "data" / "train-00001-of-00002.parquet", ROWS[2:])
    _parquet(root / "data" / "test-00000-of-00001.parquet", ROWS[1:2])
    (root / "README.md").write_text("---\nconfigs: []\n---\n")
    (root / ".cache").mkdir()
    _jsonl(root / ".cache" / "train.jsonl", ROWS)
    assert [d for _, d in _read(root)] == ROWS
    assert _read(root, "test") == [(f"{root}/data/test-00000-of-00001.parquet:row 0", ROWS[1])]


def test_hub_split_folders_and_split_files(tmp_path):
    folders = tmp_path / "folders"
    _jsonl(folders / "train" / "part-0.jsonl", ROWS[:1])
    _parquet(folders / "train" / "part-1.parquet", ROWS[1:])
    _jsonl(folders / "test" / "x.jsonl", ROWS[2:])
    assert [d for _, d in _read(folders)] == ROWS
    assert _read(folders, "test") == [(f"{folders}/test/x.jsonl:1", ROWS[2])]
    files = tmp_path / "files"
    _jsonl(files / "train.jsonl", ROWS[:2])
    _jsonl(files / "my_valid_file.jsonl", ROWS[2:])
    assert [d["id"] for _, d in _read(files)] == ["a", "b"]
    assert [d["id"] for _, d in _read(files, "validation")] == ["c"]


def test_a_folder_without_split_names_is_all_train(tmp_path):
    root = tmp_path / "plain"
    _jsonl(root / "b.jsonl", ROWS[1:])
    _jsonl(root / "a" / "z.jsonl", ROWS[:1])
    assert [d["id"] for _, d in _read(root)] == ["a", "b", "c"]  # a/z.jsonl sorts before b.jsonl
    with pytest.raises(RowFileError, match=r"plain: split: no split 'test' \(splits: train\)"):
        _read(root, "test")


@pytest.mark.parametrize("files, splits", [
    (["data/train-00000-of-00001.parquet", "data/sft-00000-of-00002.parquet", "extra/train.jsonl"],
     {"train": ["data/train-00000-of-00001.parquet"], "sft": ["data/sft-00000-of-00002.parquet"]}),
    (["train/a.jsonl", "dev/b.jsonl", "eval-2024/c.jsonl", "notes.jsonl"],
     {"train": ["train/a.jsonl"], "validation": ["dev/b.jsonl"], "test": ["eval-2024/c.jsonl"]}),
    (["training.jsonl", "test1.jsonl", "testfile.jsonl", "my val file.jsonl"],
     {"train": ["training.jsonl"], "test": ["test1.jsonl"], "validation": ["my val file.jsonl"]}),
    (["a.jsonl", "b/c.parquet"], {"train": ["a.jsonl", "b/c.parquet"]}),
])
def test_split_rules_in_the_hub_order(files, splits):
    assert splits_of_folder(files) == splits


def test_a_file_naming_two_splits_is_an_error():
    with pytest.raises(RowFileError, match="train_eval.jsonl: names splits test, train"):
        splits_of_folder(["train_eval.jsonl"])


# --------------------------------------------------------------------------- errors

def test_unreadable_inputs_name_the_file(tmp_path):
    f = _jsonl(tmp_path / "x.jsonl", ROWS[:1])
    with pytest.raises(RowFileError, match=r"x.jsonl: split: 'test' given, but a file is one split"):
        _read(f, "test")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(RowFileError, match=r"x.csv: not a row file \(.jsonl, .parquet or .arrow\)"):
        _read(tmp_path / "x.csv")
    with pytest.raises(RowFileError, match=r"nope: does not exist"):
        _read(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RowFileError, match=r"empty: no .arrow, .jsonl, .parquet files under it"):
        _read(tmp_path / "empty")
    p = _parquet(tmp_path / "p.parquet", [{"text": "x"}])
    with pytest.raises(RowFileError, match=r"p.parquet: body: no such column \(columns: \['text'\]\)"):
        _read(p, columns=["body"])
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"not arrow")
    with pytest.raises(RowFileError, match="junk.arrow: not a readable Arrow file"):
        _read(junk)
    assert issubclass(RowFileError, BadInput)  # exit 2


def test_bad_jsonl_lines_go_to_on_bad_with_their_bytes(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_bytes(b'{"x": 1}\n{"x": \n[1]\n\xff\n')
    bad = []
    assert [r.data for r in iter_rows(f, on_bad=bad.append)] == [{"x": 1}]
    assert [str(b) for b in bad] == [f"{f}:2: malformed JSON (Expecting value at column 7)",
                                     f"{f}:3: expected a JSON object, got list",
                                     f"{f}:4: not valid UTF-8 (invalid start byte at byte 0)"]
    assert [b.raw for b in bad] == [b'{"x": \n', b"[1]\n", b"\xff\n"]
    with pytest.raises(RowFileError, match=r"b.jsonl:2: malformed JSON"):
        list(iter_rows(f))
