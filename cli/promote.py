"""`stagewise promote`: move a registry alias to the stage checkpoint a cutoff rule picks.

The command form of the promotion flow (flows/promote.py; deployed as `stagewise-promote/promote`
by `stagewise serve`): the same checks, the same choice and the same evidence run in MLflow,
run directly without a Prefect flow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, ExperimentOpt, JsonOpt, RuleOpt, TrackingUriOpt
from stagewise.cli.output import emit, guarded


@guarded
def promote_cmd(
    experiment: str = ExperimentOpt,
    stage: str = typer.Option(..., "--stage", help="Stage whose runs to judge, e.g. pretrain."),
    rule: Path = RuleOpt,
    alias: Optional[str] = typer.Option(None, "--alias", help="Registry alias to move (default: <stage>-champion)."),
    tracking_uri: Optional[str] = TrackingUriOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Point a registry alias at the stage checkpoint that passes a cutoff rule best.

    Replays the rule on every run of the stage (as `stagewise cutoffs` does); among the runs
    where it held and whose checkpoint is registered, the best final value of the rule's
    primary metric wins (ties: the earliest cutoff). The alias is left alone when no run
    passes. The decision is logged as an MLflow run `promote/<stage>` with promotion.json.

    \b
    Example:
      stagewise promote --experiment tiny --stage pretrain --rule rule.yaml \\
        --alias pretrain-champion --tracking-uri sqlite:///runs/tiny/mlflow.db
    with rule.yaml holding e.g.  all: [{metric: eval/validation/loss, op: "<", value: 3.5}]
    """
    from stagewise.flows.promote import check_request, promote
    from stagewise.store.tracking import Tracker

    parsed, alias, uri = check_request(experiment, stage, str(rule), alias, tracking_uri)
    decision = promote(Tracker(uri, experiment), experiment, stage, parsed, alias, str(rule))

    def text() -> None:
        typer.echo(f"experiment {experiment}, stage {stage}, rule {rule}: {len(decision['considered'])} run(s)")
        for r in decision["considered"]:
            value = "" if r.get("primary") is None else f", {decision['primary_metric']} = {r['primary']:.4g}"
            version = f", version {r['version']}" if r.get("version") else ""
            typer.echo(f"  run {r['run_name'] or '?'} ({r['run_id']}): {r['why']}{value}{version}")
        typer.echo(decision["outcome"])
        typer.echo(f"evidence: MLflow run {decision['promotion_run']} (promotion.json)")

    emit(decision, as_json, text)
