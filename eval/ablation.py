"""An ablation's comparison: every variant's scores side by side, and which variant won.

A stage result carries its scores after training, the scores of its starting model under
`base/`, and before -> after deltas (`*_delta`). The comparison keeps the scores after
training that are scores (counts such as `answered` or `supervised_tokens` are not) and ranks
the variants on the stage's target metric on the dev split (flows/ablate.py hands only dev
scores: choosing between variants is tuning, and test is for the report), so "with vs without the
tool-use domain" reads as one table: a row per metric, a column per variant, the best of each row marked.

    table = compare({"with": {...}, "without": {...}}, target="eval/sft_dev/exact_match",
                    higher_is_better=True)
    print(render_text(table))
"""

from __future__ import annotations

from stagewise.eval.metric_names import BOUND_ENDS
from stagewise.eval.plots.kinds import HIGHER_IS_BETTER, metric_kind


def scores(metrics: dict[str, float]) -> dict[str, float]:
    """A result's own scores: not the starting model's (`base/`), not deltas, not interval bounds, not counts."""
    return {k: v for k, v in metrics.items()
            if not k.startswith("base/") and not k.endswith(("_delta", *BOUND_ENDS)) and "stderr" not in k
            and metric_kind(k, v) != "count" and k != "tokens_seen"}


def _best(values: dict[str, float], higher: bool | None) -> str | None:
    if higher is None or len(set(values.values())) < 2:
        return None
    return (max if higher else min)(values, key=values.get)


def compare(by_variant: dict[str, dict[str, float]], target: str | None = None,
            higher_is_better: bool | None = None) -> dict:
    """{"variants", "target", "winner", "rows": [{metric, kind, values: {variant: v}, best}]} over the
    metrics every variant reports (the target first)."""
    kept = {v: scores(m) for v, m in by_variant.items()}
    common = sorted(set.intersection(*(set(m) for m in kept.values()))) if kept else []
    if target in common:
        common.remove(target)
        common.insert(0, target)
    rows = []
    for name in common:
        values = {v: kept[v][name] for v in kept}
        kind = metric_kind(name, *values.values())
        higher = higher_is_better if name == target else HIGHER_IS_BETTER[kind]
        rows.append({"metric": name, "kind": kind, "values": values, "best": _best(values, higher)})
    winner = rows[0]["best"] if rows and rows[0]["metric"] == target else None
    return {"variants": list(by_variant), "target": target, "winner": winner, "rows": rows}


def render_text(table: dict) -> str:
    """The comparison as a fixed-width table; `*` marks the best variant of each row."""
    variants = table["variants"]
    width = max([len("metric"), *(len(r["metric"]) for r in table["rows"])])
    cols = [max(len(v), 9) for v in variants]
    lines = ["  ".join(["metric".ljust(width), *(v.rjust(c) for v, c in zip(variants, cols))])]
    for r in table["rows"]:
        cells = [(f"{r['values'][v]:.4g}" + ("*" if r["best"] == v else " ")).rjust(c) for v, c in zip(variants, cols)]
        lines.append("  ".join([r["metric"].ljust(width), *cells]))
    if table["target"]:
        verdict = f"best on {table['target']}: {table['winner']}" if table["winner"] else \
            f"no variant is better on {table['target']}"
        lines.append(verdict)
    return "\n".join(lines)
