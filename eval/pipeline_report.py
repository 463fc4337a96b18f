"""The one-page pipeline report: what each stage cost and bought, every stage's training signal, the gates.

    png, html = pipeline_report(rows, curves, gates, workdir / "reports", signals)

`rows` are the closing table's rows (stage, metric, before, after, higher_is_better, tokens,
seconds); `curves` maps a stage to its [(tokens_seen, loss)] in pipeline order (pretraining,
long context); `gates` are gate decisions ({stage, action, reason, tokens_seen}); `signals` are
SignalPanels, each one stage's training metrics per step on its own axes (SFT's loss per
sub-stage, RL's reward and masked-IS fraction, distillation's reverse KL per round). A stage's
curve may count tokens from its own start or from the start of the run: when its first point
lies before the previous stage's last one it is shifted to continue from there (a gate of that
stage moves with it), so long context follows pretraining on one token axis. A stage with no
points has no line, and a panel with no line is not drawn.

The PNG is one matplotlib figure, top to bottom: each stage's target before -> after, tokens
and wall time per stage, the loss across stages on one token axis, the training-signal panels,
the gate decisions. The HTML page holds the same content with no external resource (the table
as a table, the gates as a list, the list of chart panels, the PNG as a data URI), so it opens
from a file or an artifact store alike. This module is a library: plain data in, files out (no
MLflow, no Prefect; flows/closing_table.py reads the histories).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt

from stagewise.eval.intervals import describe_change
from stagewise.eval.plots.compare import closing_columns, closing_panels, summary_title
from stagewise.eval.plots.kinds import AXIS_LABEL, metric_kind
from stagewise.eval.plots.marks import fmt

ACTION_COLOUR = {"stop": "tab:red", "continue": "tab:green"}
CURVES_TITLE = "training loss across stages"
SIGNAL_ROW_HEIGHT = 2.9
"""Inches per row of training-signal panels."""
SIGNAL_PANEL_WIDTH = 4.5
"""Inches a training-signal panel needs at least: a row holds as many as the figure's width allows."""


@dataclass(frozen=True)
class SignalPanel:
    """One stage's training signal on its own axes: a line per metric (or per run) against the step."""

    stage: str
    title: str
    """What the panel shows, e.g. `reward (mean over rollouts)`; drawn as `<stage>: <title>`."""
    metrics: tuple[str, ...]
    """The metric names drawn (they label a one-metric panel's y axis and fix a rate's 0-1 axis)."""
    lines: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """label -> [(step, value), ...] oldest first: a metric's name, a sub-stage's or a round's."""
    when_flat: str | None = None
    """Why every line may be one constant (e.g. `sampler and trainer agree: nothing to mask`): then
    the panel says so in words instead of drawing a flat line."""

    def flat(self) -> float | None:
        """The one value every drawn point has, None when they differ (or nothing is drawn)."""
        values = {v for points in self.drawn().values() for _, v in points}
        return values.pop() if len(values) == 1 else None

    @property
    def heading(self) -> str:
        return f"{self.stage}: {self.title}"

    def drawn(self) -> dict[str, list[tuple[float, float]]]:
        """The lines with points."""
        return {label: points for label, points in self.lines.items() if points}


def continued(curves: dict[str, list[tuple[float, float]]],
              gates: list[dict]) -> tuple[dict[str, list[tuple[float, float]]], dict[str, float], list[dict]]:
    """Curves and gates on one token axis, and where each stage starts on it."""
    placed, starts, shift, end = {}, {}, {}, 0.0
    for stage, points in curves.items():
        points = sorted(points)
        if not points:
            continue
        shift[stage] = end if points[0][0] < end else 0.0
        placed[stage] = [(t + shift[stage], v) for t, v in points]
        starts[stage] = placed[stage][0][0]
        end = placed[stage][-1][0]
    moved_gates = [{**g, "tokens_seen": (g.get("tokens_seen") or 0) + shift.get(g.get("stage"), 0.0)} for g in gates]
    return placed, starts, moved_gates


