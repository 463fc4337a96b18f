"""The pipeline's closing table: one row per stage, its target metric before -> after (with the
change's 95% interval and its verdict where the metric is scored per item: eval/intervals.py),
tokens, wall time and MLflow run id, so a person sees at a glance what each stage bought.

`stagewise run` and `stagewise demo` print it (cli/run.py); `--json` gives the same rows
under "stages". The parent MLflow run keeps it as `reports/closing_table.{json,txt,png}` and
the one-page report `reports/pipeline_report.{png,html}` (also under `<workdir>/reports/`): the
rows as a chart, pretraining and long-context loss on one token axis (registry entries with
`lm_curve`), each stage's training signal on its own axes (registry entries' `signals`: SFT's
loss per sub-stage, RL's reward and masked-IS fraction, distillation's reverse KL per round),
the gate decisions (and, where a person reviewed a gate, their answer: `review`, flows/gate_review.py).
A stage adds its row by returning a StageResult with a summary.

Histories are read here, through the Tracker, from the run that trained each stage (a reused
stage's `trained_in_run`: its own run re-logs only its final metrics), and handed to
eval/pipeline_report.py as plain data. A stage that did not run, or logged none of its signals, has no panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from stagewise.eval.intervals import describe_change
from stagewise.eval.pipeline_report import SignalPanel, pipeline_report
from stagewise.eval.plots import stage_summary_plot
from stagewise.flows.gate_review import review_text
from stagewise.flows.registry import REGISTRY
from stagewise.refs import StageResult
from stagewise.store.tracking import Tracker

if TYPE_CHECKING:
    from stagewise.eval.pipeline_report import SignalPanel

COLUMNS = ("stage", "metric", "before", "after", "higher_is_better", "tokens", "seconds", "run_id")
EVIDENCE = ("gain_low", "gain_high", "items", "tolerance", "verdict")
"""A row's 95% interval of after - before, over how many items, and what it supports (eval/intervals.py)."""


def closing_rows(results: list[StageResult]) -> list[dict]:
    """The table's rows (the COLUMNS of each stage; a stage without a summary has empty cells)."""
    rows = []
    for r in results:
        s = r.summary
        rows.append({"stage": r.stage, "metric": s.metric if s else None, "before": s.before if s else None,
                     "after": s.after if s else None, "higher_is_better": s.higher_is_better if s else None,
                     "tokens": s.tokens if s else 0, "seconds": s.seconds if s else None, "run_id": r.run_id,
                     "reused": r.reused, "note": s.note if s else None,
                     "review": (r.gate or {}).get("review"),
                     **{k: getattr(s, k) if s else None for k in EVIDENCE}})
    return rows


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


HEADER = ["stage", "metric", "before -> after", "tokens", "time", "MLflow run"]


def _cells(r: dict) -> list[str]:
    """A row's cells, in HEADER's order: the change with its 95% interval and what that supports
    (eval/intervals.py describe_change), and the note."""
    change = f"{_num(r['before'])} -> {_num(r['after'])}"
    text, verdict = describe_change(r)
    if r.get("gain_low") is not None:
        change += f"  {text} ({verdict})"
    elif verdict:
        change += f"  ({verdict})"
    if r.get("note"):
        change += f"  [{r['note']}]"
    if r.get("review") and "reviewed:" not in (r.get("note") or ""):
        change += f"  [gate {review_text(r['review'])}]"
    seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f} s"
    return [r["stage"] + (" (reused)" if r.get("reused") else ""), r["metric"] or "-", change,
            f"{r['tokens']:,}", seconds, r["run_id"]]


