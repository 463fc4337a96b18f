"""Where a stage's stretches end: phase ends and gate evaluation marks."""

from stagewise.flows.stage_loop import marks


def test_phase_ends_only_without_gate():
    assert marks([("diversity", 800), ("quality", 1000)], None, 1000) == [("diversity", 800), ("quality", 1000)]


def test_gate_marks_interleave_with_phases_and_are_labelled_by_phase():
    got = marks([("diversity", 800), ("quality", 1000)], 300, 1000)
    assert got == [("diversity", 300), ("diversity", 600), ("diversity", 800), ("quality", 900), ("quality", 1000)]


def test_phase_ends_are_capped_at_the_budget():
    # the budget rounds down to whole steps: a phase ending past it ends at the budget
    assert marks([("only", 1000)], None, 960) == [("only", 960)]


def test_mark_on_a_phase_end_is_not_doubled():
    assert marks([("a", 500), ("b", 1000)], 250, 1000) == [("a", 250), ("a", 500), ("b", 750), ("b", 1000)]
