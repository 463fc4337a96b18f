"""Every report chart rendered from fixed metrics: each kind of metric on its own axis, rates on 0-1, none empty.

Set STAGEWISE_CHART_DIR to keep the rendered PNGs for a look (else they go to pytest's tmp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import Collection
from matplotlib.patches import Rectangle

from stagewise.eval.plots import (
    before_after_plot,
    cutoff_plot,
    loss_curves,
    merge_curves,
    metric_kind,
    reject_reasons_plot,
    stage_summary_plot,
)

DOMAINS = ("arithmetic", "format", "lookup", "recall", "sorting")
H = "eval/sft_test/"
# What SFT reported on the demo (README): counts of thousands beside rates of a few hundredths.
BASE = {H + "answered": 382.0, H + "exact_match": 0.0, **{f"{H}exact_match_{d}": 0.0 for d in DOMAINS},
        H + "format_match": 0.0, **{f"{H}format_match_{d}": 0.0 for d in DOMAINS}, H + "loss": 5.46,
        H + "supervised_tokens": 18800.0, "eval/world_compare_mc/acc": 0.5, "eval/world_compare_mc/acc_norm": 0.48}
FINAL = {**BASE, H + "exact_match": 0.055, H + "exact_match_arithmetic": 0.18, H + "exact_match_format": 0.06,
         H + "format_match": 0.72, H + "format_match_arithmetic": 0.9, H + "format_match_lookup": 0.8,
         H + "format_match_recall": 0.5, H + "format_match_sorting": 0.61, H + "format_match_format": 0.4,
         H + "loss": 1.02, "eval/world_compare_mc/acc": 0.46, "eval/world_compare_mc/acc_norm": 0.52}
RATES = {k for k in BASE if "match" in k or "/acc" in k}
COUNTS = {H + "answered", H + "supervised_tokens"}
ROWS = [
    {"stage": "pretrain", "metric": "eval/validation/loss", "before": 8.3, "after": 2.99, "higher_is_better": False,
     "tokens": 1_200_000, "seconds": 410.0},
    {"stage": "merge", "metric": "merge/handed_on_loss", "before": 2.962, "after": 2.884, "higher_is_better": False,
     "tokens": 0, "seconds": 35.0},
    {"stage": "long_context", "metric": "eval/loss/2048", "before": 3.1, "after": 3.077, "higher_is_better": False,
     "tokens": 300_000, "seconds": 160.0},
    {"stage": "sft", "metric": "eval/sft_test/exact_match", "before": 0.0, "after": 0.055,
     "higher_is_better": True, "tokens": 90_000, "seconds": 140.0},
]


@pytest.fixture
def save(tmp_path):
    out = Path(os.environ.get("STAGEWISE_CHART_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)

    def _save(fig, name: str) -> Path:
        path = out / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        assert path.stat().st_size > 5000
        return path

    return _save


def values(ax: Axes, axis: str) -> list[float]:
    """Every data value plotted on `ax` along `axis` ("x" or "y"): lines, bars and scatter points."""
    out: list[float] = []
    for line in ax.get_lines():
        if line.get_transform() == ax.transData:  # reference lines (axhline) live in axes coordinates
            out += [float(v) for v in (line.get_xdata() if axis == "x" else line.get_ydata())]
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            out += [patch.get_width() if axis == "x" else patch.get_height()]
    for coll in ax.collections:
        if isinstance(coll, Collection) and len(coll.get_offsets()):
            out += [float(p[0 if axis == "x" else 1]) for p in coll.get_offsets()]
    return out


def drawn(fig) -> list[Axes]:
    axes = [ax for ax in fig.axes if ax.axison]
    assert axes, "a chart with no axes"
    for ax in axes:
        assert values(ax, "x") and values(ax, "y"), f"empty panel {ax.get_title()!r}"
    return axes


def names_on(ax: Axes) -> set[str]:
    return {t.get_text() for t in ax.get_yticklabels() if t.get_text()}


def test_metric_kinds():
    assert {metric_kind(k) for k in RATES} == {"rate"}
    assert {metric_kind(k) for k in COUNTS} == {"count"}
    assert metric_kind(H + "loss") == metric_kind("eval/loss/2048") == metric_kind("merge/handed_on_loss") == "loss"
    assert metric_kind("eval/gsm8k/exact_match/strict-match") == "rate"
    assert metric_kind("sft/sft_test/exact_match_delta", -0.2) == "score"  # a delta may leave [0, 1]
    assert metric_kind("train/lr") == "score"


def test_before_after_puts_rates_losses_and_counts_on_separate_axes(save):
    fig = before_after_plot(BASE, FINAL, "SFT: base vs fine-tuned")
    axes = drawn(fig)
    assert len(axes) == 3
    by_label = {ax.get_xlabel(): ax for ax in axes}
    rates, losses, counts = (by_label[k] for k in ("rate (0 = none, 1 = all)", "loss (nats/token)", "count"))
    assert rates.get_xlim() == (0.0, 1.0)
    assert all(0.0 <= v <= 1.0 for v in values(rates, "x"))
    assert names_on(counts) == {"answered", "supervised_tokens"}  # the shared task name is in the panel title
    assert counts.get_title(loc="left") == "counts (not scores) - sft_test"
    assert max(values(counts, "x")) == 18800.0 and max(values(rates, "x")) < 1.0
    assert 18800.0 not in values(rates, "x") and 18800.0 not in values(losses, "x")
    assert sorted(set(values(losses, "x"))) == [1.02, 5.46]
    assert len(names_on(rates)) == len(RATES)
    # 9 held-out rates and acc_norm went up; acc went down; three stayed at 0
    assert fig._suptitle.get_text() == "SFT: base vs fine-tuned: 10 of 14 rates improved, loss fell"
    save(fig, "sft_before_after")


def test_stage_summary_gives_each_stage_its_own_axis_and_keeps_costs_apart(save):
    fig = stage_summary_plot(ROWS)
    axes = drawn(fig)
    stages = {ax.get_title().split("\n")[0]: ax for ax in axes if ax.get_title().count("\n") == 2}
    assert set(stages) == {"pretrain", "merge", "long_context", "sft"}
    assert stages["sft"].get_ylim() == (0.0, 1.0)
    assert sorted(values(stages["pretrain"], "y")) == [2.99, 8.3]
    for ax in stages.values():
        assert max(values(ax, "y")) < 10  # no token count or wall time on a metric's axis
    costs = {ax.get_xlabel(): ax for ax in axes if ax not in stages.values()}
    assert sorted(values(costs["tokens trained"], "x")) == [0, 90_000, 300_000, 1_200_000]
    assert sorted(values(costs["wall time (s)"], "x")) == [35.0, 140.0, 160.0, 410.0]
    assert "4 of 4 stages" in fig._suptitle.get_text()
    save(fig, "closing_table")


def test_stage_summary_with_no_metric_still_shows_costs(save):
    fig = stage_summary_plot([{**ROWS[0], "before": None, "after": None}])
    assert [ax.get_xlabel() for ax in drawn(fig)] == ["tokens trained", "wall time (s)"]
    save(fig, "closing_table_no_metric")


def test_loss_curves_keep_loss_and_learning_rate_apart(save):
    steps = range(0, 11)
    series = {"tokens_seen": [(s, s * 1000) for s in steps], "train/lm_loss": [(s, 8.0 - 0.5 * s) for s in steps],
              "eval/validation/loss": [(0, 8.3), (5, 5.0), (10, 2.99)], "train/lr": [(s, 1e-3 * s / 10) for s in steps]}
    fig = loss_curves(series, 5.85, "pretraining")
    loss_ax, lr_ax = drawn(fig)
    assert loss_ax.get_ylabel() == "loss (nats/token)" and lr_ax.get_ylabel() == "learning rate"
    assert max(values(lr_ax, "y")) <= 1e-3 and min(values(loss_ax, "y")) >= 2.99
    assert loss_ax.get_title() == "pretraining: validation loss 8.3 → 2.99"
    save(fig, "pretrain_loss")


def test_cutoff_plot_puts_a_rate_rule_on_0_1(save):
    runs = {"run a": {"eval/world_lookup/exact_match": [(1, 1000, 0.1), (2, 2000, 0.4)],
                      "train/lm_loss": [(1, 1000, 4.0), (2, 2000, 3.0)]},
            "run b": {"eval/world_lookup/exact_match": [(1, 1000, 0.0), (2, 2000, 0.2)],
                      "train/lm_loss": [(1, 1000, 4.5), (2, 2000, 3.5)]}}
    fig = cutoff_plot(runs, ["eval/world_lookup/exact_match", "train/lm_loss"], {"run a": 2000, "run b": None},
                      {"train/lm_loss": [3.2]})
    rate_ax, loss_ax = drawn(fig)
    assert rate_ax.get_ylim() == (0.0, 1.0) and min(values(loss_ax, "y")) >= 3.0
    save(fig, "cutoffs")


def test_reject_reasons_and_merge_curves_render(save):
    fig = reject_reasons_plot({"world": {"too_long": 12, "duplicate": 40}}, {"world": 900})
    (ax,) = drawn(fig)
    assert sorted(values(ax, "x")) == [12, 40, 900]
    assert "kept 900 of 952" in ax.get_title()
    save(fig, "sft_curation")
    fig = merge_curves({"merge/trained/loss": [(1, 1000, 3.2), (2, 2000, 2.962)],
                        "merge/98304/loss": [(1, 1000, 3.1), (2, 2000, 2.884)]})
    (ax,) = drawn(fig)
    assert ax.get_title() == "checkpoint merging: best merge 2.88 beats trained 2.96 at the last checkpoint"
    save(fig, "merge_vs_trained")


def test_distill_plot_shows_the_gap_each_domain_closed(save):
    from stagewise.eval.plots import distill_plot

    kl = {"arithmetic": [(1, 0.9), (2, 0.5)], "format": [(1, 1.2), (2, 0.8)]}
    fig = distill_plot(kl, {"arithmetic": 0.1, "format": 0.05}, {"arithmetic": 0.16, "format": 0.07},
                       {"arithmetic": 0.2, "format": 0.15})
    kl_ax, pass_ax = fig.axes
    assert [line.get_label() for line in kl_ax.get_lines()] == ["arithmetic", "format"]
    assert "gain kept: 60%, 20%" in pass_ax.get_title()  # (0.16-0.1)/(0.2-0.1), (0.07-0.05)/(0.15-0.05)
    assert len(pass_ax.patches) == 6  # start, teacher, distilled for each domain
    save(fig, "distill")