def markdown_table(rows: list[dict], run_url: Callable[[str], str]) -> str:
    """The table in Markdown, for Prefect's artifact pages: it wraps in a narrow page (aligned text is
    cut at its last column there), and each MLflow run id links to its run's page (`run_url`)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---|---:|---:|---|"]
    for r in rows:
        cells = [c.replace("|", "\\|") for c in _cells(r)]
        cells[-1] = f"[{cells[-1]}]({run_url(r['run_id'])})"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(rows: list[dict]) -> str:
    """The table as aligned text, with a direction mark on each change (good, bad, none)."""
    header = HEADER
    lines = [header, *(_cells(r) for r in rows)]
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def log_closing_table(tracker: Tracker, run_id: str, results: list[StageResult], workdir: str | Path) -> list[dict]:
    """Keep the table in the pipeline's MLflow run (JSON rows, text, chart) and the one-page
    report (eval/pipeline_report.py: PNG + self-contained HTML) there and under `<workdir>/reports/`."""
    rows = closing_rows(results)
    tracker.log_json(run_id, {"stages": rows}, "reports/closing_table.json")
    tracker.log_text(run_id, render(rows) + "\n", "reports/closing_table.txt")
    tracker.log_figure(run_id, stage_summary_plot(rows), "reports/closing_table.png")
    for path in pipeline_report(rows, loss_curves(tracker, results), gate_decisions(results), Path(workdir) / "reports",
                                training_signals(tracker, results)):
        tracker.log_artifact(run_id, path, "reports")
    return rows


DESCRIPTION_TAG = "mlflow.note.content"
"""The run's description in the MLflow UI (Markdown)."""
DESCRIPTION_LIMIT = 8000
"""MLflow's longest tag value."""


def describe_parent_run(tracker: Tracker, run_id: str, rows: list[dict]) -> None:
    """The pipeline's parent run as a person opens it in MLflow: the closing table as its
    description (Markdown, each stage's run linked) and each stage's target as its metrics,
    `<stage>/<metric>` (after), with `_before`, `_gain_low` and `_gain_high` where known."""
    text = ("What each stage bought (after - before with its 95% interval, and the verdict it supports):\n\n"
            + markdown_table(rows, tracker.ui_url))
    tracker.set_tags(run_id, {DESCRIPTION_TAG: text[:DESCRIPTION_LIMIT]})
    metrics: dict[str, float] = {}
    for r in rows:
        if r["metric"] is None or r["after"] is None:
            continue
        key = f"{r['stage']}/{r['metric']}"
        metrics[key] = r["after"]
        metrics |= {f"{key}_{field}": r[field] for field in ("before", "gain_low", "gain_high") if r.get(field) is not None}
    if metrics:
        tracker.log_metrics(run_id, [(0, 0, metrics)])


def loss_curves(tracker: Tracker, results: list[StageResult]) -> dict[str, list[tuple[float, float]]]:
    """{stage: [(tokens_seen, train/lm_loss), ...]} of the stages that train a language model,
    read from the run that trained them (a reused stage's own run has no curve)."""
    drawn = {s.name for s in REGISTRY if s.lm_curve}
    curves = {}
    for r in results:
        if r.stage in drawn:
            history = tracker.metric_histories(r.trained_in_run or r.run_id, ["train/lm_loss"]).get("train/lm_loss", [])
            curves[r.stage] = [(tokens, value) for _, tokens, value in history]
    return curves


def training_signals(tracker: Tracker, results: list[StageResult]) -> list[SignalPanel]:
    """One panel per `signals` entry of each stage's registry entry, in pipeline order: [(step, value)]
    per metric from the run that trained the stage, or (`nested`) per run nested under it with the
    stage's tag (SFT's `sft/<sub-stage>`, distillation's `distill/round-<r>`; its teachers' runs are
    other stages), labelled by the run's name after `<stage>/`. Lines without points and panels
    without lines are left out."""
    declared = {s.name: s.signals for s in REGISTRY if s.signals}
    panels = []
    for r in results:
        if r.stage not in declared:
            continue
        trained_in = r.trained_in_run or r.run_id
        nested = None
        for signal in declared[r.stage]:
            if signal.nested:
                if nested is None:
                    nested = [(run.name.removeprefix(f"{r.stage}/"), run.run_id)
                              for run in tracker.nested_runs(trained_in) if run.stage == r.stage]
                sources = nested
            else:
                sources = [("", trained_in)]
            lines = {}
            for label, source in sources:
                histories = tracker.metric_histories(source, list(signal.metrics))
                for metric in signal.metrics:
                    points = [(step, value) for step, _, value in histories.get(metric, [])]
                    if points:
                        line = metric if not label else label if len(signal.metrics) == 1 else f"{label}: {metric}"
                        lines[line] = points
            if lines:
                panels.append(SignalPanel(r.stage, signal.title, signal.metrics, lines, signal.when_flat))
    return panels


def gate_decisions(results: list[StageResult]) -> list[dict]:
    """The gate decision each stage ended on (stage, action, reason, tokens_seen)."""
    return [{"stage": r.stage, "action": r.gate.get("action"), "reason": r.gate.get("reason", ""),
             "tokens_seen": r.gate.get("tokens_seen")} for r in results if r.gate]
