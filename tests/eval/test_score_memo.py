"""The one memo of scores (eval/score_memo.py): computed once per (kind, spec), in memory and on disk."""

from __future__ import annotations

from stagewise.eval.score_memo import ScoreMemo


def test_the_same_spec_is_computed_once_and_another_spec_again():
    memo, calls = ScoreMemo(), []

    def compute():
        calls.append(1)
        return {"exact_match": 0.25 * len(calls)}

    first, where = memo.get("sft-heldout", ["sha-a", "test", 100], compute)
    assert first == {"exact_match": 0.25} and where is None
    again, where = memo.get("sft-heldout", ["sha-a", "test", 100], compute)
    assert again == first and where == "memory" and len(calls) == 1
    other, _ = memo.get("sft-heldout", ["sha-a", "dev", 100], compute)
    assert other == {"exact_match": 0.5} and len(calls) == 2
    assert memo.path("sft-heldout", ["sha-a", "test", 100]) is None  # memory only: nothing written


def test_with_a_root_a_new_memo_reads_what_an_earlier_one_wrote(tmp_path):
    first = ScoreMemo(tmp_path)
    scores, _ = first.get("heldout", {"weights": "sha", "settings": [8, 32]}, lambda: {"pass_at_1": {"all": 0.5}})
    path = first.path("heldout", {"weights": "sha", "settings": [8, 32]})
    assert path.is_file() and path.parent.name.startswith("heldout-") and path.parent.parent == tmp_path

    def never():
        raise AssertionError("scored again")

    read, where = ScoreMemo(tmp_path).get("heldout", {"settings": [8, 32], "weights": "sha"}, never)  # key order: same
    assert read == scores and where == path.parent
    assert not list(tmp_path.glob("heldout-*/*.tmp-*"))  # written whole, no temporary left
