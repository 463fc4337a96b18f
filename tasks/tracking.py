"""The one door to MLflow: runs, batched metrics, params, artifacts and the model registry.

Everything goes through an `MlflowClient` with explicit run ids (never the fluent
"active run" globals), so Prefect tasks on any thread log to the right run. Metrics are
always sent with `log_batch`, chunked under MLflow's 1,000-metric limit (STACK-NOTES:
1,000 single calls take 5.7 s, one batch 0.3 s).

Layout (DESIGN.md): experiment = recipe name; one parent run per pipeline run tagged with
the Prefect flow-run id; one nested run per stage tagged `stagewise.stage`.
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

STAGE_TAG = "stagewise.stage"
RECIPE_TAG = "stagewise.recipe"
FLOW_RUN_TAG = "prefect.flow_run_id"
_BATCH = 900


def default_tracking_uri(workdir: Path) -> str:
    """The SQLite store under the workdir that a recipe uses unless tracking.uri is set."""
    return f"sqlite:///{(Path(workdir) / 'mlflow.db').resolve()}"


@dataclass(frozen=True)
class Tracker:
    """A small handle (URI + experiment) that is cheap to pass between Prefect tasks."""

    uri: str
    experiment: str
    artifact_root: str | None = None

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def experiment_id(self) -> str:
        """Create the experiment on first use (artifacts next to the store, not in ./mlruns)."""
        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        location = Path(self.artifact_root).resolve().as_uri() if self.artifact_root else None
        return client.create_experiment(self.experiment, artifact_location=location)

    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        """Open a run (nested under `parent_run_id` when given) and return its id."""
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client().create_run(self.experiment_id(), tags=tags, run_name=name)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client().set_terminated(run_id, status=status)

    @contextmanager
    def run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> Iterator[str]:
        """`with tracker.run(...) as run_id:` the run ends FINISHED when the block completes (or
        returns) and FAILED when it raises, Ctrl-C included, so no crashed stage stays RUNNING."""
        run_id = self.start_run(name, tags, parent_run_id)
        try:
            yield run_id
        except BaseException:
            self.end_run(run_id, "FAILED")
            raise
        self.end_run(run_id)

    def log_metrics(self, run_id: str, records: Iterable[tuple[int, int, dict[str, float]]]) -> None:
        """Log (step, tokens_seen, metrics) records in batches; `tokens_seen` is logged too."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch: list[Any] = []
        for step, tokens, metrics in records:
            batch.append(Metric("tokens_seen", float(tokens), now, int(step)))
            batch.extend(Metric(k, float(v), now, int(step)) for k, v in metrics.items())
        client = self.client()
        for i in range(0, len(batch), _BATCH):
            client.log_batch(run_id, metrics=batch[i : i + _BATCH])

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        client = self.client()
        for i in range(0, len(items), 90):
            client.log_batch(run_id, params=items[i : i + 90])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client().log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_json(self, run_id: str, obj: Any, artifact_file: str) -> None:
        self.client().log_dict(run_id, json.loads(json.dumps(obj, default=str)), artifact_file)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client().log_text(run_id, text, artifact_file)

    def log_figure(self, run_id: str, figure: Any, artifact_file: str) -> None:
        self.client().log_figure(run_id, figure, artifact_file)

    def log_artifact(self, run_id: str, path: str | Path, artifact_dir: str | None = None) -> None:
        """Copy a file into the run's artifacts (under `artifact_dir` when given)."""
        self.client().log_artifact(run_id, str(path), artifact_dir)

    def register_checkpoint(self, model_name: str, checkpoint: Path, run_id: str, alias: str) -> str:
        """Register a checkpoint directory as a model version and point `alias` at it."""
        client = self.client()
        from mlflow.exceptions import MlflowException

        try:
            client.create_registered_model(model_name)
        except MlflowException:
            pass  # already registered: versions accumulate under one name
        version = client.create_model_version(
            model_name, source=str(Path(checkpoint).resolve()), run_id=run_id, tags={STAGE_TAG: alias}
        )
        client.set_registered_model_alias(model_name, alias, version.version)
        return str(version.version)

    # ------------------------------------------------------------------ reading back

    def metric_histories(self, run_id: str, names: list[str] | None = None) -> dict[str, list[tuple[int, int, float]]]:
        """{metric: [(step, tokens_seen, value), ...]} oldest first, as gates and cutoffs read them.

        Only metrics the run has are returned (all of them when `names` is None), so a rule
        that names a missing metric fails with the names that exist. tokens_seen is the
        `tokens_seen` value logged at the same step (else the latest one before it, else 0);
        a metric logged twice at one step keeps its last value.
        """
        client = self.client()
        logged = set(client.get_run(run_id).data.metrics)
        wanted = sorted(logged) if names is None else [n for n in dict.fromkeys(names) if n in logged]
        tokens = _last_per_step(client.get_metric_history(run_id, "tokens_seen")) if "tokens_seen" in logged else []
        steps = [s for s, _ in tokens]
        out = {}
        for name in wanted:
            points = tokens if name == "tokens_seen" else _last_per_step(client.get_metric_history(run_id, name))
            out[name] = [(step, _tokens_at(steps, tokens, step), value) for step, value in points]
        return out

    def carry_over(self, run_id: str, stage_dir: str, until_step: int) -> str | None:
        """Copy into `run_id` the metric history, up to `until_step`, of the latest other run
        that trained `stage_dir`; returns that run's id (None when there is none).

        A stage resumed with `--resume` opens a new run; without its predecessor's history a
        gate would measure relative thresholds from the resume point and the loss plots would
        start there. Points after `until_step` (the checkpoint resumed from) are left out:
        training repeats them."""
        from mlflow.entities import Metric

        client = self.client()
        quote = '"' if "'" in stage_dir else "'"  # a path may hold one kind of quote; MLflow takes either
        runs = client.search_runs([self.experiment_id()], f"tags.`stagewise.stage_dir` = {quote}{stage_dir}{quote}",
                                  order_by=["attributes.start_time DESC"], max_results=10)
        source = next((r for r in runs if r.info.run_id != run_id), None)
        if source is None:
            return None
        points = [Metric(m.key, m.value, m.timestamp, m.step) for key in source.data.metrics
                  for m in client.get_metric_history(source.info.run_id, key) if m.step <= until_step]
        for i in range(0, len(points), _BATCH):
            client.log_batch(run_id, metrics=points[i:i + _BATCH])
        self.set_tags(run_id, {"stagewise.resumed_from_run": source.info.run_id})
        return source.info.run_id

    def metric_names(self, run_id: str) -> list[str]:
        """Every metric the run has logged (cheap: no histories), e.g. to name the nearest in an error."""
        return sorted(self.client().get_run(run_id).data.metrics)

    def find_stage_runs(self, experiment: str | None, stage: str) -> list[StageRun]:
        """Runs tagged `stagewise.stage` = stage in `experiment` (None: this tracker's), oldest first.

        LookupError (naming the experiments there are) when the experiment does not exist:
        reading must never create one.
        """
        client = self.client()
        name = experiment or self.experiment
        exp = client.get_experiment_by_name(name)
        if exp is None:
            names = sorted(e.name for e in client.search_experiments())
            raise LookupError(f"no MLflow experiment {name!r} at {self.uri}; experiments: {', '.join(names) or '(none)'}")
        runs, token = [], None
        while True:
            page = client.search_runs([exp.experiment_id], filter_string=f"tags.`{STAGE_TAG}` = '{stage}'",
                                      order_by=["attributes.start_time ASC"], max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
        return [StageRun(r.info.run_id, r.info.run_name or "", stage, r.info.status, r.info.start_time or 0,
                         dict(r.data.tags)) for r in runs]

    def stages_in(self, experiment: str | None = None) -> list[str]:
        """The distinct `stagewise.stage` tags of an experiment's runs (for error messages)."""
        client = self.client()
        exp = client.get_experiment_by_name(experiment or self.experiment)
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        return sorted({r.data.tags[STAGE_TAG] for r in runs if STAGE_TAG in r.data.tags})


@dataclass(frozen=True)
class StageRun:
    """One stage's MLflow run, as `find_stage_runs` lists them."""

    run_id: str
    name: str
    stage: str
    status: str
    start_time: int
    """Milliseconds since the epoch."""
    tags: dict[str, str]


def _last_per_step(history: Iterable[Any]) -> list[tuple[int, float]]:
    """(step, value) sorted by step, keeping the last-logged value of a repeated step."""
    by_step: dict[int, tuple[int, float]] = {}
    for m in history:
        if m.step not in by_step or m.timestamp >= by_step[m.step][0]:
            by_step[m.step] = (m.timestamp, m.value)
    return [(step, value) for step, (_, value) in sorted(by_step.items())]


def _tokens_at(steps: list[int], tokens: list[tuple[int, float]], step: int) -> int:
    """tokens_seen at `step`: the value logged there, else the latest before it, else 0."""
    i = bisect.bisect_right(steps, step)
    return int(tokens[i - 1][1]) if i else 0
