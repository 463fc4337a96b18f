"""RL rows: NeMo Gym rows load with their unknown keys, round-trip byte for byte, and bad rows
are cited by file, line and field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.data.chat import prompt_key as conversation_key
from stagewise.data.errors import BadInput
from stagewise.data.rl_rows import RLRow, prompt_key, prompt_messages, read_rows, write_rows

# NeMo Gym's own row shapes: compact separators, agent_ref, Responses-API message items with
# "type", request settings, integer ids, flat verifier fields, escaped and raw non-ASCII text.
NEMO_GYM_LINES = [
    '{"responses_create_params":{"input":[{"role":"user","content":"Solve the following math problem. '
    'Put only the answer inside \\\\boxed{}.\\n\\nWhat is 37 + 58?"}]},"question":"What is 37 + 58?",'
    '"expected_answer":"95"}',
    '{"agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"}, "responses_create_params": '
    '{"input": [{"role": "user", "type": "message", "content": "Pick one: A) 1 B) 2"}], "temperature": 0.6, '
    '"tool_choice": "auto"}, "expected_answer": "B", "options": [{"A": "1"}, {"B": "2"}], "dataset": "caf\\u00e9"}',
    '{"id": 7, "domain": "airline", "responses_create_params": {"input": [{"role": "system", "content": "Be kind."}, '
    '{"role": "user", "content": [{"type": "input_text", "text": "Book "}, {"type": "input_text", "text": "Oslo"}]}], '
    '"tools": [{"type": "function", "name": "book", "parameters": {}}], "parallel_tool_calls": true}, "world": "é"}',
    '{"responses_create_params": {"input": "plain string prompt"}, "expected_answer": 12.0}',
]


def _write(tmp_path, lines, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_nemo_gym_rows_load_and_round_trip_byte_for_byte(tmp_path):
    src = _write(tmp_path, NEMO_GYM_LINES)
    rows = read_rows(src)
    assert rows[0].expected_answer == "95" and rows[0].question == "What is 37 + 58?"
    assert rows[1].agent_ref == {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
    assert rows[1].responses_create_params.temperature == 0.6
    assert rows[2].id == 7 and rows[2].domain == "airline" and rows[2].world == "é"
    out = write_rows(tmp_path / "out" / "copy.jsonl", rows)
    assert out.read_bytes() == src.read_bytes()


def test_a_changed_row_is_written_fresh_with_its_unknown_keys(tmp_path):
    rows = read_rows(_write(tmp_path, NEMO_GYM_LINES[1:2]))
    rows[0].expected_answer = "A"
    back = json.loads(write_rows(tmp_path / "w.jsonl", rows).read_text())
    assert back["expected_answer"] == "A"
    assert back["agent_ref"]["name"] == "mcqa_simple_agent" and back["dataset"] == "café"
    assert back["responses_create_params"]["tool_choice"] == "auto"
    assert "id" not in back and "tools" not in back["responses_create_params"]  # unset defaults stay out


def test_new_rows_round_trip(tmp_path):
    row = RLRow.model_validate({"id": "a", "responses_create_params": {"input": "2 + 2?"}, "expected_answer": 4,
                                "environment": "exact_answer"})
    again = read_rows(write_rows(tmp_path / "n.jsonl", [row]))[0]
    assert again.as_json() == row.as_json() and again.environment == "exact_answer"


@settings(max_examples=30, deadline=None)
@given(extra=st.dictionaries(st.text(min_size=1).filter(lambda k: k not in RLRow.model_fields),
                             st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                                          lambda inner: st.lists(inner, max_size=3)
                                          | st.dictionaries(st.text(), inner, max_size=3), max_leaves=6),
                             max_size=4),
       prompt=st.text(min_size=1).filter(str.strip))
def test_any_extra_keys_round_trip(tmp_path_factory, extra, prompt):
    line = json.dumps({"responses_create_params": {"input": prompt}, **extra})
    path = _write(tmp_path_factory.mktemp("h"), [line])
    assert write_rows(path.with_name("o.jsonl"), read_rows(path)).read_bytes() == path.read_bytes()
    assert {k: getattr(read_rows(path)[0], k) for k in extra} == extra


@pytest.mark.parametrize(("line", "cites"), [
    ('{"responses_create_params": {"input": "ok"}', "malformed JSON"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"expected_answer": 1}', "responses_create_params: Field required"),
    ('{"responses_create_params": {"input": []}}', "responses_create_params.input: empty prompt"),
    ('{"responses_create_params": {"input": "  "}}', "responses_create_params.input: empty prompt"),
    ('{"responses_create_params": {"input": [{"content": "hi"}]}}', "responses_create_params.input: message 0 has no"),
    ('{"responses_create_params": {"input": [{"role": "user", "content": 3}]}}', "message 0 content"),
    ('{"responses_create_params": {"input": "hi", "tools": "calculator"}}', "responses_create_params.tools"),
    ('{"responses_create_params": {"input": "hi"}, "id": [1]}', ": id:"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, line, cites):
    path = _write(tmp_path, [NEMO_GYM_LINES[3], "", line])
    with pytest.raises(BadInput) as e:
        read_rows(path)
    assert f"{path}:3: " in str(e.value) and cites in str(e.value)


def test_skip_drops_bad_rows(tmp_path):
    path = _write(tmp_path, [NEMO_GYM_LINES[0], "{oops", NEMO_GYM_LINES[3]])
    assert [r.expected_answer for r in read_rows(path, on_bad_line="skip")] == ["95", 12.0]


def test_not_utf8_and_missing_files_are_bad_input(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"responses_create_params": {"input": "\xff"}}\n')
    with pytest.raises(BadInput, match=r"bin.jsonl:1: not valid UTF-8"):
        read_rows(path)
    with pytest.raises(BadInput, match=r"missing.jsonl: does not exist"):
        read_rows(tmp_path / "missing.jsonl")


def test_prompt_messages_and_key(tmp_path):
    rows = read_rows(_write(tmp_path, NEMO_GYM_LINES))
    assert prompt_messages(rows[3]) == [{"role": "user", "content": "plain string prompt"}]
    assert prompt_messages(rows[1]) == [{"role": "user", "content": "Pick one: A) 1 B) 2"}]  # "type" dropped
    assert prompt_messages(rows[2])[1] == {"role": "user", "content": "Book Oslo"}  # text parts joined
    # the key is the SFT conversation's key for the same prompt, and ignores everything but the prompt
    conv = {"tools": None, "messages": [{"role": "user", "content": "plain string prompt"},
                                        {"role": "assistant", "content": "x"}]}
    assert prompt_key(rows[3]) == conversation_key(conv)
    other = RLRow.model_validate({"responses_create_params": {"input": "plain string prompt"}, "expected_answer": 1})
    assert prompt_key(other) == prompt_key(rows[3]) and prompt_key(rows[0]) != prompt_key(rows[3])


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    class Boom(Exception):
        pass

    def rows():
        yield RLRow.model_validate({"responses_create_params": {"input": "a"}})
        raise Boom

    target = _write(tmp_path, [NEMO_GYM_LINES[0]], "keep.jsonl")
    before = target.read_bytes()
    with pytest.raises(Boom):
        write_rows(target, rows())
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]


# --------------------------------------------------------------------------- parquet and datasets directories

TEAM_ROWS = [
    {"id": 1, "domain": "math", "environment": "exact_answer", "expected_answer": "4",
     "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 2?"}]}},
    {"id": 2, "domain": "math", "environment": "exact_answer", "expected_answer": "15",
     "responses_create_params": {"input": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "What is 3 * 5?"}], "temperature": 0.6}},
]


def test_parquet_and_save_to_disk_rows_load_as_written(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(TEAM_ROWS), f)
    assert [r.as_json() for r in read_rows(f)] == TEAM_ROWS  # the nulls Arrow filled in are absent again
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TEAM_ROWS[:1]),
                          "test": datasets.Dataset.from_list(TEAM_ROWS[1:])}).save_to_disk(str(saved))
    assert [r.as_json() for r in read_rows(saved)] == TEAM_ROWS[:1]
    assert [r.as_json() for r in read_rows(saved, split="test")] == TEAM_ROWS[1:]


def test_a_bad_parquet_row_names_file_row_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "rows.parquet"
    bad = {**TEAM_ROWS[0], "responses_create_params": {"input": []}}
    pq.write_table(pa.Table.from_pylist([TEAM_ROWS[0], bad]), f)
    with pytest.raises(BadInput) as e:
        read_rows(f)
    assert str(e.value) == f"{f}:row 1: responses_create_params.input: empty prompt: no messages"
    assert [r.id for r in read_rows(f, on_bad_line="skip")] == [1]


def test_the_rl_stage_loads_a_hub_folder_of_parquet(tmp_path):
    """eval.rl_wiring.load_rows, what flows/rl.py calls per source, on a directory with splits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stagewise.data.digest import rows_digest
    from stagewise.eval.rl_wiring import load_rows

    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(TEAM_ROWS), tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(TEAM_ROWS[:1]), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    rows = load_rows(tmp_path / "hub", "team", None, None)
    assert [(t.id, t.domain, t.environment, t.row.expected_answer) for t in rows] == [
        ("team:1", "math", "exact_answer", "4"), ("team:2", "math", "exact_answer", "15")]
    before = rows_digest(tmp_path / "hub")
    pq.write_table(pa.Table.from_pylist(TEAM_ROWS[1:]), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    assert rows_digest(tmp_path / "hub") == before  # the test split is not what trains
    pq.write_table(pa.Table.from_pylist(TEAM_ROWS[1:]), tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    assert rows_digest(tmp_path / "hub") != before
