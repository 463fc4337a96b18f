"""Benchmark gates: when a stage has trained enough, read off metric histories.

A stage with a gate trains in chunks of `eval_every_tokens`, evaluates (its own evaluation, and
the gate's `suite` when it names one), logs the
numbers to MLflow, reads the histories back and calls `decide`. Because the decision is a
pure function of the histories, the same rule can be re-checked later on any finished run
(`first_hold`, `stagewise cutoffs`). No MLflow here: histories are plain data,
`{metric: [(step, tokens_seen, value), ...]}`, as `Tracker.metric_histories` returns them.

A rule in YAML:

    gate:
      suite: world                       # the recipe's eval suite run at each chunk
      eval_every_tokens: 262144
      all:                               # every one must hold ...
        - {metric: eval/world_arithmetic/exact_match, op: ">=", value: 0.30}
        - {metric: eval/validation/loss, op: "<", value: -0.2, relative: true}   # start - 0.2
      any: []                            # ... and at least one of these (when given)
      guards:                            # other benchmarks that must not fall
        - {metric: eval/world_lookup/exact_match, max_drop: 0.05}
      min_tokens: 1000000                # never stop before this
      patience: 4                        # stop after 4 evaluations without a new best
      on_budget_exhausted: continue      # or fail
      review: undecided                  # or always: a person decides in Prefect (default never)
      review_timeout_s: 3600             # then the gate's own decision stands

Semantics (the contract the tests pin down):
- A condition compares the metric's latest value with `value`; with `relative: true` the
  threshold is `start + value`, where start is the first value in the history (the stage's
  evaluation at its start; a gated flow should evaluate once before training). With `bound:
  lower|upper` it reads the metric's interval bound instead (`<metric>_low|_high`), e.g.
  `{metric: eval/sft_dev/format_match, bound: lower, op: ">=", value: 0.5}`.
- Metrics are aligned by step: at each evaluation step a metric's value is its latest one
  at or before that step.
- A guard measures the drop of its metric from a baseline: the start value (`baseline:
  start`, default) or the best value so far (`baseline: best`); for a metric where lower is
  better (`higher_is_better: false`, e.g. a loss) a rise is a drop. A drop above `max_drop`
  violates it: `on_violation: fail` (default) fails the stage at once; `on_violation:
  continue` only keeps the rule from holding while the guard is violated (training goes on,
  and the budget decides if it never recovers).
- `min_tokens` holds back every stop (rule, plateau) but not a guard's fail.
- `patience: N` stops when the `primary` metric (default: the first condition's, its
  direction from the op) has had N evaluations in a row without beating its best by more
  than `min_delta`.
- When the budget is exhausted and nothing stopped the stage, `on_budget_exhausted:
  continue` stops it and hands on the last checkpoint (`held` false), `fail` fails it.
Order of precedence: guard fail > rule held > plateau > budget > continue.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.eval.metric_names import BOUND_ENDS

History = list[tuple[int, int, float]]
"""(step, tokens_seen, value) per evaluation, oldest first."""
Histories = dict[str, History]

Op = Literal[">", ">=", "<", "<=", "=="]
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}
BOUND_SUFFIX = dict(zip(("lower", "upper"), BOUND_ENDS))
"""Where a rate's interval bounds are logged: `<metric>_low`, `<metric>_high`."""



class Condition(StrictConfig):
    """`metric op value`, e.g. eval/world_arithmetic/exact_match >= 0.3."""

    metric: str
    """MLflow metric name, e.g. eval/world_arithmetic/exact_match."""
    op: Op
    """Comparison: >, >=, <, <=, ==."""
    value: float
    """The threshold, or with `relative` the offset added to the metric's start value."""
    relative: bool = False
    """Compare against start + value (start: the first value in the stage's history)."""
    bound: Literal["lower", "upper"] | None = None
    """Compare an end of the metric's 95% interval instead of its value: `lower` holds only on evidence
    that the rate is above the bar, `upper` fails only on evidence that it is below. Held-out rates
    scored per item log theirs next to them (`<metric>_low`, `<metric>_high`: eval/intervals.py), so
    a bar on a bound does not flap with one answer on a small dev set."""

    @property
    def series(self) -> str:
        """The logged metric the condition reads: the metric, or its interval's bound."""
        return self.metric + BOUND_SUFFIX[self.bound] if self.bound else self.metric


