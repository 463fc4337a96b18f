"""A lease per step directory: one live run builds a step, any other run that reaches it waits, then reuses it.

Two runs can reach one step: the weekly schedule fires while a run from the form trains the same
recipe, or two people press Run. Both would write the same `<kind>-<hash>` directory (checkpoints,
the finish marker) and corrupt each other. So a run *claims* a step before it looks at it (Marin's
executor takes the same kind of lease per step):

- The lease is `<step>/.lease` (who holds it: run, pid, host) whose modification time is its
  heartbeat, touched every HEARTBEAT_S by a thread of the holder. Taking or replacing it happens
  under an flock on `<step>/.lease.lock`, so two claimants never both win; the kernel drops the
  flock of a process that dies, so nothing waits on a dead lock.
- A claimant that finds a live lease waits (it says so in its log, as a Prefect task run
  `wait-for-step` that stays Running while it waits), polling every POLL_S: once the holder's
  finish marker is there it reuses the step like any finished one.
- A lease whose heartbeat is older than the TTL belongs to a holder that died (SIGKILL, a lost node),
  and so does one whose holder ran on this host under a pid that no longer exists (no need to wait
  out the TTL after a local crash): the claimant takes it over. The step's directory then holds an interrupted run, which continues
  only with `--resume` (flows/stage.py `resume_point`; without it the run stops naming the
  directory), so a step is never finished from half-written state.
- The holder releases the lease when it writes the finish marker, and when its stage run ends in
  any way (flows/stage.py `stage_run`).

STAGEWISE_LEASE_TTL_S and STAGEWISE_LEASE_HEARTBEAT_S change the timings (tests make a dead holder
expire in seconds).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

LEASE, GUARD = ".lease", ".lease.lock"
POLL_S = 2.0
"""How often a waiting run looks again."""


def ttl_s() -> float:
    """Seconds without a heartbeat after which a lease's holder counts as dead."""
    return float(os.environ.get("STAGEWISE_LEASE_TTL_S", "60"))


def heartbeat_s() -> float:
    """Seconds between a holder's heartbeats (well inside the TTL)."""
    return float(os.environ.get("STAGEWISE_LEASE_HEARTBEAT_S", str(max(ttl_s() / 6, 0.2))))


@contextmanager
def _guard(directory: Path):
    """The step's flock, held while its lease is read and replaced."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / GUARD, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(directory: Path) -> tuple[dict, float] | None:
    """The lease's holder and the age of its heartbeat, or None when there is none."""
    try:
        path = directory / LEASE
        return json.loads(path.read_text()), time.time() - path.stat().st_mtime
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _dead_here(holder: dict) -> bool:
    """The holder ran on this host and its process is gone: dead now, no need to wait out the TTL
    (a `--resume` right after a crash would otherwise wait a minute). Other hosts: the heartbeat tells."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def expired(holder: dict, age_s: float) -> bool:
    """Whether a lease whose heartbeat is `age_s` old belongs to a dead holder."""
    return age_s > ttl_s() or _dead_here(holder)


def describe(holder: dict) -> str:
    return f"run {holder.get('run') or '?'} (pid {holder.get('pid')} on {holder.get('host')})"


@dataclass
class Lease:
    """A lease this process holds, kept alive by its heartbeat thread until `release`."""

    directory: Path
    holder: dict
    took_over: dict | None = None
    """The dead holder whose expired lease this one replaced (None: the step was free)."""
    lost: bool = False
    """Set when another run replaced this lease (this process stalled past the TTL)."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Lease":
        threading.Thread(target=self._beat, name=f"lease-{self.directory.name}", daemon=True).start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            found = _read(self.directory)
            if found is None or found[0].get("id") != self.holder["id"]:
                self.lost = True
                return
            os.utime(self.directory / LEASE)

    def release(self) -> None:
        self._stop.set()
        with _guard(self.directory):
            found = _read(self.directory)
            if found is not None and found[0].get("id") == self.holder["id"]:
                (self.directory / LEASE).unlink()


def try_acquire(directory: Path, run: str | None) -> tuple[Lease | None, dict | None]:
    """(our lease, None) when the step was free or its holder dead; (None, the live holder) otherwise."""
    holder = {"id": uuid.uuid4().hex, "run": run, "pid": os.getpid(), "host": socket.gethostname(),
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with _guard(directory):
        found = _read(directory)
        if found is not None and not expired(*found):
            return None, found[0]
        tmp = directory / f"{LEASE}.tmp-{holder['id']}"
        tmp.write_text(json.dumps(holder))
        os.replace(tmp, directory / LEASE)
    return Lease(directory, holder, took_over=found[0] if found else None).start(), None


_HELD: dict[Path, Lease] = {}
_HELD_LOCK = threading.Lock()


def held() -> set[Path]:
    """The step directories this process holds leases on."""
    with _HELD_LOCK:
        return set(_HELD)


def claim(directory: str | Path, run: str | None, is_finished: Callable[[Path], bool],
          on_wait: Callable[[Path, dict], None] | None = None, on_takeover: Callable[[Path, dict], None] | None = None,
          ) -> Lease | None:
    """Claim the step at `directory` for the run `run`: None once it is finished (by anyone, maybe after
    waiting for its live holder), else the Lease this process now holds (it builds the step).

    `on_wait(directory, holder)` is called before waiting on a live holder (and returns when the wait
    is over: it may do the waiting itself through `wait_for`), `on_takeover(directory, dead_holder)`
    when an expired lease is replaced. A lease this process already holds is returned as it is."""
    directory = Path(directory).resolve()
    with _HELD_LOCK:
        if directory in _HELD:
            return _HELD[directory]
    while True:
        if is_finished(directory):
            return None
        lease, holder = try_acquire(directory, run)
        if lease is not None:
            if is_finished(directory):  # finished between the look and the lease: nothing to build
                lease.release()
                return None
            if lease.took_over is not None and on_takeover is not None:
                on_takeover(directory, lease.took_over)
            with _HELD_LOCK:
                _HELD[directory] = lease
            return lease
        if on_wait is not None:
            on_wait(directory, holder)
        else:
            wait_for(directory, is_finished)


def wait_for(directory: Path, is_finished: Callable[[Path], bool]) -> None:
    """Poll until the step is finished or its lease is gone or expired (then the caller claims again)."""
    while not is_finished(directory):
        found = _read(directory)
        if found is None or expired(*found):
            return
        time.sleep(POLL_S)


def release(directory: str | Path) -> None:
    """Release this process's lease on `directory`, if it holds one."""
    with _HELD_LOCK:
        lease = _HELD.pop(Path(directory).resolve(), None)
    if lease is not None:
        lease.release()


@contextmanager
def releasing_new():
    """Release, on the way out, every lease taken inside the block (a stage run's, however it ends)."""
    before = held()
    try:
        yield
    finally:
        for directory in held() - before:
            release(directory)