def _curves_panel(ax, curves: dict[str, list[tuple[float, float]]], gates: list[dict]) -> None:
    placed, starts, placed_gates = continued(curves, gates)
    for stage, points in placed.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, "-", linewidth=1.4, label=stage)
    for stage, x in starts.items():
        ax.axvline(x, color="grey", linestyle="--", linewidth=1)
        ax.text(x, 1.0, f" {stage}", transform=ax.get_xaxis_transform(), va="bottom", fontsize=8)
    for gate in placed_gates:
        if gate.get("stage") in placed:
            ax.axvline(gate["tokens_seen"], color=ACTION_COLOUR.get(gate.get("action"), "tab:orange"), linewidth=1.5,
                       linestyle=":")
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: fmt(v)))
    ax.set_xlabel("tokens seen over the run (dashed: a stage starts, dotted: a gate decided)", fontsize=8)
    ax.set_ylabel(AXIS_LABEL["loss"], fontsize=8)
    ax.set_title(CURVES_TITLE, fontsize=9, loc="left", pad=14)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def _signal_panel(ax, panel: SignalPanel) -> None:
    """A stage's training metrics per step; rates on a fixed 0-1 axis. A panel whose every point is one
    value and that says why (`when_flat`) is that sentence instead of a flat line."""
    constant = panel.flat()
    if constant is not None and panel.when_flat:
        steps = max(len(points) for points in panel.drawn().values())
        ax.text(0.5, 0.5, f"{_common_name(panel.metrics)} = {constant:g} at all {steps} steps:\n{panel.when_flat}",
                ha="center", va="center", fontsize=8, wrap=True, transform=ax.transAxes)
        ax.set_title(panel.heading, fontsize=9, loc="left")
        ax.set_axis_off()
        return
    lines = panel.drawn()
    for label, points in lines.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "-", linewidth=1.3, label=label, marker="o" if len(xs) < 20 else None, markersize=2.5)
    values = [v for points in lines.values() for _, v in points]
    kinds = {metric_kind(m, *values) for m in panel.metrics}
    if kinds == {"rate"}:
        ax.set_ylim(0, 1.05)
    ax.set_ylabel(_common_name(panel.metrics), fontsize=8)
    ax.set_xlabel("step", fontsize=8)
    ax.set_title(panel.heading, fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)


def _common_name(metrics: tuple[str, ...]) -> str:
    """What a panel's metrics share: the name of the one, else their common path (`rl/reward`)."""
    parts = [m.split("/") for m in metrics]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return "/".join(common) or ", ".join(metrics)


def _signals(signals: Sequence[SignalPanel]) -> list[SignalPanel]:
    """The panels that have a line to draw, in the order given."""
    return [p for p in signals if p.drawn()]


def panel_names(curves: dict[str, list[tuple[float, float]]], signals: Sequence[SignalPanel] = ()) -> list[str]:
    """The chart panels below the closing table's, as a person reads their names (the HTML lists them)."""
    names = []
    if any(curves.values()):
        names.append(f"{CURVES_TITLE} ({', '.join(s for s, points in curves.items() if points)}; train/lm_loss "
                     "over tokens seen)")
    for panel in _signals(signals):
        labels = list(panel.drawn())
        lines = "" if set(labels) <= set(panel.metrics) else f"; lines: {', '.join(labels)}"
        constant = panel.flat()
        if constant is not None and panel.when_flat:
            names.append(f"{panel.heading} ({', '.join(panel.metrics)} = {constant:g} at every step: {panel.when_flat})")
        else:
            names.append(f"{panel.heading} ({', '.join(panel.metrics)} per step{lines})")
    return names


def _gate_lines(gates: list[dict]) -> list[str]:
    return [f"{g.get('stage', '?')} at {fmt(g.get('tokens_seen'))} tokens: {g.get('action', '?')} - {g.get('reason', '')}"
            for g in gates]


