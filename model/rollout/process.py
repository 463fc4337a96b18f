"""Rollouts in a separate worker process, so sampling and training overlap on a CPU.

    gen = ProcessGenerator(policy, end_ids=[im_end], pad_id=0, threads=1)   # starts the worker
    gen.sync_weights(policy.state_dict())
    groups = gen.generate(prompts, n=8, max_new_tokens=16, temperature=1.0, seed=7)
    gen.close()                                                            # or `with ProcessGenerator(...)`

Why a process: one-step off-policy samples step s+1 in a background *thread* while step s
trains, but transformers' `generate` and a tiny model's training step are mostly Python, so
the two threads take turns on the GIL, and both use torch's intra-op threads on the same
cores. Measured on a 2-core CPU: off-policy in a thread ran at 0.75x the synchronous mode's
tokens/s. Here the worker process has its own interpreter (no shared GIL) and its own torch
thread count (`threads`), and the caller blocks in a pipe read, which releases the GIL.

The worker holds an `HFGenerator` (model/rollout/hf.py) over a copy of the policy, so the
results are exactly an in-process HFGenerator's with the same weights, seed, thread count and
`precision` (its sampler is a private seeded torch.Generator; "bf16" casts the worker's copy).
Every call is one request and one reply over a multiprocessing Pipe: `sync_weights` too, so
when it returns the worker has loaded the weights and the caller may change its tensors.

Messages are plain-pickled bytes (`send_bytes`), not `Connection.send`: with torch imported,
multiprocessing's pickler would move every sent tensor into shared memory in place, the
caller's live parameters included. Plain pickling copies tensors (8 MB for the tiny model);
the policy itself is pickled once at start (a CPU copy: transformers' model class, and the MTP
heads of model/mtp.py when attached, unpickle by import in the worker).

The worker starts with the "spawn" method (a fork of a process holding OpenMP threads can
hang). Spawn re-imports the parent's `__main__` script in the worker (guarded code does not
run), as any spawned multiprocessing child does.

Failures: an exception in the worker comes back and is raised in the caller (its original
type when it unpickles, else RuntimeError) with the worker's traceback as its `__cause__`;
the worker keeps serving. A worker that died raises RuntimeError naming its exit code.
`close()` (also on garbage collection, at exit, and leaving a `with` block) stops the worker;
it is idempotent, and a closed generator raises RuntimeError.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import pickle
import signal
import threading
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Any, Literal

import torch
from transformers.utils import logging as hf_logging

from stagewise.model.rollout import Rollout

START_TIMEOUT_S = 300.0
"""How long the worker may take to import torch/transformers and load the model."""
STOP_TIMEOUT_S = 10.0
"""How long close() waits for the worker to exit before terminating it."""


class RemoteTraceback(Exception):
    """The worker's traceback text, attached as `__cause__` of a re-raised worker exception."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n(in the rollout worker)\n{self.text}\"\"\""


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _error_reply(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        pickled = _dumps(exc)
        pickle.loads(pickled)
    except Exception:  # an exception that does not round-trip: its text still does
        pickled = None
    return _dumps(("error", (pickled, f"{type(exc).__name__}: {exc}", text)))


def _serve(conn: Connection, threads: int) -> None:
    """The worker's loop: one request in, one reply out, until "close" or the pipe closes."""
    # Ctrl-C reaches the whole process group: the caller decides when its worker stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    stderr_file = os.environ.get("STAGEWISE_WORKER_STDERR")  # cli/run_log.py: a quiet run's log file
    if stderr_file:
        with open(stderr_file, "ab") as f:
            os.dup2(f.fileno(), 2)
    try:
        from transformers.utils import logging as hf_logging  # noqa: PLC0415 (a failure here is sent back to the parent)

        from stagewise.model.rollout.hf import HFGenerator  # noqa: PLC0415 (a failure here is sent back to the parent)

        model_bytes, end_ids, pad_id, batch_rows, verbosity, precision = pickle.loads(conn.recv_bytes())
        hf_logging.set_verbosity(verbosity)
        generator = HFGenerator(pickle.loads(model_bytes), end_ids, pad_id, batch_rows=batch_rows, precision=precision)
        del model_bytes
        conn.send_bytes(_dumps(("ok", None)))
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, which raises it
        conn.send_bytes(_error_reply(exc))
        return
    while True:
        try:
            op, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the caller went away
            return
        if op == "close":
            conn.send_bytes(_dumps(("ok", None)))
            return
        try:
            result = getattr(generator, op)(*args)
            reply = _dumps(("ok", result))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which raises it
            reply = _error_reply(exc)
        try:
            conn.send_bytes(reply)
        except OSError:  # the caller went away mid-request
            return


def _stop(process: mp.process.BaseProcess, conn: Connection) -> None:
    """Ask the worker to exit, wait a little, then terminate it; safe to call on a dead worker."""
    try:
        if process.is_alive():
            conn.send_bytes(_dumps(("close", ())))
            if conn.poll(STOP_TIMEOUT_S):
                conn.recv_bytes()
    except (EOFError, OSError):
        pass
    process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(STOP_TIMEOUT_S)
    conn.close()


class ProcessGenerator:
    """An HFGenerator in a worker process (see the module docstring). Thread-safe: calls from
    several threads are served one at a time."""

    def __init__(self, policy: torch.nn.Module, end_ids: list[int], pad_id: int, threads: int = 1,
                 batch_rows: int = 128, precision: Literal["trainer", "bf16"] = "trainer"):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if precision not in ("trainer", "bf16"):
            raise ValueError(f"precision must be trainer or bf16, got {precision!r}")
        # a CPU copy (the caller's model may live on a GPU, and stays untouched)
        model_bytes = _dumps(copy.deepcopy(policy).cpu().eval().requires_grad_(False))

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=_serve, args=(child, threads), name="rollout-worker", daemon=True)
        self._process.start()
        child.close()  # only the worker holds its end: its death reads as EOF here
        self._finalizer = weakref.finalize(self, _stop, self._process, self._conn)
        self._lock = threading.Lock()
        self._closed = False
        self._dead: str | None = None
        self.threads, self.precision = threads, precision
        with self._lock:
            self._request("start", (model_bytes, list(end_ids), pad_id, batch_rows, hf_logging.get_verbosity(),
                                    precision), timeout=START_TIMEOUT_S)

    # ------------------------------------------------------------------ the Generator protocol

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self._call("sync_weights", {k: v.detach().cpu() for k, v in state_dict.items()})

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Rollout]]:
        return self._call("generate", [list(p) for p in prompts], n, max_new_tokens, temperature, seed)

    def token_logprobs(self, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        return self._call("token_logprobs", input_ids.detach().cpu(), temperature)

    # ------------------------------------------------------------------ lifetime

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def close(self) -> None:
        """Stop the worker (waits for a call in flight); idempotent."""
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> ProcessGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"ProcessGenerator.{op}: the generator is closed (its worker was stopped)")
            if self._dead is not None:
                raise RuntimeError(self._dead)
            return self._request(op, args)

    def _request(self, op: str, args: Any, timeout: float | None = None) -> Any:
        """Send one request and wait for its reply (the lock is held)."""
        try:
            if op == "start":
                self._conn.send_bytes(_dumps(args))
            else:
                self._conn.send_bytes(_dumps((op, args)))
            if timeout is not None and not self._conn.poll(timeout):
                raise TimeoutError(f"the rollout worker did not start within {timeout:.0f} s")
            status, payload = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:  # the pipe broke: the worker is gone
            self._process.join(STOP_TIMEOUT_S)
            self._dead = (f"the rollout worker (pid {self._process.pid}) died (exit code {self._process.exitcode}) "
                          f"during {op}; create a new generator")
            if op == "start":  # the usual cause: spawn re-ran an unguarded main script, which started another
                self._dead += (" (its stderr says why; a spawned worker re-imports the main script, so a script "
                               "must create generators under `if __name__ == '__main__':`)")
            self._finalizer()
            raise RuntimeError(self._dead) from exc
        except BaseException:  # interrupted mid-request: the reply would pair with the next request
            self._dead = f"a {op} request to the rollout worker was interrupted; the worker was stopped"
            self._finalizer()
            raise
        if status == "ok":
            return payload
        pickled, summary, text = payload
        exc: BaseException
        try:
            exc = pickle.loads(pickled) if pickled is not None else RuntimeError(f"rollout worker: {summary}")
        except Exception:  # noqa: BLE001 - its class may not import here
            exc = RuntimeError(f"rollout worker: {summary}")
        if op == "start":
            self._dead = f"the rollout worker failed to start: {summary}"
            self._finalizer()
        raise exc from RemoteTraceback(text)


__all__ = ["ProcessGenerator", "RemoteTraceback"]
