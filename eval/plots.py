"""Plots for stage reports (matplotlib, headless)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
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
        ax.set_ylabel(metric, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="best", fontsize=7)
    axes[0, 0].set_title(title or "rule metrics over tokens (dashed: first hold)")
    axes[-1, 0].set_xlabel("tokens seen")
    fig.tight_layout()
    return fig


def reject_reasons_plot(rejected: dict[str, dict[str, int]], kept: dict[str, int], title: str = ""):
    """Curation at a glance: per source, a horizontal bar of kept lines and one per reject reason.

    `rejected` maps a source to {reason: count}, `kept` a source to its kept count. Counts are
    printed on the bars, so the picture doubles as the table.
    """
    rows = [(src, "kept", kept.get(src, 0)) for src in kept]
    rows += [(src, reason, n) for src in rejected for reason, n in sorted(rejected[src].items())]
    rows.sort(key=lambda r: (r[0], r[1] != "kept", r[1]))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2), dpi=110)
    labels = [f"{src}: {reason}" for src, reason, _ in rows]
    counts = [n for _, _, n in rows]
    colours = ["tab:green" if reason == "kept" else "tab:red" for _, reason, _ in rows]
    bars = ax.barh(range(len(rows)), counts, color=colours, alpha=0.75)
    ax.set_xscale("symlog", linthresh=10)
    for bar, n in zip(bars, counts):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {n}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("conversations (log scale)")
    ax.set_title(title or "SFT curation: kept and rejected per source")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def before_after_plot(base: dict[str, float], final: dict[str, float], title: str = ""):
    """Paired bars per metric: the starting model's value and the fine-tuned one's, values printed."""
    names = [k for k in base if k in final]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2), dpi=110)
    ys = range(len(names))
    ax.barh([y - 0.2 for y in ys], [base[k] for k in names], height=0.4, color="tab:grey", label="base")
    ax.barh([y + 0.2 for y in ys], [final[k] for k in names], height=0.4, color="tab:blue", label="after")
    for y, k in zip(ys, names):
        ax.text(max(base[k], final[k]), y, f"  {base[k]:.3g} -> {final[k]:.3g}", va="center", fontsize=7)
    ax.set_yticks(list(ys), [k.removeprefix("eval/") for k in names], fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title or "before / after")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3, axis="x")
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
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("checkpoint merging vs the trained checkpoint")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def stage_summary_plot(rows: list[dict]):
    """The closing table as a picture: one panel per stage, its target metric before and after.

    A panel's "after" bar is green when the stage moved its metric the right way, red when it
    moved it the wrong way; the title gives the stage, tokens and wall time. `rows` are the
    dicts of `stagewise run --json` (stage, metric, before, after, higher_is_better, tokens, seconds)."""
    shown = [r for r in rows if r.get("after") is not None]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(3.2 * max(len(shown), 1), 3.4), dpi=110, squeeze=False)
    for ax, row in zip(axes[0], shown):
        before, after = row.get("before"), row["after"]
        better = before is None or (after >= before if row.get("higher_is_better") else after <= before)
        labels, values, colors = ["after"], [after], ["tab:green" if better else "tab:red"]
        if before is not None:
            labels, values, colors = ["before"] + labels, [before] + values, ["tab:grey"] + colors
        bars = ax.bar(labels, values, color=colors, width=0.6)
        for bar, v in zip(bars, values):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{v:.3g}", ha="center", va="bottom", fontsize=8)
        seconds = row.get("seconds")
        ax.set_title(f"{row['stage']}\n{row.get('tokens') or 0:,} tokens, {seconds or 0:.0f} s", fontsize=9)
        arrow = "higher is better" if row.get("higher_is_better") else "lower is better"
        ax.set_ylabel(f"{row['metric']}\n({arrow})", fontsize=7)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    if not shown:
        axes[0][0].text(0.5, 0.5, "no stage reported a metric", ha="center", va="center")
        axes[0][0].set_axis_off()
    fig.suptitle("what each stage bought", fontsize=10)
    fig.tight_layout()
    return fig
