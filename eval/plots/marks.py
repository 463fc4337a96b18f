"""Axes-level marks every chart is built from: before -> after dumbbells, slopes, cost bars, curves.

Each function draws on an Axes it is given and sets that Axes' value axis for one kind of
metric (rates 0-1, losses, counts), so a figure is a layout of these and no chart mixes
kinds. Colours carry the verdict: green moved the right way, red the wrong way, grey neither.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

from stagewise.eval.plots.kinds import AXIS_LABEL, HIGHER_IS_BETTER, Kind, moved

VERDICT_COLOUR = {1: "tab:green", -1: "tab:red", 0: "tab:grey"}
BEFORE_COLOUR = "#9a9a9a"


def fmt(value: float | None) -> str:
    """A number as a person reads it: 0.055, 2.99, 18,800, 1.2M."""
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3g}"


def short_labels(names: list[str]) -> tuple[list[str], str]:
    """Names without `eval/` and without a first part they all share (returned as the group's name)."""
    stripped = [n.removeprefix("eval/") for n in names]
    firsts = {s.split("/", 1)[0] for s in stripped}
    if len(firsts) == 1 and all("/" in s for s in stripped):
        return [s.split("/", 1)[1] for s in stripped], firsts.pop()
    return stripped, ""


def dumbbells(ax: Axes, labels: list[str], before: list[float | None], after: list[float], kind: Kind) -> int:
    """One row per metric: a grey dot (before), a line, a coloured dot (after); values printed at the right.

    Rates get a fixed 0-1 value axis so a move from 0 to 0.055 looks as small as it is. Returns
    how many rows moved the right way."""
    better = HIGHER_IS_BETTER[kind]
    wins = 0
    for y, (b, a) in enumerate(zip(before, after)):
        verdict = moved(b, a, better)
        wins += verdict > 0
        colour = VERDICT_COLOUR[verdict] if better is not None else "tab:blue"
        if b is not None:
            ax.plot([b, a], [y, y], "-", color=colour, linewidth=2, alpha=0.6, zorder=1)
            ax.plot([b], [y], "o", color=BEFORE_COLOUR, markersize=6, zorder=2)
        ax.plot([a], [y], "o", color=colour, markersize=7, zorder=3)
        text = f"{fmt(b)} → {fmt(a)}" if b is not None else fmt(a)
        ax.text(1.01, y, text, transform=ax.get_yaxis_transform(), va="center", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    if kind == "rate":
        ax.set_xlim(0.0, 1.0)
    elif kind == "count":
        ax.set_xlim(left=0.0)
    ax.set_xlabel(AXIS_LABEL[kind], fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    ax.tick_params(axis="x", labelsize=7)
    return wins


def slope(ax: Axes, before: float | None, after: float | None, kind: Kind, higher_is_better: bool | None) -> int:
    """A stage's target metric as a two-point slope, before (left) to after (right); returns the verdict."""
    verdict = moved(before, after, higher_is_better)
    colour = VERDICT_COLOUR[verdict]
    xs, ys = ([0, 1], [before, after]) if before is not None else ([1], [after])
    ax.plot(xs, ys, "o-", color=colour, linewidth=2.2, markersize=7)
    for x, y in zip(xs, ys):
        ax.annotate(fmt(y), (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    ax.set_xticks([0, 1], ["before", "after"], fontsize=8)
    ax.set_xlim(-0.4, 1.4)
    if kind == "rate":
        ax.set_ylim(0.0, 1.0)
    else:
        low, high = min(v for v in ys if v is not None), max(v for v in ys if v is not None)
        pad = (high - low) * 0.2 or abs(high) * 0.1 or 1.0
        ax.set_ylim(low - pad, high + pad)
    ax.set_ylabel(AXIS_LABEL[kind], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return verdict


def cost_bars(ax: Axes, stages: list[str], values: list[float | None], label: str) -> None:
    """One horizontal bar per stage (tokens, or wall seconds), value printed at the bar's end."""
    clean = [v or 0.0 for v in values]
    bars = ax.barh(range(len(stages)), clean, color="tab:blue", alpha=0.7)
    for bar, v in zip(bars, clean):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {fmt(v)}", va="center", fontsize=7)
    ax.set_yticks(range(len(stages)), stages, fontsize=8)
    ax.set_ylim(len(stages) - 0.5, -0.5)
    ax.set_xlim(0.0, max(clean + [1.0]) * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.set_xlabel(label, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
