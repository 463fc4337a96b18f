"""An ablation's chart: each metric's value per variant, one panel per kind of metric.

Rates share a 0-1 axis and losses get their own (eval/plots/kinds.py), so a variant's loss of
1.2 never flattens its exact match of 0.05. Bars are grouped by metric, one colour per variant,
and the title names the winner on the stage's target metric.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from stagewise.eval.plots.compare import PANEL_TITLE
from stagewise.eval.plots.kinds import AXIS_LABEL
from stagewise.eval.plots.marks import fmt, short_labels


def _shown(table: dict) -> tuple[dict[str, list[dict]], int]:
    """Rows to draw by kind: the target, and every metric on which the variants differ; how many were equal."""
    groups: dict[str, list[dict]] = {}
    equal = 0
    for r in table["rows"]:
        if r["metric"] != table.get("target") and len(set(r["values"].values())) < 2:
            equal += 1
            continue
        groups.setdefault(r["kind"], []).append(r)
    return groups, equal


def ablation_plot(table: dict, title: str = "ablation"):
    """`table` is eval.ablation.compare's result: a dot per variant on each metric's row, its value
    beside it (dots, not bars: a loss of 1.598 against 1.601 must stay visible)."""
    variants = table["variants"]
    groups, equal = _shown(table)
    if not groups:
        fig, ax = plt.subplots(figsize=(8, 1.6), dpi=110)
        ax.text(0.5, 0.5, "no metric every variant reports" if not equal else
                f"the variants scored the same on all {equal} metrics", ha="center", va="center")
        ax.set_axis_off()
        return fig
    heights = [0.32 * len(g) + 0.9 for g in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, sum(heights) + 0.9), dpi=110, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    colours = plt.get_cmap("tab10")
    for ax, (kind, group) in zip(axes[:, 0], groups.items()):
        labels, common = short_labels([r["metric"] for r in group])
        for j, v in enumerate(variants):
            xs = [r["values"][v] for r in group]
            ax.scatter(xs, range(len(group)), color=colours(j % 10), label=v, zorder=3, s=28)
        for i, r in enumerate(group):
            ax.axhline(i, color="#dddddd", lw=0.6, zorder=1)
            best = f"  best: {r['best']}" if r["best"] else ""
            ax.annotate(" / ".join(fmt(r["values"][v]) for v in variants) + best, (1.0, i), xycoords=("axes fraction", "data"),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_yticks(range(len(group)), labels, fontsize=7)
        ax.set_ylim(len(group) - 0.5, -0.5)
        if kind == "rate":
            ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel(AXIS_LABEL[kind], fontsize=8)
        ax.set_title(f"{PANEL_TITLE[kind]}{' - ' + common if common else ''}", fontsize=9, loc="left")
    axes[0, 0].legend(fontsize=8, loc="lower right", title=" / ".join(variants), title_fontsize=7)
    winner = f": best on {table['target']} is {table['winner']}" if table.get("winner") else ""
    note = f" ({equal} metrics equal across variants not drawn)" if equal else ""
    fig.suptitle(f"{title}{winner}{note}", fontsize=10)
    fig.tight_layout()
    return fig
