"""Before -> after charts: a stage's evaluations (base vs trained) and the pipeline's closing table.

Both split what they show by kind (rates, losses, counts, other scores) into separate panels
and say in the title what improved, e.g. "SFT: base vs fine-tuned: 9 of 12 rates improved,
loss fell".
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from stagewise.eval.plots.kinds import metric_kind, moved, split_by_kind
from stagewise.eval.plots.marks import cost_bars, dumbbells, short_labels, slope

PANEL_TITLE = {"rate": "rates", "loss": "losses", "count": "counts (not scores)", "score": "other scores"}


def verdict_phrase(groups: dict[str, list[str]], base: dict[str, float], final: dict[str, float]) -> str:
    """"9 of 12 rates improved, loss fell": what a reader wants from the title."""
    bits = []
    for kind, noun, good in (("rate", "rates", "improved"), ("loss", "losses", "fell")):
        names = groups.get(kind, [])
        if not names:
            continue
        wins = sum(moved(base.get(n), final[n], kind == "rate") > 0 for n in names)
        if len(names) == 1:
            bits.append(f"{'loss' if kind == 'loss' else 'rate'} {good if wins else 'did not ' + ('improve' if kind == 'rate' else 'fall')}")
        else:
            bits.append(f"{wins} of {len(names)} {noun} {good}")
    return ", ".join(bits)


def before_after_plot(base: dict[str, float], final: dict[str, float], title: str = ""):
    """Every metric both dicts hold as a before -> after dumbbell, one panel per kind of metric.

    Rates share a 0-1 axis, losses have their own, counts (supervised tokens, answered
    conversations) sit apart so they never set the scale of a score."""
    names = [k for k in base if k in final] or list(final)
    groups = split_by_kind(names, base, final)
    if not groups:
        fig, ax = plt.subplots(figsize=(8, 1.6), dpi=110)
        ax.text(0.5, 0.5, "no metric to compare", ha="center", va="center")
        ax.set_axis_off()
        return fig
    heights = [len(v) + 1.2 for v in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 0.3 * sum(heights) + 1.0), dpi=110, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (kind, group) in zip(axes[:, 0], groups.items()):
        labels, common = short_labels(group)
        dumbbells(ax, labels, [base.get(n) for n in group], [final[n] for n in group], kind)
        ax.set_title(f"{PANEL_TITLE[kind]}{' - ' + common if common else ''}", fontsize=9, loc="left")
    verdict = verdict_phrase(groups, base, final)
    head = title or "before -> after"
    fig.suptitle(f"{head}: {verdict}" if verdict else head, fontsize=10)
    fig.tight_layout()
    return fig


def stage_panels(axes: list[Axes], rows: list[dict]) -> int:
    """One slope per stage (its target metric before -> after) on the given axes; returns how many improved."""
    wins = 0
    for ax, row in zip(axes, rows):
        kind = metric_kind(row["metric"], row.get("before"), row.get("after"))
        verdict = slope(ax, row.get("before"), row["after"], kind, row.get("higher_is_better"))
        wins += verdict > 0
        arrow = "higher is better" if row.get("higher_is_better") else "lower is better"
        ax.set_title(f"{row['stage']}\n{row['metric'].removeprefix('eval/')}\n({arrow})", fontsize=8)
    return wins


def cost_panels(ax_tokens: Axes, ax_seconds: Axes, rows: list[dict]) -> None:
    """Tokens and wall time per stage, each on its own axis (a reused stage's: what it cost when trained,
    marked `(reused)`)."""
    stages = [r["stage"] + (" (reused)" if r.get("reused") else "") for r in rows]
    cost_bars(ax_tokens, stages, [r.get("tokens") for r in rows], "tokens trained")
    ax_tokens.set_title("what each stage cost: tokens", fontsize=9, loc="left")
    cost_bars(ax_seconds, stages, [r.get("seconds") for r in rows], "wall time (s)")
    ax_seconds.set_title("wall time", fontsize=9, loc="left")


def summary_title(rows: list[dict], wins: int) -> str:
    shown = [r for r in rows if r.get("after") is not None]
    return f"what each stage bought: {wins} of {len(shown)} stages moved their target the right way"


def stage_summary_plot(rows: list[dict]):
    """The closing table as a picture: a slope per stage (target before -> after), then tokens and wall time.

    `rows` are the dicts of `stagewise run --json` (stage, metric, before, after,
    higher_is_better, tokens, seconds). A rate target gets a 0-1 axis; a loss its own."""
    columns = closing_columns(rows)
    fig = plt.figure(figsize=(max(2.6 * columns, 8), 3.4 + 0.35 * len(rows) + 1.2), dpi=110)
    grid = fig.add_gridspec(2, columns, height_ratios=[3.2, 0.35 * len(rows) + 1.0])
    wins = closing_panels(fig, grid, rows)
    fig.suptitle(summary_title(rows, wins), fontsize=10)
    fig.tight_layout()
    return fig


def closing_columns(rows: list[dict]) -> int:
    """Grid columns the closing table's panels need: one per stage with a metric, at least two."""
    return max(sum(r.get("after") is not None for r in rows), 2)


def closing_panels(fig, grid, rows: list[dict]) -> int:
    """The closing table on the first two rows of `grid` (closing_columns wide): a before -> after
    slope per stage, then tokens and wall time per stage; returns how many stages moved the right way."""
    shown = [r for r in rows if r.get("after") is not None]
    wins = 0
    if shown:
        wins = stage_panels([fig.add_subplot(grid[0, i]) for i in range(len(shown))], shown)
    else:
        ax = fig.add_subplot(grid[0, :])
        ax.text(0.5, 0.5, "no stage reported a metric", ha="center", va="center")
        ax.set_axis_off()
    if rows:
        half = closing_columns(rows) // 2
        cost_panels(fig.add_subplot(grid[1, :half]), fig.add_subplot(grid[1, half:]), rows)
    return wins