def report_figure(rows: list[dict], curves: dict[str, list[tuple[float, float]]], gates: list[dict],
                  signals: Sequence[SignalPanel] = ()):
    """The report as one matplotlib figure (stage slopes, costs, loss across stages, each stage's
    training signal on its own axes, gate decisions)."""
    columns = closing_columns(rows)
    width = max(2.6 * columns, 9)
    has_curves = any(curves.values())
    panels = _signals(signals)
    per_row = max(1, min(len(panels), int(width // SIGNAL_PANEL_WIDTH)))
    signal_rows = -(-len(panels) // per_row)
    heights = ([3.0, 0.35 * len(rows) + 1.0] + ([3.2] if has_curves else [])
               + ([SIGNAL_ROW_HEIGHT * signal_rows] if panels else []) + [0.3 * len(gates) + 0.8])
    fig = plt.figure(figsize=(width, sum(heights) + 1.4), dpi=110)
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    wins = closing_panels(fig, grid, rows)
    if has_curves:
        _curves_panel(fig.add_subplot(grid[2, :]), curves, gates)
    if panels:
        cells = grid[len(heights) - 2, :].subgridspec(signal_rows, per_row, hspace=0.6, wspace=0.3)
        for i, panel in enumerate(panels):
            _signal_panel(fig.add_subplot(cells[i // per_row, i % per_row]), panel)
    text_ax = fig.add_subplot(grid[-1, :])
    text_ax.set_axis_off()
    lines = _gate_lines(gates) or ["no gate decided anything"]
    text_ax.text(0.0, 1.0, "gate decisions\n" + "\n".join(f"  {line}" for line in lines), va="top", fontsize=8,
                 family="monospace", transform=text_ax.transAxes)
    # a fixed gap above the title: tight_layout keeps room for its height under the top edge only, so the
    # default y=0.98 of a tall figure would push it onto the first row's titles
    fig.suptitle(summary_title(rows, wins), fontsize=11, y=1 - 0.15 / fig.get_figheight())
    fig.tight_layout()
    return fig


def _html(rows: list[dict], gates: list[dict], png: bytes, title: str, panels: list[str]) -> str:
    e = html.escape
    head = "".join(f"<th>{c}</th>" for c in ("stage", "target metric", "before", "after", "change", "tokens", "wall time (s)"))
    body = []
    for r in rows:
        text, mark = describe_change(r)
        change = f"{text} {mark}".strip()
        mark = mark if mark in ("better", "worse") else ""
        cells = [r.get("stage", "") + (" (reused)" if r.get("reused") else ""), r.get("metric", ""), fmt(r.get("before")), fmt(r.get("after")), change,
                 fmt(r.get("tokens")), fmt(r.get("seconds"))]
        body.append(f'<tr class="{mark}">' + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    gate_items = "".join(f"<li>{e(line)}</li>" for line in _gate_lines(gates)) or "<li>no gate decided anything</li>"
    panel_items = "".join(f"<li>{e(name)}</li>" for name in panels) or "<li>no stage logged a training signal</li>"
    alt = "; ".join(["pipeline report: each stage's target before and after", "tokens and wall time per stage",
                     *panels])
    data = base64.b64encode(png).decode("ascii")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
th:first-child, td:first-child, td:nth-child(2) {{ text-align: left; }}
tr.better td:nth-child(5) {{ color: #2a7a2a; }} tr.worse td:nth-child(5) {{ color: #b22; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{e(title)}</h1>
<h2>stages</h2>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
<h2>gate decisions</h2>
<ul>{gate_items}</ul>
<h2>charts</h2>
<p>Below each stage's target before and after, and its tokens and wall time, the training panels:</p>
<ul class="panels">{panel_items}</ul>
<img alt="{e(alt)}" src="data:image/png;base64,{data}">
</body></html>
"""


def pipeline_report(rows: list[dict], curves: dict[str, list[tuple[float, float]]], gates: list[dict],
                    out_dir: str | Path, signals: Sequence[SignalPanel] = ()) -> tuple[Path, Path]:
    """Write `pipeline_report.png` and a self-contained `pipeline_report.html` under `out_dir`; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = report_figure(rows, curves, gates, signals)
    png_path, html_path = out / "pipeline_report.png", out / "pipeline_report.html"
    fig.savefig(png_path)
    plt.close(fig)
    page = _html(rows, gates, png_path.read_bytes(), fig._suptitle.get_text(), panel_names(curves, signals))
    html_path.write_text(page, encoding="utf-8")
    return png_path, html_path
