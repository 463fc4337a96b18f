"""The one door to MLflow: runs, batched metrics, params, artifacts and the model registry.

Everything goes through an `MlflowClient` with explicit run ids (never the fluent
"active run" globals), so Prefect tasks on any thread log to the right run. Metrics are
always sent with `log_batch`, chunked under MLflow's 1,000-metric limit (with MLflow 3.17 on
SQLite, 1,000 single `log_metric` calls take 5.7 s and one `log_batch` of them 0.3 s).

Layout (DESIGN.md): experiment = recipe name, tagged `mlflow.experimentKind` =
`custom_model_development`, and every link to a run names the UI's model-training view (MLflow
3's UI otherwise opens in the GenAI view, traces, whatever the tag says); one parent run per pipeline run tagged with the
Prefect flow-run id; one nested run per stage tagged `stagewise.stage`.

An MLflow server that stops answering for a while (a restart, a network blip) neither fails
nor loses a stage:
- Metric batches that cannot be sent are kept, in order, in a spool file per run,
  `<artifact_root>/../.mlflow-spool/<run_id>.jsonl` (the workdir's `.mlflow-spool/`; in
  memory when the tracker has no artifact root), and training goes on. They are sent before
  anything else is sent to or read from that run: by the next `log_metrics` (tried again
  after 1, 2, 4, 8, then every 10 s while the server is away), by any read (a gate never
  decides on a partial history), and when `Tracker.run` ends the run. A spool left by a
  killed process is sent when its run is next touched, or when any new run starts. A batch
  sent twice is stored once: MLflow's SQL store drops a metric equal to one it has (key,
  value, step, timestamp), and a spooled metric keeps its original timestamp.
- A checkpoint registered with a tracking server (http/https) is hard-linked into the run's
  artifacts first: the server accepts a local model-version source only inside them.
- Every other call retries transient errors (connection refused or reset, timeouts, HTTP
  5xx/429: `store.retry.is_transient`) with exponential backoff for up to `retry_seconds`,
  and never retries a deterministic one (e.g. RESOURCE_DOES_NOT_EXIST). MLflow's own HTTP
  retries default to 0 here (`MLFLOW_HTTP_REQUEST_MAX_RETRIES`; a value you set wins): its
  default of 7 retries with backoff factor 2 blocks one call for about four minutes before
  failing, and stalls training for 30 s when a server is down for 10 s.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

from stagewise.store.retry import call_with_backoff, is_transient

STAGE_TAG = "stagewise.stage"
RECIPE_TAG = "stagewise.recipe"
FLOW_RUN_TAG = "prefect.flow_run_id"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""The MLflow UI's "machine learning" (model training) workflow; `genai_development` is the other."""
SPOOL_DIR = ".mlflow-spool"
LOCAL_UI = "http://127.0.0.1:5000"
UI_VIEW = "workflowType=machine_learning"
"""The MLflow UI's model-training view (runs, metrics, description), not its GenAI one (traces)."""
"""Where `mlflow ui` serves a file or SQLite store by default."""
_BATCH = 900
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_LOCK = threading.RLock()
"""Serialises sending and spooling metrics in this process (Prefect tasks run on threads)."""
_MEMORY: dict[tuple[str, str], list[list[tuple[str, float, int, int]]]] = {}
"""Pending batches of trackers without an artifact root: (uri, run_id) -> batches, oldest first."""
_DEFER: dict[tuple[str, str], tuple[float, float]] = {}
"""(uri, run_id) -> (monotonic time before which log_metrics only spools, last delay)."""
log = logging.getLogger("stagewise.tracking")

Point = tuple[str, float, int, int]
"""One metric point as spooled: (key, value, timestamp ms, step)."""


