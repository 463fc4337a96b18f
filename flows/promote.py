"""Cutoffs as a job: promote the stage checkpoint that a cutoff rule picks, with the evidence.

`stagewise cutoffs` shows where a gate rule would have stopped each of a stage's runs; this
acts on it. The flow reads every run of one stage from MLflow, replays the rule on each run's
metric histories (the same `eval.cutoffs.load_rule` / `run_cutoff` the CLI uses), and among
the runs where the rule held and whose final checkpoint is a registered version of model
`<experiment>`, picks the best one: the best final value of the rule's primary metric (the
registered checkpoint is the run's last, so that is the value it carries; direction from the
rule), ties and direction-less rules going to the earliest cutoff. It moves a registry alias
(default `<stage>-champion`, never the stage's own alias, which every stage run moves) to that
version, and tags the version with the promotion run. When no run passes, the alias is left
where it was and the decision says so. A stage trained in sub-stages (sft) is judged on its
sub-stage runs, as `stagewise cutoffs` does; only the last sub-stage's checkpoint is the
stage's registered one, so only that sub-stage can win (with the stage run's version).

Every decision is an MLflow run of its own, `promote/<stage>` in the same experiment (tagged
`stagewise.promotion=<stage>`, not `stagewise.stage`, so a later promotion never reads it as a
stage run), with `promotion.json`: the rule, each run considered (its cutoff, the primary
metric's final value, its registered version or why it was passed over), the winner, and the
alias's previous and new holder.

The flow checks its inputs before touching the store, with the located messages of the CLI
(`stagewise promote`, `stagewise cutoffs`): a bad rule file names its file, line and field; a
missing store, experiment or stage says what is there. Prefect's own parameter validation is
off so that message is the one a person reads in the UI.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

from prefect import flow, get_run_logger

from stagewise.data.errors import BadInput
from stagewise.eval.cutoffs import load_rule, run_cutoff
from stagewise.eval.gates import GateRule, UnknownMetricError, check_metrics
from stagewise.recipe import STAGE_ORDER, available_stages
from stagewise.recipe.form_policy import form_policy
from stagewise.store.tracking import Tracker

PROMOTION_TAG = "stagewise.promotion"
PROMOTED_BY_TAG = "stagewise.promoted_by_run"
SUBSTAGE_TAG, SUBSTAGES_TAG = "stagewise.substage", "stagewise.substages"
"""As flows/sft.py tags a sub-stage's run and its stage's run."""
_ALIAS = re.compile(r"^[\w\-]{1,255}$")

StageName = Literal[tuple(available_stages())]  # type: ignore[valid-type]  # the UI's choice of stage


def default_alias(stage: str) -> str:
    return f"{stage}-champion"


def check_alias(alias: str, stage: str) -> str:
    """An alias MLflow accepts and that no stage run moves on its own; BadInput naming `alias` otherwise."""
    if not _ALIAS.match(alias) or alias.lower() == "latest" or re.match(r"^[vV]\d+$", alias):
        raise BadInput(f"alias {alias!r}: an MLflow alias is letters, digits, _ and -, and not 'latest' or v<N>; "
                       f"e.g. {default_alias(stage)!r}")
    if alias in STAGE_ORDER:
        raise BadInput(f"alias {alias!r}: every {alias} run moves that alias itself; pick another, e.g. {default_alias(alias)!r}")
    return alias


def check_tracking_uri(uri: Optional[str], field: str = "tracking_uri") -> str:
    """The store to read: `uri`, else MLFLOW_TRACKING_URI; a SQLite store must exist (reading must not create one)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise BadInput(f"{field}: no MLflow store; give one (e.g. sqlite:///runs/tiny/mlflow.db) or set MLFLOW_TRACKING_URI")
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise BadInput(f"{field}: no MLflow store at {uri} (file not found)")
    return uri


def check_request(experiment: str, stage: str, rule: str, alias: Optional[str],
                  tracking_uri: Optional[str]) -> tuple[GateRule, str, str]:
    """(the parsed rule, the alias, the store URI), or BadInput naming what is wrong (the rule file's line and field)."""
    if not experiment or not experiment.strip():
        raise BadInput("experiment: give the MLflow experiment (by default the recipe's name)")
    if not stage or not stage.strip():
        raise BadInput("stage: give the stage whose runs to judge, e.g. pretrain")
    alias = check_alias(alias or default_alias(stage), stage)
    path = Path(rule).expanduser()
    if not path.is_file():
        raise BadInput(f"rule: rule file not found: {rule}")
    parsed = load_rule(path)  # names the file, line and field of a bad rule
    return parsed, alias, check_tracking_uri(tracking_uri)


def _score(rule: GateRule, histories: dict) -> float | None:
    """The primary metric's last value in the run (None when the run never logged it)."""
    name = rule.primary_metric()
    hist = sorted(histories.get(name, [])) if name else []
    return hist[-1][2] if hist else None


def _stage_version(tracker: Any, experiment: str, tags: dict, tags_of: dict[str, dict]) -> dict | None:
    """A sub-stage run registers nothing; the last sub-stage's checkpoint is its stage's final one,
    registered from the stage run (its parent). None for any other sub-stage: what it handed on
    was trained further."""
    parent = tags.get("mlflow.parentRunId")
    names = (tags_of.get(parent) or {}).get(SUBSTAGES_TAG, "").split(",")
    if SUBSTAGE_TAG not in tags or not parent or names[-1] != tags[SUBSTAGE_TAG]:
        return None
    return tracker.version_of_run(experiment, parent)