class Guard(StrictConfig):
    """A benchmark that must not fall by more than max_drop while the stage trains."""

    metric: str
    """MLflow metric name of the guarded benchmark."""
    max_drop: float = Field(ge=0)
    """Largest allowed drop (absolute, in the metric's units) from the baseline."""
    baseline: Literal["start", "best"] = "start"
    """Drop measured from the stage's first value (start) or from the best value so far (best)."""
    higher_is_better: bool = True
    """False for losses: then a rise counts as the drop."""
    on_violation: Literal["fail", "continue"] = "fail"
    """fail: the stage fails with the evidence; continue: the rule cannot hold while violated."""


class GateRule(StrictConfig):
    """When a stage has trained enough: the part of a gate `stagewise cutoffs` re-checks."""

    all: list[Condition] = Field(default_factory=list)
    """Conditions that must all hold."""
    any: list[Condition] = Field(default_factory=list)
    """Conditions of which at least one must hold (ignored when empty)."""
    guards: list[Guard] = Field(default_factory=list)
    """Other benchmarks that must not fall."""
    min_tokens: int = Field(0, ge=0)
    """No stop (rule or plateau) before this many tokens of the stage."""
    patience: int | None = Field(None, ge=1)
    """Stop after this many evaluations without a new best of the primary metric (None: off)."""
    primary: str | None = None
    """The metric patience watches; default the first condition's metric."""
    higher_is_better: bool | None = None
    """Direction of the primary metric; default from its condition's op (>, >= up; <, <= down)."""
    min_delta: float = Field(0.0, ge=0)
    """An evaluation beats the best only by more than this."""

    @model_validator(mode="after")
    def _checks(self) -> "GateRule":
        if not (self.all or self.any or self.patience):
            raise ValueError("a gate needs at least one condition in `all`/`any`, or `patience`")
        if self.patience and self.primary is None and not (self.all or self.any):
            raise ValueError("patience needs a `primary` metric when there are no conditions")
        if self.patience and self.higher_is_better is None and self.primary_direction() is None:
            raise ValueError(f"patience: set `higher_is_better` for {self.primary_metric()!r} "
                             "(no >, >=, <, <= condition on it tells its direction)")
        return self

    def conditions(self) -> list[tuple[str, Condition]]:
        return [("all", c) for c in self.all] + [("any", c) for c in self.any]

    def primary_metric(self) -> str | None:
        conds = self.conditions()
        return self.primary or (conds[0][1].metric if conds else None)

    def primary_direction(self) -> bool | None:
        """True when higher is better for the primary metric, None when it cannot be told."""
        if self.higher_is_better is not None:
            return self.higher_is_better
        ops = [c.op for _, c in self.conditions() if c.metric == self.primary_metric()]
        return {">": True, ">=": True, "<": False, "<=": False}.get(ops[0]) if ops else None

    def reads_start(self) -> bool:
        """Whether a decision can depend on the stage's start value: a relative condition, a guard
        (its baseline is the start, or the best including it) or patience (the start is an
        evaluation of the run). A gate of absolute conditions alone does not need the start scored."""
        return bool(self.guards or self.patience or any(c.relative for _, c in self.conditions()))

    def metrics(self) -> list[str]:
        """Every metric the rule reads, in rule order, without repeats."""
        names = [c.series for _, c in self.conditions()] + [g.metric for g in self.guards]
        names += [self.primary_metric()] if self.patience and self.primary_metric() else []
        return list(dict.fromkeys(names))


class GateConfig(GateRule):
    """A stage's gate: the rule, how often to evaluate, and what to do if it never holds."""

    eval_every_tokens: int = Field(gt=0)
    """Train this many tokens between evaluations."""
    suite: str | None = None
    """The recipe's eval suite run at each evaluation besides the stage's own (validation loss in
    pretraining, the held-out conversations' dev split in SFT); its metrics are logged as
    eval/<task>/<metric>. None: the stage's own evaluation only."""
    on_budget_exhausted: Literal["continue", "fail"] = "continue"
    """When the stage's tokens run out and the rule never held: hand on the last checkpoint, or fail."""
    eval_limit: int | None = Field(40, gt=0)
    """Items per task at each evaluation (None: all); bounds the cost of evaluating often."""
    review: Literal["never", "undecided", "always"] = "never"
    """Whether a person decides instead of the gate alone (flows/gate_review.py): `undecided` when the
    budget ran out and the rule never held, `always` at every stop or fail the gate proposes. The flow
    run pauses in Prefect with the gate's evidence and a form: approve, stop, or extend the budget."""
    review_timeout_s: float = Field(3600.0, gt=0)
    """How long a paused gate waits for a person; then the gate's own decision stands ("timeout")."""

    def asks_person(self, decision: dict) -> bool:
        """Whether this decision (GateDecision.to_dict) waits for a person before it takes effect."""
        if self.review == "always":
            return decision["action"] in ("stop", "fail")
        return self.review == "undecided" and bool(decision.get("undecided"))