def _mlflow_http_defaults() -> None:
    """Leave retrying to this module (see the module docstring); an explicit setting wins."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def default_tracking_uri(workdir: Path) -> str:
    """The SQLite store under the workdir that a recipe uses unless tracking.uri is set."""
    return f"sqlite:///{(Path(workdir) / 'mlflow.db').resolve()}"


_READY_STORES: set[str] = set()


def _create_sqlite_store_once(uri: str) -> None:
    """Create a SQLite store's tables under an flock beside it, once per process: MLflow creates them on
    a store's first use without a lock, so two runs starting on one workdir (a schedule firing while a
    form's run starts) both ran the migrations and the second died on `table ... already exists`."""
    if not uri.startswith("sqlite:///") or uri in _READY_STORES:
        return

    from mlflow import MlflowClient  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, open(db.with_name(db.name + ".lock"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            client.search_experiments(max_results=1)  # the tracking tables, made or migrated
            client.search_registered_models(max_results=1)  # the registry's, in the same file
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
    _READY_STORES.add(uri)


@dataclass(frozen=True)
class Tracker:
    """A small handle (URI + experiment) that is cheap to pass between Prefect tasks."""

    uri: str
    experiment: str
    artifact_root: str | None = None
    retry_seconds: float = 120.0
    inline_weights_mb: float = 256.0
    """A registered checkpoint up to this size is kept in its run's artifacts (hard-linked on a local
    store); a larger one is registered by reference to its directory (tag `stagewise.weights`)."""
    """How long a call keeps retrying while the server is unreachable (backoff 0.5 s to 8 s)."""

    def client(self) -> _Client:
        """An MlflowClient whose calls retry transient errors and first send the run's pending metrics."""
        return _Client(self, self._raw_client())

    def _raw_client(self):
        _mlflow_http_defaults()
        from mlflow import MlflowClient  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        _create_sqlite_store_once(self.uri)
        return MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def _retrying(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def warn(exc: BaseException, delay: float) -> None:
            log.warning("MLflow at %s: %s; retrying in %.1f s", self.uri, _short(exc), delay)

        return call_with_backoff(lambda: fn(*args, **kwargs), self.retry_seconds, on_retry=warn)

    def experiment_id(self) -> str:
        """Create the experiment on first use (artifacts next to the store, not in ./mlruns),
        tagged for the UI's model-training view (older experiments get the tag too)."""
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            location = Path(self.artifact_root).resolve().as_uri() if self.artifact_root else None
            try:
                return client.create_experiment(self.experiment, artifact_location=location,
                                                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            except MlflowException as err:  # created meanwhile (another process, or a retried request)
                if err.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = client.get_experiment_by_name(self.experiment)
        if EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id

    def ui_url(self, run_id: str) -> str:
        """The run's page in the MLflow UI: on the server itself when the store is one (http[s]://), else on
        `mlflow ui --backend-store-uri <uri>` at its default address. A run's own page, in the UI's
        model-training view (`?workflowType=machine_learning`: the MLflow 3 UI otherwise opens in the
        GenAI view it remembers, whatever the experiment's kind)."""
        base = LOCAL_UI
        if self.uri.startswith(("http://", "https://")):  # never a password of the URI in a link

            parts = urlsplit(self.uri)
            base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        return f"{base}/#/experiments/{self.experiment_id()}/runs/{run_id}?{UI_VIEW}"

    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        """Open a run (nested under `parent_run_id` when given) and return its id."""
        self._send_leftovers()
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client().create_run(self.experiment_id(), tags=tags, run_name=name)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Send the run's pending metrics, then mark it ended."""
        self.client().set_terminated(run_id, status=status)

    @contextmanager
    def run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> Iterator[str]:
        """`with tracker.run(...) as run_id:` the run ends FINISHED when the block completes (or
        returns) and FAILED when it raises, Ctrl-C included, so no crashed stage stays RUNNING.
        Pending metrics are sent first; on the FAILED path one attempt is made and an
        unreachable server leaves them in the spool, so the original error is what propagates."""
        run_id = self.start_run(name, tags, parent_run_id)
        try:
            yield run_id
        except BaseException:
            try:
                if self.flush(run_id, wait=False):
                    self._raw_client().set_terminated(run_id, status="FAILED")
            except Exception as err:  # noqa: BLE001 - never hide the error that ended the block
                log.warning("MLflow: could not mark run %s FAILED: %s", run_id, _short(err))
            raise
        self.end_run(run_id)

    # ------------------------------------------------------------------ metrics and the spool

    def log_metrics(self, run_id: str, records: Iterable[tuple[int, int, dict[str, float]]]) -> None:
        """Log (step, tokens_seen, metrics) records in batches; `tokens_seen` is logged too.

        Never fails because the server is unreachable: what cannot be sent is kept in order
        and sent first next time (see the module docstring). A deterministic error (e.g. the
        run does not exist) raises."""
        now = int(time.time() * 1000)
        points: list[Point] = []
        for step, tokens, metrics in records:
            points.append(("tokens_seen", float(tokens), now, int(step)))
            points.extend((k, float(v), now, int(step)) for k, v in metrics.items())
        if not points:
            return
        with _LOCK:
            if self._pending(run_id):
                self._spool(run_id, points)  # behind the older ones, never ahead of them
                if not self._deferred(run_id):
                    self.flush(run_id, wait=False)
                return
            if self._deferred(run_id):
                self._spool(run_id, points)
                return
            self._send(run_id, points, wait=False)

    def flush(self, run_id: str, wait: bool = True) -> bool:
        """Send the run's pending metrics, oldest first. True when none is left; with `wait`,
        retries transient errors for up to `retry_seconds` and then raises the last one;
        without, one attempt (False when the server is still away)."""
        with _LOCK:
            pending = self._pending(run_id)
            if not pending:
                return True
            points = [p for batch in pending for p in batch]
            sent = self._send(run_id, points, wait=wait, spooled=True)
            if sent:
                log.warning("MLflow at %s answers again: sent %d kept metric points of run %s",
                            self.uri, len(points), run_id)
            return sent

    def _send(self, run_id: str, points: list[Point], wait: bool, spooled: bool = False) -> bool:
        """log_batch `points` in chunks (call under _LOCK). `spooled`: they are the run's whole
        spool, which is cut down after each chunk sent (a crash resends at most one chunk);
        otherwise nothing is pending and what is not sent gets spooled. A transient failure
        keeps the rest and returns False (raises when `wait`); a deterministic one sets the
        chunk aside in `<run_id>.rejected.jsonl`, keeps the rest and raises."""
        from mlflow.entities import Metric  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        raw = self._raw_client()
        key = (self.uri, run_id)
        for i in range(0, len(points), _BATCH):
            chunk = points[i:i + _BATCH]
            metrics = [Metric(k, v, ts, step) for k, v, ts, step in chunk]
            try:
                if wait:
                    self._retrying(raw.log_batch, run_id, metrics=metrics)
                else:
                    raw.log_batch(run_id, metrics=metrics)
            except Exception as err:
                transient = is_transient(err)
                if not transient:
                    self._reject(run_id, chunk)
                rest = points[i:] if transient else points[i + _BATCH:]
                if spooled:
                    self._rewrite(run_id, rest)
                else:
                    self._spool(run_id, rest)
                if not transient:
                    raise
                _, last = _DEFER.get(key, (0.0, 0.0))
                delay = min(max(2 * last, 1.0), 10.0)
                _DEFER[key] = (time.monotonic() + delay, delay)
                if not last:
                    log.warning("MLflow at %s unreachable (%s): keeping metrics of run %s in %s until it answers",
                                self.uri, _short(err), run_id, self._spool_path(run_id) or "memory")
                if wait:
                    raise
                return False
            if spooled:
                self._rewrite(run_id, points[i + _BATCH:])
        _DEFER.pop(key, None)
        return True

    def _deferred(self, run_id: str) -> bool:
        until, _ = _DEFER.get((self.uri, run_id), (0.0, 0.0))
        return time.monotonic() < until

    def _spool_path(self, run_id: str) -> Path | None:
        if not self.artifact_root:
            return None
        return Path(self.artifact_root).resolve().parent / SPOOL_DIR / f"{run_id}.jsonl"

    def _pending(self, run_id: str) -> list[list[Point]]:
        """The run's unsent batches, oldest first: the spool file is the truth when there is one."""
        path = self._spool_path(run_id)
        if path is None:
            return _MEMORY.get((self.uri, run_id), [])
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [[tuple(p) for p in json.loads(line)] for line in lines if line.strip()]

    def _spool(self, run_id: str, points: list[Point]) -> None:
        """Append `points` to the run's pending metrics (one line per chunk, flushed to disk)."""
        if not points:
            return
        path = self._spool_path(run_id)
        if path is None:
            _MEMORY.setdefault((self.uri, run_id), []).extend(
                [points[i:i + _BATCH] for i in range(0, len(points), _BATCH)])
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for i in range(0, len(points), _BATCH):
                f.write(json.dumps([list(p) for p in points[i:i + _BATCH]]) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self, run_id: str, points: list[Point]) -> None:
        """Make `points` the run's whole pending list (the spool file replaced atomically)."""
        path = self._spool_path(run_id)
        if path is None:
            _MEMORY.pop((self.uri, run_id), None)
            self._spool(run_id, points)
            return
        if not points:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            for i in range(0, len(points), _BATCH):
                f.write(json.dumps([list(p) for p in points[i:i + _BATCH]]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _reject(self, run_id: str, points: list[Point]) -> None:
        path = self._spool_path(run_id)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.with_suffix(".rejected.jsonl").open("a") as f:
                f.write(json.dumps([list(p) for p in points]) + "\n")
        log.error("MLflow refused %d metric points of run %s%s", len(points), run_id,
                  f" (kept in {path.with_suffix('.rejected.jsonl')})" if path else "")

    def _send_leftovers(self) -> None:
        """One attempt to send the spools that earlier (killed) processes left in this workdir."""
        path = self._spool_path("x")
        if path is None or not path.parent.is_dir():
            return
        for spool in sorted(path.parent.glob("*.jsonl")):
            run_id = spool.name.removesuffix(".jsonl")
            if _RUN_ID.match(run_id) and not self._deferred(run_id):
                try:
                    self.flush(run_id, wait=False)
                except Exception as err:  # noqa: BLE001 - someone else's leftovers never stop a new run
                    log.warning("MLflow: could not send the kept metrics of run %s: %s", run_id, _short(err))

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        client = self.client()
        for i in range(0, len(items), 90):
            client.log_batch(run_id, params=items[i : i + 90])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

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

    def register_checkpoint(self, model_name: str, checkpoint: Path, run_id: str, alias: str,
                            parent: str | None = None, lineage: dict[str, str] | None = None) -> str:
        """Register a checkpoint directory as a model version and point `alias` at it.

        Lineage: the version is tagged with `lineage` (pipeline run, Prefect flow run and its URL,
        recipe hash, data) and, when `parent` (the checkpoint the stage started from) is a
        registered version, `stagewise.parent_version`, so a person can walk back from any
        version to the data it was trained on."""
        client = self.client()
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        try:
            client.create_registered_model(model_name)
        except MlflowException as err:
            if is_transient(err):
                raise
            # already registered: versions accumulate under one name
        checkpoint = Path(checkpoint).resolve()
        source, kept = self._model_source(client, checkpoint, run_id)
        tags = {STAGE_TAG: alias, "stagewise.checkpoint": str(checkpoint), "stagewise.weights": kept,
                **{k: v for k, v in (lineage or {}).items() if v}}
        parent_version = self._version_of(client, model_name, parent) if parent else None
        if parent_version is not None:
            tags |= {"stagewise.parent_version": parent_version, "stagewise.parent_checkpoint": str(Path(parent).resolve())}
        version = client.create_model_version(model_name, source=source, run_id=run_id, tags=tags)
        client.set_registered_model_alias(model_name, alias, version.version)
        return str(version.version)

    def _version_of(self, client: Any, model_name: str, checkpoint: str) -> str | None:
        """The newest registered version of `model_name` made from `checkpoint` (None if none)."""
        wanted = str(Path(checkpoint).resolve())
        versions = client.search_model_versions(f"name = '{model_name}'")
        found = [int(v.version) for v in versions if (v.tags or {}).get("stagewise.checkpoint") == wanted]
        return str(max(found)) if found else None

    def _model_source(self, client: Any, checkpoint: Path, run_id: str) -> tuple[str, str]:
        """Where a registered version points, and how ("artifact" or "reference"). A checkpoint up to
        `inline_weights_mb` is kept in the run's artifacts under `checkpoints/<name>` (hard-linked on a
        local artifact store, copied when links fail, uploaded when the artifacts are remote); a
        larger one is referenced by its path. A tracking server accepts a local path only inside the
        run's artifacts (else INVALID_PARAMETER_VALUE), so there every checkpoint goes in."""
        size_mb = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file()) / 2**20
        remote = self.uri.startswith(("http://", "https://"))
        if not remote and size_mb > self.inline_weights_mb:
            return str(checkpoint), "reference"
        artifact_uri = client.get_run(run_id).info.artifact_uri
        if artifact_uri.startswith("file:"):
            from mlflow.utils.file_utils import local_file_uri_to_path  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

            dest = Path(local_file_uri_to_path(artifact_uri)) / "checkpoints" / checkpoint.name
            shutil.copytree(checkpoint, dest, copy_function=_link_or_copy, dirs_exist_ok=True)
            return str(dest.resolve()), "artifact"
        client.log_artifacts(run_id, str(checkpoint), f"checkpoints/{checkpoint.name}")
        return f"runs:/{run_id}/checkpoints/{checkpoint.name}", "artifact"

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

    def run_seconds(self, run_id: str) -> float | None:
        """How long a finished run ran (its start to its end), None while it runs: what a reused
        stage cost when it was trained."""
        info = self.client().get_run(run_id).info
        if info.start_time is None or info.end_time is None:
            return None
        return round((info.end_time - info.start_time) / 1000, 1)

    def carry_over(self, run_id: str, stage_dir: str, until_step: int) -> str | None:
        """Copy into `run_id` the metric history, up to `until_step`, of the latest other run
        that trained `stage_dir`; returns that run's id (None when there is none).

        A stage resumed with `--resume` opens a new run; without its predecessor's history a
        gate would measure relative thresholds from the resume point and the loss plots would
        start there. Points after `until_step` (the checkpoint resumed from) are left out:
        training repeats them."""
        from mlflow.entities import Metric  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        client = self.client()
        quote = '"' if "'" in stage_dir else "'"  # a path may hold one kind of quote; MLflow takes either
        runs = client.search_runs([self.experiment_id()], f"tags.`stagewise.stage_dir` = {quote}{stage_dir}{quote}",
                                  order_by=["attributes.start_time DESC"], max_results=10)
        source = next((r for r in runs if r.info.run_id != run_id), None)
        if source is None:
            return None
        keys = client.get_run(source.info.run_id).data.metrics  # after sending what a killed process kept
        points = [Metric(m.key, m.value, m.timestamp, m.step) for key in keys
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

    def nested_runs(self, run_id: str) -> list[StageRun]:
        """The runs nested directly under `run_id` (tag `mlflow.parentRunId`), oldest first: SFT's
        sub-stage runs under its stage run, distillation's rounds and teachers under its run."""
        client = self.client()
        experiment_id = client.get_run(run_id).info.experiment_id
        runs, token = [], None
        while True:
            page = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'",
                                      order_by=["attributes.start_time ASC"], max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
        return [StageRun(r.info.run_id, r.info.run_name or "", r.data.tags.get(STAGE_TAG, ""), r.info.status,
                         r.info.start_time or 0, dict(r.data.tags)) for r in runs]

    def stages_in(self, experiment: str | None = None) -> list[str]:
        """The distinct `stagewise.stage` tags of an experiment's runs (for error messages)."""
        client = self.client()
        exp = client.get_experiment_by_name(experiment or self.experiment)
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        return sorted({r.data.tags[STAGE_TAG] for r in runs if STAGE_TAG in r.data.tags})

    # ------------------------------------------------------------------ registry aliases (promotion)

    def version_of_run(self, model_name: str, run_id: str) -> dict[str, str] | None:
        """The newest version of `model_name` registered from run `run_id`, as {version, source,
        checkpoint} (checkpoint: the `stagewise.checkpoint` tag, else the source); None when none."""
        versions = self.client().search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
        if not versions:
            return None
        v = max(versions, key=lambda v: int(v.version))
        return {"version": str(v.version), "source": v.source,
                "checkpoint": (v.tags or {}).get("stagewise.checkpoint", v.source)}

    def registered(self, model_name: str, alias: str) -> dict[str, str] | None:
        """{version, checkpoint} of the version `alias` points at (None when there is none yet)."""
        version = self.alias_holder(model_name, alias)
        if version is None:
            return None
        v = self.client().get_model_version(model_name, version)
        return {"version": str(v.version), "checkpoint": (v.tags or {}).get("stagewise.checkpoint", v.source)}

    def alias_holder(self, model_name: str, alias: str) -> str | None:
        """The version `alias` points at (None when the alias or the registered model does not exist)."""
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 (mlflow: 1.3 s to import on 2 cores, paid only where MLflow is talked to)

        try:
            model = self.client().get_registered_model(model_name)
        except MlflowException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        held = (model.aliases or {}).get(alias)
        return None if held is None else str(held)

    def set_alias(self, model_name: str, alias: str, version: str, tags: dict[str, str] | None = None) -> None:
        """Point `alias` at `version` (moving it from wherever it was), tagging that version with `tags`."""
        client = self.client()
        client.set_registered_model_alias(model_name, alias, str(version))
        for key, value in (tags or {}).items():
            client.set_model_version_tag(model_name, str(version), key, str(value))


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


class _Client:
    """An MlflowClient seen through a Tracker: a call naming a run first sends that run's
    pending metrics (so reads see every point and writes keep their order), and every call
    retries transient errors for up to `retry_seconds`."""

    def __init__(self, tracker: Tracker, raw: Any):
        self._tracker, self._raw = tracker, raw

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._raw, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            run_id = kwargs.get("run_id", args[0] if args else None)
            if isinstance(run_id, str) and _RUN_ID.match(run_id):
                self._tracker.flush(run_id)
            return self._tracker._retrying(attr, *args, **kwargs)

        return call


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (no second copy of the weights), or a copy across filesystems."""
    Path(dst).unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _short(exc: BaseException) -> str:
    """One line for a log: "[Errno 111] Connection refused (runs/log-batch)" rather than
    MLflow's three nested reprs of it."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    cause = re.search(r"\[Errno \d+\][^\"')]*", text)
    endpoint = re.search(r"/api/[\d.]+/mlflow/([\w/-]+)", text)
    if cause:
        text = cause.group(0).strip() + (f" ({endpoint.group(1)})" if endpoint else "")
    return text if len(text) <= 300 else text[:300] + "..."


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