def judge(tracker: Any, experiment: str, stage: str, rule: GateRule) -> dict[str, Any]:
    """Every run of the stage with the rule replayed and its registered version; the winner (or None).

    BadInput when the experiment or the stage has no runs, or when no run logs the rule's metrics."""
    try:
        runs = tracker.find_stage_runs(experiment, stage)
    except LookupError as e:
        raise BadInput(f"experiment: {e}") from e
    if not runs:
        stages = tracker.stages_in(experiment)
        raise BadInput(f"stage: no runs of stage {stage!r} in experiment {experiment!r}; stages there: {', '.join(stages) or '(none)'}")
    # As in `stagewise cutoffs`: a stage trained in sub-stages gates each in its own run.
    tags_of = {r.run_id: r.tags for r in runs}
    runs = [r for r in runs if SUBSTAGES_TAG not in r.tags] or runs
    up = rule.primary_direction()
    considered = []
    for run in runs:
        row: dict[str, Any] = {"run_id": run.run_id, "run_name": run.name, "status": run.status,
                               "cutoff": None, "primary": None, "version": None, "checkpoint": None, "passes": False}
        try:
            check_metrics(rule, tracker.metric_names(run.run_id))
            histories = tracker.metric_histories(run.run_id, rule.metrics())
            report = run_cutoff(run.run_id, rule, histories, run.name).to_dict()
        except UnknownMetricError as e:
            considered.append({**row, "why": f"skipped: {e}"})
            continue
        row.update(cutoff=report["cutoff"], guards=report["guards"], primary=_score(rule, histories))
        held = tracker.version_of_run(experiment, run.run_id) or _stage_version(tracker, experiment, run.tags, tags_of)
        if held:
            row.update(version=held["version"], checkpoint=held["checkpoint"])
        if report["cutoff"] is None:
            row["why"] = "the rule never held"
        elif run.status != "FINISHED":
            row["why"] = f"the run is {run.status}, not FINISHED"
        elif not held:
            row["why"] = (f"no registered version of model {experiment!r} from this run"
                          + (" (only the last sub-stage hands on the stage's checkpoint)" if SUBSTAGE_TAG in run.tags else ""))
        else:
            row.update(passes=True, why="the rule held")
        considered.append(row)
    if all(r["why"].startswith("skipped") for r in considered):
        raise BadInput(considered[0]["why"].removeprefix("skipped: "))

    def rank(r: dict) -> tuple:
        value = r["primary"]
        better = (-value if up else value) if (value is not None and up is not None) else 0.0
        return (value is None, better, r["cutoff"]["tokens_seen"], r["cutoff"]["step"])

    passing = sorted((r for r in considered if r["passes"]), key=rank)
    return {"experiment": experiment, "stage": stage, "rule": rule.model_dump(mode="json"),
            "primary_metric": rule.primary_metric(), "higher_is_better": up,
            "considered": considered, "winner": passing[0] if passing else None}


def promote(tracker: Any, experiment: str, stage: str, rule: GateRule, alias: str,
            rule_path: str = "") -> dict[str, Any]:
    """Judge the stage's runs, move `alias` to the winner's version (or leave it), and log the decision as a run."""
    decision = judge(tracker, experiment, stage, rule)
    winner = decision["winner"]
    previous = tracker.alias_holder(experiment, alias)
    moved = winner is not None and winner["version"] != previous
    decision.update(rule_file=rule_path, model=experiment, alias=alias, previous_version=previous,
                    new_version=winner["version"] if winner else previous, moved=moved,
                    outcome=(f"{alias} -> version {winner['version']} (run {winner['run_name']} {winner['run_id']})"
                             if winner else f"no run passes the rule; {alias} left at "
                             f"{'version ' + previous if previous else '(unset)'}"))
    with tracker.run(f"promote/{stage}", {PROMOTION_TAG: stage, "stagewise.alias": alias}) as run_id:
        decision["promotion_run"] = run_id
        tracker.set_tags(run_id, {"stagewise.promotion.outcome": "promoted" if winner else "none passed",
                                  "stagewise.promotion.winner_run": winner["run_id"] if winner else "",
                                  "stagewise.promotion.previous_version": previous or "",
                                  "stagewise.promotion.new_version": decision["new_version"] or ""})
        tracker.log_json(run_id, decision, "promotion.json")
        if winner is not None:
            tracker.set_alias(experiment, alias, winner["version"], {PROMOTED_BY_TAG: run_id})
    return decision


@flow(name="stagewise-promote", validate_parameters=False, log_prints=False)
def promote_flow(
    experiment: str,
    stage: StageName,  # type: ignore[valid-type]
    rule: str,
    alias: Optional[str] = None,
    tracking_uri: Optional[str] = None,
) -> dict:
    """Move a registry alias to the stage checkpoint that passes a cutoff rule best (the alias stays when none passes).

    Args:
        experiment: The MLflow experiment (the recipe's name); also the registered model's name.
        stage: The stage whose runs are judged.
        rule: Path of a YAML rule file: a gate's all/any/guards/min_tokens (a whole gate block works too).
        alias: The registry alias to move; default `<stage>-champion`.
        tracking_uri: The MLflow store; default MLFLOW_TRACKING_URI.
    """
    policy = form_policy()  # the operator's boundary (stagewise serve), before anything is read
    policy.admit_file(rule, "rule")
    policy.admit_tracking(tracking_uri)
    parsed, alias, uri = check_request(experiment, stage, rule, alias, tracking_uri)
    logger = get_run_logger()
    decision = promote(Tracker(uri, experiment), experiment, stage, parsed, alias, str(rule))
    for r in decision["considered"]:
        logger.info("run %s (%s): %s%s", r["run_name"], r["run_id"], r["why"],
                    f", {decision['primary_metric']} = {r['primary']:.4g}" if r.get("primary") is not None else "")
    logger.info("%s (evidence: MLflow run %s)", decision["outcome"], decision["promotion_run"])
    return decision
