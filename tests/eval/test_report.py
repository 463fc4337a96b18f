"""The one-page pipeline report renders from fixed rows, curves and gates, as PNG and self-contained HTML."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import matplotlib.pyplot as plt

from stagewise.eval.report import continued, pipeline_report, report_figure
from tests.eval.test_plots import ROWS  # the same closing table as the chart tests

# long context counts its tokens from its own start; the report continues it after pretraining
CURVES = {"pretrain": [(t * 100_000, 8.3 - 0.44 * t) for t in range(13)],
          "long_context": [(t * 50_000, 3.1 - 0.004 * t) for t in range(7)]}
GATES = [{"stage": "pretrain", "action": "continue", "reason": "eval/validation/loss 2.99 < 3.5", "tokens_seen": 1_200_000},
         {"stage": "long_context", "action": "stop", "reason": "loss/2048 plateaued <&> ", "tokens_seen": 300_000}]


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
