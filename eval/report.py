"""The one-page pipeline report: what each stage cost and bought, the loss over the whole run, the gates.

    png, html = pipeline_report(rows, curves, gates, workdir / "reports")

`rows` are the closing table's rows (stage, metric, before, after, higher_is_better, tokens,
seconds); `curves` maps a stage to its [(tokens_seen, loss)] in pipeline order (pretraining,
long context); `gates` are gate decisions ({stage, action, reason, tokens_seen}). A stage's
curve may count tokens from its own start or from the start of the run: when its first point
lies before the previous stage's last one it is shifted to continue from there (a gate of that
stage moves with it), so long context follows pretraining on one token axis.

The PNG is one matplotlib figure; the HTML page holds the same content with no external
resource (the table as a table, the PNG as a data URI, the gates as a list), so it opens
from a file or an artifact store alike.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib.pyplot as plt

from stagewise.eval.plots.compare import closing_columns, closing_panels, summary_title
from stagewise.eval.plots.kinds import AXIS_LABEL, moved
from stagewise.eval.plots.marks import fmt

ACTION_COLOUR = {"stop": "tab:red", "continue": "tab:green"}


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
    ax.set_title("training loss across stages", fontsize=9, loc="left", pad=14)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def _gate_lines(gates: list[dict]) -> list[str]:
    return [f"{g.get('stage', '?')} at {fmt(g.get('tokens_seen'))} tokens: {g.get('action', '?')} - {g.get('reason', '')}"
            for g in gates]


def report_figure(rows: list[dict], curves: dict[str, list[tuple[float, float]]], gates: list[dict]):
    """The report as one matplotlib figure (stage slopes, costs, loss across stages, gate decisions)."""
    columns = closing_columns(rows)
    has_curves = any(curves.values())
    heights = [3.0, 0.35 * len(rows) + 1.0] + ([3.2] if has_curves else []) + [0.3 * len(gates) + 0.8]
    fig = plt.figure(figsize=(max(2.6 * columns, 9), sum(heights) + 1.4), dpi=110)
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    wins = closing_panels(fig, grid, rows)
    if has_curves:
        _curves_panel(fig.add_subplot(grid[2, :]), curves, gates)
    text_ax = fig.add_subplot(grid[-1, :])
    text_ax.set_axis_off()
    lines = _gate_lines(gates) or ["no gate decided anything"]
    text_ax.text(0.0, 1.0, "gate decisions\n" + "\n".join(f"  {line}" for line in lines), va="top", fontsize=8,
                 family="monospace", transform=text_ax.transAxes)
    fig.suptitle(summary_title(rows, wins), fontsize=11)
    fig.tight_layout()
    return fig


def _html(rows: list[dict], gates: list[dict], png: bytes, title: str) -> str:
    e = html.escape
    head = "".join(f"<th>{c}</th>" for c in ("stage", "target metric", "before", "after", "change", "tokens", "wall time (s)"))
    body = []
    for r in rows:
        verdict = moved(r.get("before"), r.get("after"), r.get("higher_is_better"))
        mark = {1: "better", -1: "worse", 0: ""}[verdict]
        change = f"{r['after'] - r['before']:+.3g} {mark}" if r.get("before") is not None and r.get("after") is not None else ""
        cells = [r.get("stage", ""), r.get("metric", ""), fmt(r.get("before")), fmt(r.get("after")), change,
                 fmt(r.get("tokens")), fmt(r.get("seconds"))]
        body.append(f'<tr class="{mark}">' + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    gate_items = "".join(f"<li>{e(line)}</li>" for line in _gate_lines(gates)) or "<li>no gate decided anything</li>"
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
<img alt="pipeline report: each stage's target before and after, tokens and wall time per stage, loss across stages" src="data:image/png;base64,{data}">
</body></html>
"""


def pipeline_report(rows: list[dict], curves: dict[str, list[tuple[float, float]]], gates: list[dict],
                    out_dir: str | Path) -> tuple[Path, Path]:
    """Write `pipeline_report.png` and a self-contained `pipeline_report.html` under `out_dir`; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = report_figure(rows, curves, gates)
    png_path, html_path = out / "pipeline_report.png", out / "pipeline_report.html"
    fig.savefig(png_path)
    plt.close(fig)
    html_path.write_text(_html(rows, gates, png_path.read_bytes(), fig._suptitle.get_text()), encoding="utf-8")
    return png_path, html_path
