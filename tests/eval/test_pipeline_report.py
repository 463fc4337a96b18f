"""The one-page pipeline report renders from fixed rows, curves, training signals and gates, as PNG and
self-contained HTML."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import matplotlib.pyplot as plt

from stagewise.eval.pipeline_report import SignalPanel, continued, pipeline_report, report_figure
from tests.eval.test_plots import ROWS  # the same closing table as the chart tests

# long context counts its tokens from its own start; the report continues it after pretraining
CURVES = {"pretrain": [(t * 100_000, 8.3 - 0.44 * t) for t in range(13)],
          "long_context": [(t * 50_000, 3.1 - 0.004 * t) for t in range(7)]}
GATES = [{"stage": "pretrain", "action": "continue", "reason": "eval/validation/loss 2.99 < 3.5", "tokens_seen": 1_200_000},
         {"stage": "long_context", "action": "stop", "reason": "loss/2048 plateaued <&> ", "tokens_seen": 300_000}]
# every other stage's training signal per step, as flows/closing_table.py `training_signals` reads them
SIGNALS = [
    SignalPanel("sft", "training loss per sub-stage", ("train/lm_loss",),
                {"general": [(s, 3.0 - 0.01 * s) for s in range(1, 61)],
                 "reasoning": [(s, 2.5 - 0.004 * s) for s in range(1, 41)]}),
    SignalPanel("rl", "reward (mean over rollouts)", ("rl/reward/total", "rl/reward/accuracy"),
                {"rl/reward/total": [(s, 0.2 + 0.02 * s) for s in range(1, 31)],
                 "rl/reward/accuracy": [(s, 0.1 + 0.015 * s) for s in range(1, 31)]}),
    SignalPanel("rl", "tokens masked by importance sampling", ("rl/is_masked_fraction",),
                {"rl/is_masked_fraction": [(1, 0.03), (2, 0.02), (3, 0.025)]}),
    SignalPanel("distill", "reverse KL to the teachers per round", ("distill/reverse_kl",),
                {"round-1": [(s, 0.9 - 0.02 * s) for s in range(1, 21)]}),
]


def test_curves_continue_on_one_token_axis():
    placed, starts, gates = continued(CURVES, GATES)
    assert starts == {"pretrain": 0, "long_context": 1_200_000}
    assert placed["long_context"][-1][0] == 1_500_000
    assert [g["tokens_seen"] for g in gates] == [1_200_000, 1_500_000]
    already = {"pretrain": CURVES["pretrain"], "long_context": [(t + 1_200_000, v) for t, v in CURVES["long_context"]]}
    assert continued(already, [])[0] == placed  # cumulative counts are kept as they are


def test_report_figure_panels():
    fig = report_figure(ROWS, CURVES, GATES)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "training loss across stages" in titles
    (curve_ax,) = [ax for ax in fig.axes if ax.get_title(loc="left") == "training loss across stages"]
    assert [line.get_label() for line in curve_ax.get_lines() if line.get_label() in CURVES] == list(CURVES)
    assert max(max(line.get_ydata()) for line in curve_ax.get_lines() if line.get_label() in CURVES) <= 8.3
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "long_context at 300,000 tokens: stop" in texts  # the stage's own count
    assert "4 of 4 stages" in fig._suptitle.get_text()
    plt.close(fig)


def test_pipeline_report_writes_png_and_self_contained_html(tmp_path):
    out = Path(os.environ.get("STAGEWISE_CHART_DIR") or tmp_path)
    png, page = pipeline_report(ROWS, CURVES, GATES, out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text(encoding="utf-8")
    for row in ROWS:
        assert f"<td>{row['stage']}</td><td>{row['metric']}</td>" in text
    assert "<td>8.3</td><td>2.99</td><td>-5.31 better</td><td>1.2M</td><td>410</td>" in text
    assert "plateaued &lt;&amp;&gt;" in text  # escaped
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text).group(1)
    assert base64.b64decode(embedded) == png.read_bytes()
    assert not re.search(r'(src|href)="(?!data:)', text)  # nothing to fetch


def test_the_html_marks_a_reused_stage_and_shows_a_gains_interval_and_verdict(tmp_path):
    rows = [{**ROWS[0], "reused": True},
            {**ROWS[3], "gain_low": 0.02, "gain_high": 0.09, "items": 189, "verdict": "better"},
            {**ROWS[3], "stage": "rl", "gain_low": -0.01, "gain_high": 0.12, "items": 322,
             "verdict": "not distinguishable"}]
    text = pipeline_report(rows, CURVES, GATES, tmp_path)[1].read_text(encoding="utf-8")
    assert "<td>pretrain (reused)</td>" in text and "<td>410</td>" in text  # the time it cost when trained
    assert '<tr class="better"><td>sft</td>' in text and "<td>+0.055 [+0.02, +0.09] better</td>" in text
    assert '<tr class=""><td>rl</td>' in text and "<td>+0.055 [-0.01, +0.12] not distinguishable</td>" in text


def _axes(fig) -> dict[str, object]:
    return {ax.get_title(loc="left"): ax for ax in fig.axes if ax.get_title(loc="left")}


def test_each_stage_signal_gets_its_own_axes_with_the_history_drawn():
    fig = report_figure(ROWS, CURVES, GATES, SIGNALS)
    axes = _axes(fig)
    for panel in SIGNALS:
        ax = axes[f"{panel.stage}: {panel.title}"]  # a reader sees the stage and what is drawn
        drawn = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in ax.get_lines()}
        assert drawn == panel.lines, panel.title
        assert ax.get_xlabel() == "step"
        assert ax.get_legend() is not None
    assert axes["sft: training loss per sub-stage"].get_ylabel() == "train/lm_loss"  # one metric: its name
    assert axes["rl: reward (mean over rollouts)"].get_ylabel() == "rl/reward"  # several: what they share
    assert axes["rl: tokens masked by importance sampling"].get_ylim() == (0, 1.05)  # a rate keeps its 0-1 axis
    assert axes["training loss across stages"] is not None  # the token-axis panel stays
    plt.close(fig)


def test_a_stage_without_data_has_no_axes():
    bare = report_figure(ROWS, CURVES, GATES)
    empty = [SignalPanel("distill", "reverse KL to the teachers per round", ("distill/reverse_kl",), {"round-1": []}),
             SignalPanel("rl", "reward (mean over rollouts)", ("rl/reward/total",), {})]
    fig = report_figure(ROWS, CURVES, GATES, SIGNALS[:1] + empty)
    assert list(_axes(fig)) == list(_axes(bare)) + ["sft: training loss per sub-stage"]
    assert len(fig.axes) == len(bare.axes) + 1
    assert len(report_figure(ROWS, CURVES, GATES, empty).axes) == len(bare.axes)
    plt.close("all")


def test_a_flat_signal_with_a_reason_says_it_in_words(tmp_path):
    """RL's masked fraction is 0 at every step in a synchronous run: the panel says why instead of
    drawing a flat line; a flat line without a declared reason is still drawn, and one that moves is
    drawn whatever it declares."""
    why = "nothing to mask"
    flat = SignalPanel("rl", "tokens masked by importance sampling", ("rl/is_masked_fraction",),
                       {"rl/is_masked_fraction": [(s, 0.0) for s in range(1, 161)]}, when_flat=why)
    undeclared = SignalPanel("rl", "flat, no reason", ("rl/x",), {"rl/x": [(1, 0.0), (2, 0.0)]})
    moving = SignalPanel("rl", "moves", ("rl/y",), {"rl/y": [(1, 0.0), (2, 0.1)]}, when_flat=why)
    fig = report_figure(ROWS, CURVES, GATES, [flat, undeclared, moving])
    axes = _axes(fig)
    said = axes["rl: tokens masked by importance sampling"]
    assert not said.get_lines() and [t.get_text() for t in said.texts] == [
        "rl/is_masked_fraction = 0 at all 160 steps:\nnothing to mask"]
    assert len(axes["rl: flat, no reason"].get_lines()) == 1 and len(axes["rl: moves"].get_lines()) == 1
    plt.close(fig)
    _png, page = pipeline_report(ROWS, CURVES, GATES, tmp_path, [flat])
    assert "<li>rl: tokens masked by importance sampling (rl/is_masked_fraction = 0 at every step: nothing to mask)</li>" \
        in page.read_text(encoding="utf-8")


def test_the_html_names_every_chart_panel(tmp_path):
    _png, page = pipeline_report(ROWS, CURVES, GATES, tmp_path, SIGNALS[:3])
    text = page.read_text(encoding="utf-8")
    panels = re.search(r'<ul class="panels">(.*?)</ul>', text).group(1)
    assert re.findall(r"<li>(.*?)</li>", panels) == [
        "training loss across stages (pretrain, long_context; train/lm_loss over tokens seen)",
        "sft: training loss per sub-stage (train/lm_loss per step; lines: general, reasoning)",
        "rl: reward (mean over rollouts) (rl/reward/total, rl/reward/accuracy per step)",
        "rl: tokens masked by importance sampling (rl/is_masked_fraction per step)"]
    assert "distill" not in text  # no data, no panel, not named
    assert "sft: training loss per sub-stage" in re.search(r'<img alt="([^"]*)"', text).group(1)
    _png, bare = pipeline_report(ROWS, {}, GATES, tmp_path / "bare")
    assert "<li>no stage logged a training signal</li>" in bare.read_text(encoding="utf-8")
