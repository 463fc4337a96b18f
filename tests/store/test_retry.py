"""Which failures are retried (store.retry.is_transient) and the backoff that retries them.

The MLflow errors are the real ones: a client pointed at a closed port, and a local store
asked for a run that does not exist.
"""

from __future__ import annotations

import socket

import httpx
import pytest
import requests
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException
from prefect.states import Completed, Failed
from pydantic import BaseModel, ValidationError

from stagewise.data.loader import DataExhausted
from stagewise.eval.gates import UnknownMetricError
from stagewise.model.trainer import TrainingDiverged
from stagewise.store.retry import backoff_delays, call_with_backoff, is_transient, retry_if_transient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rest(code: str) -> RestException:
    return RestException({"error_code": code, "message": f"server said {code}"})


def _http_status(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1/api")
    return httpx.HTTPStatusError("status", request=request, response=httpx.Response(status, request=request))


def _requests_http(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


def _wrapped(outer: Exception, inner: BaseException) -> Exception:
    """`outer` raised while handling `inner` (as MLflow wraps requests errors)."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer
    except Exception as err:
        return err


def test_a_real_mlflow_client_facing_a_closed_port_is_transient(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(MlflowException) as caught:
        client.get_experiment_by_name("x")
    assert "Max retries exceeded" in str(caught.value)
    assert is_transient(caught.value)


def test_a_real_missing_run_is_not_transient(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(MlflowException) as caught:
        client.get_run("0" * 32)
    assert caught.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert not is_transient(caught.value)


@pytest.mark.parametrize("exc", [
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    BrokenPipeError(),
    TimeoutError("timed out"),
    socket.timeout("timed out"),
    requests.exceptions.ConnectionError("refused"),
    requests.exceptions.ReadTimeout("read timed out"),
    _requests_http(503),
    httpx.ConnectError("refused"),
    httpx.ReadTimeout("timed out"),
    _http_status(502),
    _http_status(429),
    _rest("TEMPORARILY_UNAVAILABLE"),
    _rest("INTERNAL_ERROR"),
    _rest("REQUEST_LIMIT_EXCEEDED"),
    MlflowException("API request to http://x/api failed with exception Max retries exceeded with url: /api"),
    MlflowException("(sqlite3.OperationalError) database is locked"),
    _wrapped(RuntimeError("task failed"), ConnectionRefusedError()),
], ids=repr)
def test_transient(exc):
    assert is_transient(exc)


class _Cfg(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Cfg(n="many")
    except ValidationError as err:
        return err
    raise AssertionError


@pytest.mark.parametrize("exc", [
    ValueError("bad recipe"),
    _validation_error(),
    FileNotFoundError(2, "No such file", "data.jsonl"),
    PermissionError(13, "denied"),
    UnknownMetricError("gate names eval/x/acc; the run has eval/y/acc"),
    TrainingDiverged(7, "loss", float("nan"), None),
    DataExhausted("every source hit its epoch cap"),
    _rest("RESOURCE_DOES_NOT_EXIST"),
    _rest("INVALID_PARAMETER_VALUE"),
    _rest("RESOURCE_ALREADY_EXISTS"),
    _http_status(404),
    _http_status(501),
    _requests_http(400),
    MlflowException("Invalid metric name"),
    KeyError("train/loss"),
    _wrapped(RuntimeError("task failed"), FileNotFoundError("x")),
    None,
], ids=repr)
def test_not_transient(exc):
    assert not is_transient(exc)


def test_retry_condition_for_prefect_reads_the_failed_states_exception():
    assert retry_if_transient(None, None, Failed(data=ConnectionRefusedError()))
    assert not retry_if_transient(None, None, Failed(data=TrainingDiverged(7, "loss", float("nan"), None)))
    assert not retry_if_transient(None, None, Completed(data=1))


def test_backoff_doubles_is_capped_and_fits_the_budget():
    assert backoff_delays(10, first_s=0.5, cap_s=4) == [0.5, 1, 2, 4]
    assert backoff_delays(30, first_s=1, cap_s=8) == [1, 2, 4, 8, 8]
    assert backoff_delays(0) == []
    assert sum(backoff_delays(120)) <= 120


def test_call_with_backoff_retries_transient_errors_until_they_pass():
    calls, slept = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("refused")
        return "ok"

    assert call_with_backoff(flaky, 10, first_s=1, sleep=slept.append) == "ok"
    assert len(calls) == 3 and len(slept) == 2 and slept[1] > slept[0] >= 1


def test_call_with_backoff_never_retries_a_deterministic_error():
    calls, slept = [], []

    def bad():
        calls.append(1)
        raise _rest("RESOURCE_DOES_NOT_EXIST")

    with pytest.raises(RestException):
        call_with_backoff(bad, 60, sleep=slept.append)
    assert calls == [1] and slept == []


def test_call_with_backoff_gives_up_after_the_budget_with_the_last_error():
    slept = []

    def down():
        raise ConnectionRefusedError(f"attempt {len(slept) + 1}")

    with pytest.raises(ConnectionRefusedError, match="attempt 4"):
        call_with_backoff(down, 3.5, first_s=0.5, sleep=slept.append)
    assert len(slept) == 3 and sum(slept) <= 3.5 * 1.1
