"""Gate rules on known histories: every rule form of decide() and first_hold()."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from stagewise.eval.gates import GateConfig, GateRule, UnknownMetricError, decide, first_hold

ACC = "eval/world_arithmetic/exact_match"
LOOKUP = "eval/world_lookup/exact_match"
LOSS = "eval/validation/loss"


def gate(**kw) -> GateConfig:
    return GateConfig.model_validate({"eval_every_tokens": 100, "suite": "world", **kw})


def series(*values: float, every: int = 10, tokens_per_step: int = 100) -> list[tuple[int, int, float]]:
    """Evaluations at steps 0, every, 2*every, ... with tokens = step * tokens_per_step."""
    return [(i * every, i * every * tokens_per_step, v) for i, v in enumerate(values)]


def ask(g, histories, tokens=None, budget=False):
    if tokens is None:
        tokens = max(t for h in histories.values() for _, t, _ in h) if any(histories.values()) else 0
    return decide(g, histories, tokens_seen=tokens, budget_exhausted=budget)


# --------------------------------------------------------------------------- conditions

def test_absolute_threshold_stops_when_it_holds_and_cites_the_values():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}])
    d = ask(g, {ACC: series(0.0, 0.1, 0.31)})
    assert (d.action, d.held, d.step, d.tokens_seen) == ("stop", True, 20, 2000)
    (cond,) = d.evidence["conditions"]
    assert cond["current"] == 0.31 and cond["threshold"] == 0.3 and cond["holds"] and cond["step"] == 20
    assert ACC in d.reason
    json.dumps(d.to_dict())  # the evidence is logged as a JSON artifact


def test_absolute_threshold_not_reached_continues():
    d = ask(gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}]), {ACC: series(0.0, 0.1, 0.29)})
    assert d.action == "continue" and not d.held
    assert "0.29" in d.reason and d.evidence["conditions"][0]["holds"] is False


def test_a_bound_reads_the_end_of_the_rates_interval_not_the_point():
    """8 of 40 right (0.2): the point clears 0.15 but the lower bound (Wilson, 0.10499) does not; 16 of
    40 (0.4, lower 0.263) clears it. Read from `<metric>_low`, as the held-out evaluation logs it."""
    from stagewise.eval.intervals import wilson

    lows = [wilson(k, 40)[0] for k in (8, 16)]
    histories = {ACC: series(0.2, 0.4), ACC + "_low": series(*lows)}
    point = gate(all=[{"metric": ACC, "op": ">=", "value": 0.15}])
    lower = gate(all=[{"metric": ACC, "bound": "lower", "op": ">=", "value": 0.15}])
    assert first_hold(point, histories)[0] == 0
    step, _, values = first_hold(lower, histories)
    assert step == 10 and values == {ACC + "_low": pytest.approx(0.2634, abs=1e-4)}
    assert lower.metrics() == [ACC + "_low"]
    d = ask(lower, {ACC: series(0.2), ACC + "_low": series(lows[0])})
    assert d.action == "continue" and d.evidence["conditions"][0]["bound"] == "lower"
    assert f"{ACC}_low = 0.105 >= 0.15" in d.reason
    # upper: fails only on evidence of being below the bar (0 of 40: upper 0.088 < 0.1; 1 of 40: 0.129)
    upper = gate(all=[{"metric": ACC, "bound": "upper", "op": ">=", "value": 0.1}])
    assert first_hold(upper, {ACC + "_high": series(wilson(0, 40)[1], wilson(1, 40)[1])})[0] == 10
    with pytest.raises(UnknownMetricError, match="_high"):  # a run that logged no bounds names what it has
        first_hold(upper, {ACC: series(0.2)})
    with pytest.raises(ValidationError, match="bound"):
        gate(all=[{"metric": ACC, "bound": "middle", "op": ">=", "value": 0.1}])


@pytest.mark.parametrize("op,value,expect", [(">", 0.5, "continue"), (">=", 0.5, "stop"), ("<", 0.6, "stop"),
                                             ("<=", 0.4, "continue"), ("==", 0.5, "stop")])
def test_each_comparison_operator(op, value, expect):
    assert ask(gate(all=[{"metric": ACC, "op": op, "value": value}]), {ACC: series(0.5)}).action == expect


def test_relative_threshold_is_start_plus_value():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.05, "relative": True}])
    assert ask(g, {ACC: series(0.20, 0.24)}).action == "continue"
    d = ask(g, {ACC: series(0.20, 0.24, 0.26)})
    assert d.action == "stop"
    cond = d.evidence["conditions"][0]
    assert cond["start"] == 0.20 and cond["threshold"] == pytest.approx(0.25)


def test_relative_threshold_downwards_for_a_loss():
    g = gate(all=[{"metric": LOSS, "op": "<", "value": -0.5, "relative": True}])
    assert ask(g, {LOSS: series(3.0, 2.6)}).action == "continue"
    assert ask(g, {LOSS: series(3.0, 2.6, 2.4)}).action == "stop"


def test_all_needs_every_condition():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}, {"metric": LOOKUP, "op": ">=", "value": 0.5}])
    assert ask(g, {ACC: series(0.4), LOOKUP: series(0.4)}).action == "continue"
    assert ask(g, {ACC: series(0.4), LOOKUP: series(0.5)}).action == "stop"


def test_any_needs_one_condition():
    g = gate(any=[{"metric": ACC, "op": ">=", "value": 0.3}, {"metric": LOOKUP, "op": ">=", "value": 0.5}])
    assert ask(g, {ACC: series(0.1), LOOKUP: series(0.4)}).action == "continue"
    assert ask(g, {ACC: series(0.1), LOOKUP: series(0.6)}).action == "stop"


def test_all_and_any_together():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], any=[{"metric": LOOKUP, "op": ">=", "value": 0.5}])
    assert ask(g, {ACC: series(0.4), LOOKUP: series(0.1)}).action == "continue"
    assert ask(g, {ACC: series(0.4), LOOKUP: series(0.5)}).action == "stop"


def test_metrics_logged_at_different_steps_are_aligned_as_of_each_step():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}, {"metric": LOOKUP, "op": ">=", "value": 0.5}])
    histories = {ACC: [(0, 0, 0.1), (20, 2000, 0.4)], LOOKUP: [(0, 0, 0.1), (10, 1000, 0.6)]}
    assert first_hold(g, histories) == (20, 2000, {ACC: 0.4, LOOKUP: 0.6})


def test_unsorted_histories_are_read_in_step_order():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}])
    assert ask(g, {ACC: [(20, 2000, 0.1), (0, 0, 0.0), (10, 1000, 0.5)]}).action == "continue"


# --------------------------------------------------------------------------- guards

def test_guard_drop_from_start_fails_the_stage_with_evidence():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.05}])
    d = ask(g, {ACC: series(0.1, 0.4), LOOKUP: series(0.50, 0.40)})
    assert d.action == "fail" and not d.held
    (guard,) = d.evidence["guards"]
    assert guard["reference"] == 0.5 and guard["current"] == 0.4 and guard["drop"] == pytest.approx(0.1)
    assert guard["violated"] and LOOKUP in d.reason


def test_guard_within_bounds_lets_the_rule_stop():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.05}])
    d = ask(g, {ACC: series(0.1, 0.4), LOOKUP: series(0.50, 0.46)})
    assert d.action == "stop" and d.evidence["guards"][0]["violated"] is False


def test_guard_on_violation_continue_only_blocks_the_rule():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}],
             guards=[{"metric": LOOKUP, "max_drop": 0.05, "on_violation": "continue"}])
    d = ask(g, {ACC: series(0.1, 0.4), LOOKUP: series(0.50, 0.40)})
    assert d.action == "continue" and "blocked" in d.reason and d.evidence["blocked_by"] == [LOOKUP]
    # once the guarded metric recovers, the rule holds again
    assert ask(g, {ACC: series(0.1, 0.4, 0.4), LOOKUP: series(0.50, 0.40, 0.48)}).action == "stop"


def test_guard_best_so_far_baseline():
    histories = {ACC: series(0.1, 0.1, 0.1), LOOKUP: series(0.50, 0.80, 0.70)}
    from_start = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.05}])
    from_best = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}],
                     guards=[{"metric": LOOKUP, "max_drop": 0.05, "baseline": "best"}])
    assert ask(from_start, histories).action == "continue"
    d = ask(from_best, histories)
    assert d.action == "fail" and d.evidence["guards"][0]["reference"] == 0.8


def test_guard_on_a_lower_is_better_metric_counts_a_rise():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}],
             guards=[{"metric": LOSS, "max_drop": 0.1, "higher_is_better": False}])
    assert ask(g, {ACC: series(0.1, 0.2), LOSS: series(2.0, 1.5)}).action == "continue"
    d = ask(g, {ACC: series(0.1, 0.2), LOSS: series(2.0, 2.2)})
    assert d.action == "fail" and d.evidence["guards"][0]["drop"] == pytest.approx(0.2)


def test_guard_fail_wins_over_min_tokens_and_budget():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.0}],
             min_tokens=10**9)
    assert ask(g, {ACC: series(0.1, 0.1), LOOKUP: series(0.5, 0.4)}, budget=True).action == "fail"


# --------------------------------------------------------------------------- min_tokens, patience, budget

def test_min_tokens_holds_back_a_rule_that_holds():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], min_tokens=5000)
    d = ask(g, {ACC: series(0.0, 0.5)}, tokens=1000)
    assert d.action == "continue" and "min_tokens" in d.reason
    assert d.evidence["min_tokens"] == {"required": 5000, "met": False, "tokens_seen": 1000}
    assert ask(g, {ACC: series(0.0, 0.5)}, tokens=5000).action == "stop"


def test_patience_stops_on_a_plateau_of_the_primary_metric():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}], patience=3)
    assert ask(g, {ACC: series(0.1, 0.3, 0.2, 0.25)}).action == "continue"  # 2 evaluations without a new best
    d = ask(g, {ACC: series(0.1, 0.3, 0.2, 0.25, 0.3)})  # 3: equal is not better
    assert d.action == "stop" and not d.held and "plateau" in d.reason
    assert d.evidence["plateau"]["best_step"] == 10 and d.evidence["plateau"]["evals_since_best"] == 3


def test_patience_takes_direction_from_the_op_and_respects_min_delta():
    g = gate(all=[{"metric": LOSS, "op": "<", "value": 0.5}], patience=2, min_delta=0.05)
    assert ask(g, {LOSS: series(3.0, 2.5, 2.0)}).action == "continue"  # falling: improving
    assert ask(g, {LOSS: series(3.0, 2.5, 2.47, 2.46)}).action == "stop"  # gains under min_delta


def test_patience_with_an_explicit_primary_metric():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}], patience=2, primary=LOOKUP, higher_is_better=True)
    histories = {ACC: series(0.1, 0.2, 0.3, 0.4), LOOKUP: series(0.5, 0.6, 0.6, 0.55)}
    assert ask(g, histories).action == "stop"
    assert ask(gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}], patience=2), histories).action == "continue"


def test_patience_alone_is_a_rule():
    g = gate(patience=2, primary=LOSS, higher_is_better=False)
    assert ask(g, {LOSS: series(3.0, 2.0, 1.5)}).action == "continue"
    assert ask(g, {LOSS: series(3.0, 2.0, 2.1, 2.0)}).action == "stop"
    assert first_hold(g, {LOSS: series(3.0, 2.0, 2.1, 2.0)}) is None  # a plateau is not a hold


def test_patience_respects_min_tokens():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}], patience=1, min_tokens=10**6)
    assert ask(g, {ACC: series(0.3, 0.1)}).action == "continue"


def test_budget_exhausted_continue_hands_on_the_last_checkpoint():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}])
    d = ask(g, {ACC: series(0.1, 0.2)}, budget=True)
    assert d.action == "stop" and not d.held and "budget exhausted" in d.reason


def test_budget_exhausted_fail():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.9}], on_budget_exhausted="fail")
    d = ask(g, {ACC: series(0.1, 0.2)}, budget=True)
    assert d.action == "fail" and "never held" in d.reason and d.evidence["budget_exhausted"] is True


def test_rule_holding_at_the_last_chunk_is_a_held_stop_even_when_the_budget_ran_out():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.1}], on_budget_exhausted="fail")
    d = ask(g, {ACC: series(0.0, 0.2)}, budget=True)
    assert (d.action, d.held) == ("stop", True)


def test_no_evaluations_yet():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}])
    d = ask(g, {ACC: []})
    assert (d.action, d.step) == ("continue", None) and d.reason == "no evaluations yet"
    assert ask(gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], on_budget_exhausted="fail"), {ACC: []},
               budget=True).action == "fail"


# --------------------------------------------------------------------------- errors and config

def test_unknown_metric_lists_the_existing_ones_nearest_first():
    g = gate(all=[{"metric": "eval/world_arithmetc/exact_match", "op": ">=", "value": 0.3}])
    histories = {"train/lm_loss": series(1.0), ACC: series(0.1), LOOKUP: series(0.1), "tokens_seen": series(0)}
    with pytest.raises(UnknownMetricError) as err:
        ask(g, histories)
    text = str(err.value)
    assert "eval/world_arithmetc/exact_match" in text
    assert text.index(ACC) < text.index(LOOKUP) < text.index("train/lm_loss")
    with pytest.raises(UnknownMetricError, match="tokens_seen"):
        first_hold(g, histories)


def test_unknown_guard_metric_is_an_error_too():
    g = gate(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": "eval/nope/acc", "max_drop": 0.1}])
    with pytest.raises(UnknownMetricError, match="eval/nope/acc"):
        ask(g, {ACC: series(0.1)})


@pytest.mark.parametrize("bad", [
    {},  # no condition, no patience
    {"all": [{"metric": ACC, "op": "=>", "value": 0.3}]},  # not an op
    {"all": [{"metric": ACC, "op": ">=", "value": 0.3, "relativ": True}]},  # typo
    {"all": [{"metric": ACC, "op": "==", "value": 0.3}], "patience": 2},  # no direction for patience
    {"guards": [{"metric": ACC, "max_drop": -1}], "all": [{"metric": ACC, "op": ">", "value": 0}]},
    {"patience": 2},  # patience alone needs a primary metric
])
def test_invalid_rules_are_refused(bad):
    with pytest.raises(ValidationError):
        GateRule.model_validate(bad)


def test_gate_config_needs_its_schedule():
    with pytest.raises(ValidationError, match="eval_every_tokens"):
        GateConfig.model_validate({"all": [{"metric": ACC, "op": ">", "value": 0}], "suite": "world"})


# --------------------------------------------------------------------------- first_hold

def test_first_hold_gives_the_first_step_and_values():
    g = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}])
    assert first_hold(g, {ACC: series(0.1, 0.35, 0.2, 0.5)}) == (10, 1000, {ACC: 0.35})
    assert first_hold(g, {ACC: series(0.1, 0.2)}) is None


def test_first_hold_honours_min_tokens_at_each_evaluation():
    g = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}], min_tokens=2500)
    assert first_hold(g, {ACC: series(0.1, 0.35, 0.4, 0.5)}) == (30, 3000, {ACC: 0.5})


def test_first_hold_skips_points_where_a_guard_fails_or_blocks():
    g = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}], guards=[{"metric": LOOKUP, "max_drop": 0.05}])
    histories = {ACC: series(0.1, 0.35, 0.4), LOOKUP: series(0.5, 0.3, 0.5)}
    assert first_hold(g, histories) == (20, 2000, {ACC: 0.4, LOOKUP: 0.5})


def test_first_hold_relative():
    g = GateRule(all=[{"metric": ACC, "op": ">", "value": 0.1, "relative": True}])
    assert first_hold(g, {ACC: series(0.3, 0.35, 0.45)}) == (20, 2000, {ACC: 0.45})


ABSOLUTE = {"metric": "m", "op": ">=", "value": 0.5}


@pytest.mark.parametrize("rule, reads", [
    ({"all": [ABSOLUTE, {"metric": "n", "op": "<", "value": 1.0}]}, False),
    ({"all": [ABSOLUTE, {"metric": "n", "op": ">=", "value": 0.1, "relative": True}]}, True),
    ({"all": [ABSOLUTE], "guards": [{"metric": "g", "max_drop": 0.05}]}, True),
    ({"all": [ABSOLUTE], "patience": 3}, True),
])
def test_only_a_gate_that_reads_the_start_asks_for_its_evaluation(rule, reads):
    assert GateConfig(eval_every_tokens=10, **rule).reads_start() is reads
