"""Charts over tokens seen: a stage's loss curves, a gate rule's metrics, checkpoint merging.

Losses and the learning rate each have their own axis; a rule metric that is a rate gets a
0-1 axis. Titles say what changed (first -> last validation loss, best merge vs trained).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from stagewise.eval.plots.kinds import AXIS_LABEL, metric_kind
from stagewise.eval.plots.marks import fmt


def loss_curves(series: dict[str, list[tuple[int, float]]], baseline: float | None, title: str):
    """Train loss (and LR on a twin axis) and validation loss against tokens seen.

    `series` maps metric name -> [(step, value)]; `tokens_seen` maps steps to tokens.
    """
    tokens = dict(series.get("tokens_seen", []))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for key, label, style in (("train/lm_loss", "train loss", "-"), ("eval/validation/loss", "validation loss", "o-")):
        points = [(tokens.get(step, step), value) for step, value in series.get(key, [])]
        if points:
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, style, label=label, linewidth=1.2, markersize=4)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="unigram baseline")
    lr = [(tokens.get(step, step), value) for step, value in series.get("train/lr", [])]
    if lr:
        twin = ax.twinx()
        xs, ys = zip(*sorted(lr))
        twin.plot(xs, ys, color="tab:green", alpha=0.35, linewidth=1)
        twin.set_ylabel("learning rate", color="tab:green")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(AXIS_LABEL["loss"])
    validation = [v for _, v in sorted(series.get("eval/validation/loss", []))]
    change = f"validation loss {fmt(validation[0])} → {fmt(validation[-1])}" if len(validation) > 1 else ""
    ax.set_title(f"{title}: {change}" if title and change else title or change)
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def cutoff_plot(runs: dict[str, dict[str, list[tuple[int, int, float]]]], metrics: list[str],
                cutoffs: dict[str, int | None], thresholds: dict[str, list[float]] | None = None, title: str = ""):
    """The rule's metrics over tokens, one panel per metric and one line per run.

    `runs` maps a run label to its histories ({metric: [(step, tokens, value)]}), `cutoffs`
    the label to the tokens where the rule first held (a dashed line in the run's colour;
    None: never held), `thresholds` a metric to its absolute thresholds (dotted grey), so a
    reader sees both where each run crossed and how close the others came.
    """
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.6 * len(metrics) + 0.6), dpi=110, sharex=True,
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[:, 0], metrics):
        for i, (label, histories) in enumerate(runs.items()):
            colour = colours[i % len(colours)]
            points = sorted((tokens, value) for _, tokens, value in histories.get(metric, []))
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, "o-", color=colour, label=label, linewidth=1.2, markersize=3)
            if cutoffs.get(label) is not None:
                ax.axvline(cutoffs[label], color=colour, linestyle="--", linewidth=1)
        for value in (thresholds or {}).get(metric, []):
            ax.axhline(value, color="grey", linestyle=":", linewidth=1)
        values = [v for histories in runs.values() for _, _, v in histories.get(metric, [])]
        if metric_kind(metric, *values) == "rate":
            ax.set_ylim(0.0, 1.0)
        ax.set_ylabel(metric, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="best", fontsize=7)
    axes[0, 0].set_title(title or "rule metrics over tokens (dashed: first hold)")
    axes[-1, 0].set_xlabel("tokens seen")
    fig.tight_layout()
    return fig


def merge_curves(histories: dict[str, list[tuple[int, int, float]]]):
    """Validation loss of trained checkpoints and of each merge window, over tokens seen."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for key in sorted(histories, key=lambda k: (k != "merge/trained/loss", k)):
        points = sorted((tokens, value) for _, tokens, value in histories[key])
        if not points:
            continue
        xs, ys = zip(*points)
        label = "trained" if key == "merge/trained/loss" else f"merge, window {int(key.split('/')[1]):,} tokens"
        ax.plot(xs, ys, "o-" if label == "trained" else "s--", label=label, linewidth=1.2, markersize=4)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("validation " + AXIS_LABEL["loss"])
    ax.set_title(_merge_title(histories))
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _merge_title(histories: dict[str, list[tuple[int, int, float]]]) -> str:
    """"checkpoint merging: best merge 2.88 vs trained 2.96 at the last checkpoint"."""
    last = {key: max(points, key=lambda p: p[1])[2] for key, points in histories.items() if points}
    trained = last.pop("merge/trained/loss", None)
    if trained is None or not last:
        return "checkpoint merging vs the trained checkpoint"
    best = min(last.values())
    verdict = "beats" if best < trained else "does not beat"
    return f"checkpoint merging: best merge {fmt(best)} {verdict} trained {fmt(trained)} at the last checkpoint"
