"""Which errors are worth retrying, and a bounded exponential backoff to retry them with.

A pipeline that talks to an MLflow server and a Prefect API over the network sees two kinds
of failure: transient ones (connection refused or reset while a server restarts, timeouts,
HTTP 5xx, 429 "slow down") that the same call, a little later, gets past; and deterministic
ones (a bad recipe, a missing input file, a gate that stops the stage, a diverged loss, a
4xx such as RESOURCE_DOES_NOT_EXIST) that every retry would hit again. `is_transient` tells
them apart by walking the exception and its causes; `retry_if_transient` is the same test in
the shape of Prefect's `retry_condition_fn`; `call_with_backoff` retries a call on transient
errors within a time budget.

MLflow is used only through store/tracking.py, so this module never imports it: it
recognises MLflow's REST errors through `sys.modules` (an MLflow exception can only exist
once MLflow has been imported).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses a later identical request may get past (MLflow's own retry list)."""

_TRANSIENT_TEXT = (
    "max retries exceeded",  # requests/urllib3 gave up reaching the server (MLflow wraps it)
    "failed with timeout exception",  # MLflow's wording for a requests timeout
    "connection refused",
    "connection reset",
    "connection aborted",
    "remote end closed connection",
    "temporarily unavailable",
    "database is locked",  # SQLite busy with another writer
)


def is_transient(exc: BaseException | None) -> bool:
    """True when retrying the same call later may succeed: connection refused/reset,
    timeouts, HTTP 5xx/408/429 (MLflow, requests, httpx), MLflow's "Max retries exceeded",
    SQLite's "database is locked". False for everything else: configuration and validation
    errors, missing files, gate stops, divergence, HTTP 4xx."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        verdict = _classify(exc)
        if verdict is not None:
            return verdict
        exc = exc.__cause__ or exc.__context__
    return False


def _classify(exc: BaseException) -> bool | None:
    """True/False when this exception alone decides; None to look at its cause."""
    if isinstance(exc, (ConnectionError, TimeoutError)):  # refused, reset, aborted, broken pipe, socket timeout
        return True
    if isinstance(exc, (KeyboardInterrupt, SystemExit, FileNotFoundError, PermissionError)):
        return False
    status = _http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP or (status >= 500 and status != 501)
    if _is_network_error(exc):
        return True
    if _is_mlflow_error(exc) and any(t in str(exc).lower() for t in _TRANSIENT_TEXT):
        return True
    return None


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception reports: MLflow's RestException (from its error code),
    requests' HTTPError and httpx's HTTPStatusError (from the response)."""
    mlflow_exceptions = sys.modules.get("mlflow.exceptions")
    if mlflow_exceptions is not None and isinstance(exc, mlflow_exceptions.RestException):
        return int(exc.get_http_status_code())
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _is_network_error(exc: BaseException) -> bool:
    requests_exc = sys.modules.get("requests.exceptions")
    if requests_exc is not None and isinstance(
        exc, (requests_exc.ConnectionError, requests_exc.Timeout, requests_exc.RetryError, requests_exc.ChunkedEncodingError)
    ):
        return True
    urllib3_exc = sys.modules.get("urllib3.exceptions")
    if urllib3_exc is not None and isinstance(
        exc, (urllib3_exc.MaxRetryError, urllib3_exc.ProtocolError, urllib3_exc.TimeoutError, urllib3_exc.NewConnectionError)
    ):
        return True
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(exc, (httpx.TransportError,))


def _is_mlflow_error(exc: BaseException) -> bool:
    mlflow_exceptions = sys.modules.get("mlflow.exceptions")
    return mlflow_exceptions is not None and isinstance(exc, mlflow_exceptions.MlflowException)


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's `retry_condition_fn(task, task_run, state)`: retry only a transient failure.

    Prefect hands a Failed state whose data is the exception the task raised."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            exc = state.result(raise_on_failure=False)
        except Exception as err:  # noqa: BLE001 - an unreadable result is judged by what reading it raised
            exc = err
    return isinstance(exc, BaseException) and is_transient(exc)


def backoff_delays(budget_s: float, first_s: float = 0.5, cap_s: float = 8.0) -> list[float]:
    """Sleeps between attempts: first_s, 2x, 4x ... capped at cap_s, adding up to at most budget_s."""
    delays, total, delay = [], 0.0, first_s
    while total + delay <= budget_s:
        delays.append(delay)
        total += delay
        delay = min(delay * 2, cap_s)
    return delays


def call_with_backoff(
    fn: Callable[[], T],
    budget_s: float,
    *,
    first_s: float = 0.5,
    cap_s: float = 8.0,
    on_retry: Callable[[BaseException, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`fn()`, retried after transient errors with exponential backoff (plus up to 10% jitter)
    for at most about `budget_s` seconds of sleeping; a deterministic error, or a transient one
    after the budget is spent, propagates unchanged."""
    for delay in [*backoff_delays(budget_s, first_s, cap_s), None]:
        try:
            return fn()
        except Exception as exc:
            if delay is None or not is_transient(exc):
                raise
            delay *= 1 + 0.1 * random.random()
            if on_retry is not None:
                on_retry(exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")