class UnknownMetricError(ValueError):
    """A rule names a metric the histories do not have."""


@dataclass(frozen=True)
class GateDecision:
    """What the gate answers, with the numbers it compared."""

    action: Literal["continue", "stop", "fail"]
    reason: str
    evidence: dict[str, Any] = field(repr=False)
    step: int | None
    tokens_seen: int
    held: bool = False
    """True when the stage stops because the rule held (not on plateau or budget)."""
    undecided: bool = False
    """True when the budget ran out and the rule never held: the evidence decided nothing (what
    `review: undecided` hands to a person)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_metrics(rule: GateRule, available: Iterable[str]) -> None:
    """UnknownMetricError for the first rule metric not available, the available names nearest first.

    `available` is a histories dict or any list of names (e.g. `Tracker.metric_names(run_id)`,
    so a caller that fetches only the rule's histories can still name what exists).
    """
    names = list(available)
    for name in rule.metrics():
        if name not in names:
            ranked = sorted(names, key=lambda k: -difflib.SequenceMatcher(None, name, k).ratio())
            shown = ", ".join(ranked[:12]) + (" ..." if len(ranked) > 12 else "")
            raise UnknownMetricError(f"gate metric {name!r} is not logged; nearest: {shown or '(no metrics at all)'}")


def _as_of(history: History, step: float) -> tuple[int, int, float] | None:
    """The latest entry at or before `step`."""
    found = None
    for entry in history:
        if entry[0] > step:
            break
        found = entry
    return found


def _eval_steps(rule: GateRule, histories: Histories) -> list[tuple[int, int]]:
    """(step, tokens) of every evaluation of the rule's metrics, in order."""
    seen: dict[int, int] = {}
    for name in rule.metrics():
        for step, tokens, _ in histories[name]:
            seen.setdefault(step, tokens)
    return sorted(seen.items())


def _condition(group: str, c: Condition, histories: Histories, step: float) -> dict[str, Any]:
    hist = histories[c.series]
    now = _as_of(hist, step)
    start = hist[0][2] if hist else None
    threshold = (start + c.value) if (c.relative and start is not None) else c.value
    holds = now is not None and (not c.relative or start is not None) and _OPS[c.op](now[2], threshold)
    return {"group": group, "metric": c.series, "bound": c.bound, "op": c.op, "value": c.value, "relative": c.relative,
            "start": start, "threshold": threshold, "current": now[2] if now else None,
            "step": now[0] if now else None, "tokens_seen": now[1] if now else None, "holds": bool(holds)}


def _guard(g: Guard, histories: Histories, step: float) -> dict[str, Any]:
    past = [e for e in histories[g.metric] if e[0] <= step]
    ev: dict[str, Any] = {"metric": g.metric, "max_drop": g.max_drop, "baseline": g.baseline,
                          "on_violation": g.on_violation, "violated": False}
    if not past:
        return {**ev, "reference": None, "current": None, "drop": None, "step": None, "tokens_seen": None}
    sign = 1.0 if g.higher_is_better else -1.0
    values = [v for _, _, v in past]
    reference = values[0] if g.baseline == "start" else max(values, key=lambda v: sign * v)
    drop = sign * (reference - values[-1])
    return {**ev, "reference": reference, "current": values[-1], "drop": drop, "violated": drop > g.max_drop,
            "step": past[-1][0], "tokens_seen": past[-1][1]}


def _plateau(rule: GateRule, histories: Histories, step: float) -> dict[str, Any] | None:
    if not rule.patience:
        return None
    name, up = rule.primary_metric(), rule.primary_direction()
    sign = 1.0 if up else -1.0
    past = [e for e in histories[name] if e[0] <= step]
    best_i = None
    for i, (_, _, v) in enumerate(past):
        if best_i is None or sign * (v - past[best_i][2]) > rule.min_delta:
            best_i = i
    since = len(past) - 1 - best_i if best_i is not None else 0
    return {"metric": name, "patience": rule.patience, "higher_is_better": up, "min_delta": rule.min_delta,
            "best": past[best_i][2] if best_i is not None else None, "best_step": past[best_i][0] if best_i is not None else None,
            "evals_since_best": since, "plateaued": since >= rule.patience}


def _evaluate(rule: GateRule, histories: Histories, step: int | None, tokens: int) -> dict[str, Any]:
    """Every comparison of the rule at one evaluation step (None: before any): the evidence a decision cites."""
    at = step if step is not None else float("-inf")
    conds = [_condition(g, c, histories, at) for g, c in rule.conditions()]
    guards = [_guard(g, histories, at) for g in rule.guards]
    all_ok = all(c["holds"] for c in conds if c["group"] == "all")
    any_ok = not rule.any or any(c["holds"] for c in conds if c["group"] == "any")
    blocked = [g["metric"] for g in guards if g["violated"] and g["on_violation"] == "continue"]
    has_conditions = bool(conds)
    return {"step": step, "tokens_seen": tokens, "conditions": conds, "guards": guards,
            "min_tokens": {"required": rule.min_tokens, "met": tokens >= rule.min_tokens},
            "plateau": _plateau(rule, histories, at), "blocked_by": blocked,
            "rule_holds": has_conditions and all_ok and any_ok and not blocked}


def first_hold(rule: GateRule, histories: Histories) -> tuple[int, int, dict[str, float]] | None:
    """(step, tokens_seen, {metric: value}) of the first evaluation where the rule held, or None.

    "Held" is what `decide` stops on: the conditions, min_tokens, and no guard blocking
    (a guard that would fail the stage there also counts as not held). Plateaus do not count.
    """
    check_metrics(rule, histories)
    hist = {k: sorted(histories[k]) for k in rule.metrics()}
    for step, tokens in _eval_steps(rule, hist):
        ev = _evaluate(rule, hist, step, tokens)
        failed = any(g["violated"] and g["on_violation"] == "fail" for g in ev["guards"])
        if ev["rule_holds"] and ev["min_tokens"]["met"] and not failed:
            values = {c["metric"]: c["current"] for c in ev["conditions"]}
            values.update({g["metric"]: g["current"] for g in ev["guards"]})
            return step, tokens, values
    return None


def _describe(c: dict[str, Any]) -> str:
    rel = f" (start {c['start']:.4g} {c['value']:+.4g})" if c["relative"] and c["start"] is not None else ""
    cur = "no value" if c["current"] is None else f"{c['current']:.4g}"
    return f"{c['metric']} = {cur} {c['op']} {c['threshold']:.4g}{rel}"


def decide(gate: GateRule, histories: Histories, *, tokens_seen: int, budget_exhausted: bool) -> GateDecision:
    """continue / stop / fail for the latest evaluation in `histories`, with the evidence.

    `tokens_seen` is the stage's token count now (min_tokens compares it); the decision's
    step is the latest evaluation step of the rule's metrics.
    """
    check_metrics(gate, histories)
    hist = {k: sorted(histories[k]) for k in gate.metrics()}
    steps = _eval_steps(gate, hist)
    step = steps[-1][0] if steps else None
    ev = _evaluate(gate, hist, step, tokens_seen)
    ev["min_tokens"]["tokens_seen"] = tokens_seen
    ev["budget_exhausted"] = budget_exhausted

    def out(action: str, reason: str, held: bool = False, undecided: bool = False) -> GateDecision:
        return GateDecision(action, reason, ev, step, tokens_seen, held, undecided)  # type: ignore[arg-type]

    failed = [g for g in ev["guards"] if g["violated"] and g["on_violation"] == "fail"]
    if failed:
        g = failed[0]
        return out("fail", f"guard {g['metric']} dropped {g['drop']:.4g} from its {g['baseline']} value "
                           f"{g['reference']:.4g} (max_drop {g['max_drop']:.4g})")
    held_text = "; ".join(_describe(c) for c in ev["conditions"] if c["holds"])
    if ev["rule_holds"] and ev["min_tokens"]["met"]:
        return out("stop", f"rule held at step {step}: {held_text}", held=True)
    plateau = ev["plateau"]
    if plateau and plateau["plateaued"] and ev["min_tokens"]["met"]:
        return out("stop", f"plateau: {plateau['metric']} has not beaten its best {plateau['best']:.4g} "
                           f"(step {plateau['best_step']}) for {plateau['evals_since_best']} evaluations")
    open_text = "; ".join(_describe(c) for c in ev["conditions"] if not c["holds"]) or "conditions hold"
    if ev["rule_holds"]:
        open_text = f"min_tokens {gate.min_tokens} not reached ({tokens_seen} tokens)"
    elif ev["blocked_by"]:
        open_text += f"; blocked by guard(s) {', '.join(ev['blocked_by'])}"
    elif not ev["conditions"]:
        open_text = "no plateau yet"
    if budget_exhausted:
        if getattr(gate, "on_budget_exhausted", "continue") == "fail":
            return out("fail", f"budget exhausted at {tokens_seen} tokens and the rule never held: {open_text}",
                       undecided=True)
        return out("stop", f"budget exhausted at {tokens_seen} tokens, rule not held ({open_text}); handing on the last checkpoint",
                   undecided=True)
    if not steps:
        return out("continue", "no evaluations yet")
    return out("continue", f"not yet: {open_text}")
