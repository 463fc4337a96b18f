"""Replaying a rule on finished runs: rule files, cutoffs and how guards moved after them."""

from __future__ import annotations

import pytest

from stagewise.data.errors import BadInput
from stagewise.eval.cutoffs import Cutoff, guard_moves, load_rule, run_cutoff
from stagewise.eval.gates import GateRule, UnknownMetricError

ACC = "eval/world_arithmetic/exact_match"
LOOKUP = "eval/world_lookup/exact_match"
RULE = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.5}])


def series(*values):
    return [(i * 10, i * 1000, v) for i, v in enumerate(values)]


def test_load_rule_reads_the_rule_keys(tmp_path):
    path = tmp_path / "rule.yaml"
    path.write_text(f"all:\n  - {{metric: {ACC}, op: '>=', value: 0.3}}\nguards:\n  - {{metric: {LOOKUP}, max_drop: 0.1}}\n")
    rule = load_rule(path)
    assert rule.all[0].metric == ACC and rule.guards[0].max_drop == 0.1


def test_load_rule_accepts_a_pasted_gate_block(tmp_path):
    path = tmp_path / "rule.yaml"
    path.write_text(f"gate:\n  suite: world\n  eval_every_tokens: 1000\n  on_budget_exhausted: fail\n"
                    f"  all: [{{metric: {ACC}, op: '>', value: 0.1}}]\n")
    assert load_rule(path).all[0].value == 0.1


def test_load_rule_refuses_unknown_keys(tmp_path):
    path = tmp_path / "rule.yaml"
    path.write_text(f"al:\n  - {{metric: {ACC}, op: '>=', value: 0.3}}\n")
    with pytest.raises(BadInput, match=r"al: .*rule.yaml:1\)"):
        load_rule(path)


@pytest.mark.parametrize("content,why", [(b"all: [\n", r"rule.yaml:2: invalid YAML"),
                                         (b"all: []\nguards: \xff\n", r"rule.yaml:2: not UTF-8"),
                                         (b"- 1\n- 2\n", "holds a mapping"),
                                         (b"gate: 7\n", "holds a mapping"),
                                         (b"all:\n  - {metric: m, op: '>', value: x}\n", r"all.0.value: .*rule.yaml:2\)")])
def test_load_rule_names_file_and_line_of_a_bad_rule(tmp_path, content, why):
    path = tmp_path / "rule.yaml"
    path.write_bytes(content)
    with pytest.raises(BadInput, match=why):
        load_rule(path)


def test_run_cutoff_finds_the_first_hold_and_the_guard_after_it():
    histories = {ACC: series(0.1, 0.2, 0.35, 0.4, 0.5), LOOKUP: series(0.6, 0.6, 0.55, 0.4, 0.45)}
    report = run_cutoff("r1", RULE, histories, "pretrain")
    assert report.cutoff == Cutoff(20, 2000, {ACC: 0.35, LOOKUP: 0.55})
    (move,) = report.guards
    assert (move.at_cutoff, move.final, move.worst_after, move.evaluations_after) == (0.55, 0.45, 0.4, 2)
    assert move.change == pytest.approx(-0.1)
    assert (report.last_step, report.last_tokens) == (40, 4000)
    assert report.to_dict()["cutoff"]["values"][ACC] == 0.35


def test_run_cutoff_without_a_hold_reports_guards_from_the_start():
    report = run_cutoff("r2", RULE, {ACC: series(0.1, 0.2), LOOKUP: series(0.6, 0.5)})
    assert report.cutoff is None
    assert report.guards[0].at_cutoff == 0.6 and report.guards[0].final == 0.5


def test_guard_moves_for_a_lower_is_better_guard_take_the_highest_as_worst():
    rule = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}],
                    guards=[{"metric": "eval/validation/loss", "max_drop": 9, "higher_is_better": False}])
    moves = guard_moves(rule, {"eval/validation/loss": series(2.0, 1.8, 2.3, 1.9)}, Cutoff(10, 1000, {}))
    assert moves[0].worst_after == 2.3


def test_run_cutoff_names_a_missing_metric():
    with pytest.raises(UnknownMetricError, match=LOOKUP):
        run_cutoff("r3", RULE, {ACC: series(0.1)})
