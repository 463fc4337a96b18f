"""Sources: each format, file or directory, path resolution, and errors that name file:line."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data.config import SourceConfig
from stagewise.data.sources import SourceError, iter_texts, resolve_path


def _src(path, **kw):
    return SourceConfig(name="s", path=str(path), **kw)


def _texts(path, base=None, world=None, **kw):
    return list(iter_texts(_src(path, **kw), base or path.parent, world))


def test_jsonl_file_skips_blank_lines_and_empty_texts(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text('{"text": "one"}\n\n{"text": "  "}\n{"text": "two", "x": 1}\n')
    assert _texts(f) == ["one", "two"]


def test_jsonl_directory_is_read_in_sorted_order_with_custom_field(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "b.jsonl").write_text('{"body": "b"}\n')
    (d / "a.jsonl").write_text('{"body": "a"}\n')
    (d / "sub" / "c.jsonl").write_text('{"body": "c"}\n')
    (d / "ignored.txt").write_text("nope")
    assert _texts(d, format="jsonl", text_field="body") == ["a", "b", "c"]


@pytest.mark.parametrize("lines, where, what", [
    (['{"text": "ok"}'] * 16 + ['{"text": "broken'], ":17:", "malformed JSON"),
    (['{"text": "ok"}', '{"other": "x"}'], ":2:", "text: missing text field (fields: ['other'])"),
    (['{"text": 5}'], ":1:", "text: expected a string, got int"),
    (['["text"]'], ":1:", "expected a JSON object"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, lines, where, what):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError) as e:
        _texts(f)
    assert f"{f}{where}" in str(e.value) and what in str(e.value)


def test_jsonl_invalid_utf8_names_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(SourceError, match=r"bad\.jsonl:2: not valid UTF-8"):
        _texts(f)


def test_parquet(tmp_path):
    f = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["x", None, "y"], "n": [1, 2, 3]}), f)
    assert _texts(f) == ["x", "y"]
    with pytest.raises(SourceError, match=r"a\.parquet: body: no such column \(columns: \['text', 'n'\]\)"):
        _texts(f, text_field="body")
    with pytest.raises(SourceError, match=r"a\.parquet:row 0: n: expected a string, got int"):
        _texts(f, text_field="n")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=r"junk\.parquet: not a readable parquet file"):
        _texts(junk)


def test_txt_blocks_and_directory_of_files(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("para one\nline two\n\n\npara two\n   \npara three")
    assert _texts(f) == ["para one\nline two", "para two", "para three"]
    d = tmp_path / "docs"
    d.mkdir()
    (d / "2.txt").write_text("second\n\nstill second\n")
    (d / "1.txt").write_text("first")
    assert _texts(d, format="txt") == ["first", "second\n\nstill second"]


def test_txt_invalid_utf8_names_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"ok\nok\n\xfe\n")
    with pytest.raises(SourceError, match=r"a\.txt:3: not valid UTF-8"):
        _texts(f)


def test_path_resolution(tmp_path):
    assert resolve_path("@world/facts.jsonl", tmp_path, tmp_path / "w") == tmp_path / "w" / "facts.jsonl"
    assert resolve_path("x/y.txt", tmp_path, None) == tmp_path / "x" / "y.txt"
    assert resolve_path(str(tmp_path / "abs.txt"), tmp_path / "elsewhere", None) == tmp_path / "abs.txt"
    with pytest.raises(SourceError, match="needs the demo world"):
        resolve_path("@world/facts.jsonl", tmp_path, None)


def test_relative_and_world_paths_are_read(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "facts.jsonl").write_text(json.dumps({"text": "world"}) + "\n")
    (tmp_path / "local.jsonl").write_text(json.dumps({"text": "local"}) + "\n")
    assert list(iter_texts(_src("@world/facts.jsonl"), tmp_path / "nowhere", tmp_path / "w")) == ["world"]
    assert list(iter_texts(_src("local.jsonl"), tmp_path, None)) == ["local"]


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        _texts(tmp_path / "nope.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"source 's': .*empty: no \.jsonl files under it"):
        _texts(tmp_path / "empty", format="jsonl")


def test_a_hub_folder_and_a_saved_dataset_are_sources(tmp_path):
    """What prepare reads (iter_texts) and hashes (the source's files): the train split unless
    `split` names another; nulls in parquet/Arrow are empty documents."""
    from stagewise.data.digest import source_inputs

    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    pq.write_table(pa.table({"body": ["one", None]}), hub / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"body": ["two"]}), hub / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"body": ["held out"]}), hub / "validation-00000-of-00001.parquet")
    assert _texts(tmp_path / "hub", text_field="body") == ["one", "two"]
    assert _texts(tmp_path / "hub", text_field="body", split="validation") == ["held out"]
    files = source_inputs(_src(tmp_path / "hub", text_field="body"), tmp_path, None)["files"]
    assert [name for name, _ in files] == ["data/train-00000-of-00002.parquet",
                                           "data/train-00001-of-00002.parquet"]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["alpha", "beta"]}).save_to_disk(str(tmp_path / "saved"))
    assert _texts(tmp_path / "saved") == ["alpha", "beta"]
    state = tmp_path / "saved" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "_split": "train"}))
    with pytest.raises(SourceError, match=r"source 's': .*saved: split: 'test' given, but this saved dataset is split 'train'"):
        _texts(tmp_path / "saved", split="test")


def test_split_is_for_row_files():
    with pytest.raises(ValueError, match="split applies to row files"):
        _src("docs", format="txt", split="train")
