"""Where would a gate have stopped? A rule replayed on finished runs' metric histories.

`stagewise cutoffs` reads every run of a stage back from MLflow and asks, per run, at which
evaluation the rule first held (`eval.gates.first_hold`), what the rule's metrics were
there, and how each guarded benchmark moved after that point: the evidence for choosing a
rule before a long run pays for it. Pure functions on histories; the CLI does the reading.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stagewise.data.errors import BadInput, read_utf8
from stagewise.eval.gates import GateConfig, GateRule, Histories, first_hold

# Keys a whole `gate:` block has beyond the rule; a rule file may be a pasted gate block.
_GATE_ONLY = set(GateConfig.model_fields) - set(GateRule.model_fields)


def _key_lines(node: Any, at: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """1-based line of every mapping key / list item of a composed YAML node, by path tuple."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            out[(*at, k.value)] = k.start_mark.line + 1
            _key_lines(v, (*at, k.value), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[(*at, i)] = v.start_mark.line + 1
            _key_lines(v, (*at, i), out)
    return out


def load_rule(path: str | Path) -> GateRule:
    """A GateRule from YAML (all/any/guards/min_tokens/patience...); gate-only keys are ignored.

    Raises BadInput (exit 2) naming the file, the line and the field of any problem: not
    readable, not UTF-8, not YAML, not a mapping, or a field pydantic refuses.
    """
    path = Path(path)
    text = read_utf8(path, "rule file")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if node is not None else {}
        lines = _key_lines(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(f"{where}: invalid YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise BadInput(f"{path}: invalid YAML: nested too deeply") from None
    data = {} if data is None else data
    prefix: tuple = ()
    if isinstance(data, dict) and set(data) == {"gate"}:
        data, prefix = data["gate"], ("gate",)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a rule file holds a mapping (all/any/guards/...), got {type(data).__name__}")
    try:
        return GateRule.model_validate({k: v for k, v in data.items() if k not in _GATE_ONLY})
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            loc = (*prefix, *err["loc"])
            while loc and loc not in lines:
                loc = loc[:-1]
            field = ".".join(str(t) for t in (*prefix, *err["loc"])) or "(rule)"
            problems.append(f"{field}: {err['msg']} ({path}:{lines.get(loc, 1)})")
        raise BadInput(problems, f"invalid rule file {path}:") from None


@dataclass(frozen=True)
class Cutoff:
    """The first evaluation at which the rule held."""

    step: int
    tokens_seen: int
    values: dict[str, float]


@dataclass(frozen=True)
class GuardMove:
    """A guarded metric from the cutoff to the end of the run."""

    metric: str
    at_cutoff: float | None
    final: float | None
    worst_after: float | None
    """The lowest value after the cutoff (the highest, for a lower-is-better guard)."""
    change: float | None
    """final - at_cutoff."""
    evaluations_after: int


@dataclass(frozen=True)
class RunCutoff:
    """One run: its cutoff (None when the rule never held) and its guards past it."""

    run_id: str
    run_name: str
    cutoff: Cutoff | None
    guards: list[GuardMove]
    last_step: int | None
    last_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def guard_moves(rule: GateRule, histories: Histories, cutoff: Cutoff | None) -> list[GuardMove]:
    """How each guard metric moved after the cutoff (from its start when there is no cutoff)."""
    moves = []
    for g in rule.guards:
        hist = sorted(histories.get(g.metric, []))
        if cutoff is None:
            before, after = hist[:1], hist[1:]
        else:
            before = [e for e in hist if e[0] <= cutoff.step]
            after = [e for e in hist if e[0] > cutoff.step]
        at = before[-1][2] if before else None
        pick = min if g.higher_is_better else max
        worst = pick(v for _, _, v in after) if after else None
        final = hist[-1][2] if hist else None
        change = final - at if (final is not None and at is not None) else None
        moves.append(GuardMove(g.metric, at, final, worst, change, len(after)))
    return moves


def run_cutoff(run_id: str, rule: GateRule, histories: Histories, run_name: str = "") -> RunCutoff:
    """The rule replayed on one run's histories (UnknownMetricError when a metric is missing)."""
    hold = first_hold(rule, histories)
    cutoff = Cutoff(*hold) if hold else None
    ends = [h[-1] for name in rule.metrics() if (h := sorted(histories.get(name, [])))]
    last = max(ends) if ends else None
    return RunCutoff(run_id, run_name, cutoff, guard_moves(rule, histories, cutoff),
                     last[0] if last else None, last[1] if last else None)
