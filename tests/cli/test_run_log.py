"""cli/run_log.py: a run's terminal shows our lines and errors; the log file under the workdir keeps everything."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import prefect
import pytest

from stagewise.cli.run_log import TerminalFilter

PREFECT_FILE = str(Path(prefect.__file__).parent / "task_engine.py")


def _record(name: str, level: int, pathname: str = "/somewhere/stagewise/flows/rl.py") -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "message", None, None)


@pytest.mark.parametrize("name, level, pathname, shown", [
    ("stagewise.flows", logging.INFO, "/x/flows/rl.py", True),
    ("prefect.task_runs", logging.INFO, "/x/flows/rl.py", True),           # run_logger() from our code
    ("prefect.task_runs", logging.INFO, PREFECT_FILE, False),              # "Finished in state Completed()"
    ("prefect.flow_runs", logging.WARNING, PREFECT_FILE, True),
    ("prefect", logging.INFO, PREFECT_FILE, False),                        # "Starting temporary server"
    ("transformers.integrations.hub_kernels", logging.WARNING, "/x/transformers/k.py", False),
    ("py.warnings", logging.WARNING, "/x/warnings.py", False),             # FutureWarning, UserWarning
    ("transformers.modeling_utils", logging.ERROR, "/x/transformers/m.py", True),  # an error from anyone
])
def test_the_terminal_keeps_ours_and_every_error(name, level, pathname, shown):
    assert TerminalFilter().filter(_record(name, level, pathname)) is shown


SCRIPT = """
import logging, sys, warnings
from stagewise.cli.run_log import start_run_log
path = start_run_log(sys.argv[1], verbose=sys.argv[2] == "verbose")
from prefect import flow, task
from stagewise.store.policy import run_logger

@task
def work():
    run_logger().info("OUR TASK LINE")
    warnings.warn("A LIBRARY FUTUREWARNING", FutureWarning)
    from transformers.utils import logging as hf_logging
    hf_logging.get_logger("transformers.some_module").warning("A TRANSFORMERS WARNING")
    import tqdm
    for _ in tqdm.tqdm(range(3), desc="A LIBRARY BAR"):
        pass
    from modelopt.torch.utils.logging import print_rank_0
    print_rank_0("\x1b[1mA MODELOPT PRINT\x1b[0m")

@flow
def pipeline():
    run_logger().info("OUR FLOW LINE")
    work()

pipeline()
print(path)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_quiet_run_keeps_the_rest_in_the_log_file(tmp_path, verbose):
    # as a user's shell has it: the suite's conftest quiets transformers and tqdm for its own processes
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "TRANSFORMERS_VERBOSITY")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "work"), "verbose" if verbose else "quiet"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = Path(proc.stdout.strip().splitlines()[-1])
    assert log.parent == tmp_path / "work" / "logs"
    kept = log.read_text()
    library = ("A LIBRARY FUTUREWARNING", "A TRANSFORMERS WARNING", "Finished in state Completed()")
    for line in ("OUR FLOW LINE", "OUR TASK LINE", *library):
        assert line in kept, (line, kept)
    for line in ("OUR FLOW LINE", "OUR TASK LINE"):
        assert line in proc.stderr
    for line in (*library, "A LIBRARY BAR"):
        assert (line in proc.stderr) is verbose, (line, proc.stderr)
    # a library's print: on the terminal only when verbose, else in the log file (colour codes stripped)
    assert ("A MODELOPT PRINT" in proc.stdout) is verbose and ("A MODELOPT PRINT" in kept) is not verbose


FAILING = """
import sys
from stagewise.cli.run_log import start_run_log
path = start_run_log(sys.argv[1], verbose=False, tracebacks=sys.argv[2] == "debug")
from prefect import flow, task
from stagewise.data.errors import BadInput

@task
def curate():
    raise BadInput("conversation 'c1': A BAD ROW")

@flow
def pipeline():
    curate()

try:
    pipeline()
except BadInput as e:
    print("THE COMMAND SAYS:", e, file=sys.stderr)
print(path)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_bad_input_in_a_task_leaves_its_tracebacks_in_the_log_file(tmp_path, debug):
    """Prefect logs a failed task's and flow's exception with its traceback and a "Finished in state
    Failed(... BadInput ...)" line per run; a quiet terminal shows the command's one line, the log file
    all of it, and --debug the tracebacks too."""
    proc = subprocess.run([sys.executable, "-c", FAILING, str(tmp_path / "work"), "debug" if debug else "quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = Path(proc.stdout.strip().splitlines()[-1]).read_text()
    assert "Traceback (most recent call last)" in kept and "A BAD ROW" in kept and "Failed" in kept
    assert "THE COMMAND SAYS: conversation 'c1': A BAD ROW" in proc.stderr
    assert ("Traceback (most recent call last)" in proc.stderr) is debug, proc.stderr[-3000:]
    assert (proc.stderr.count("A BAD ROW") > 1) is debug, proc.stderr[-3000:]  # quiet: the command's line alone


def test_prefect_failure_records_are_dropped_unless_tracebacks_are_asked_for():
    failed = logging.LogRecord("prefect.task_runs", logging.ERROR, PREFECT_FILE, 1,
                               "Finished in state Failed('Task run encountered an exception BadInput: x')", None, None)
    other = logging.LogRecord("prefect.flow_runs", logging.ERROR, PREFECT_FILE, 1, "Crashed: out of memory", None, None)
    assert TerminalFilter().filter(failed) is False and TerminalFilter(tracebacks=True).filter(failed) is True
    assert TerminalFilter().filter(other) is True  # a failure that is not bad input still shows its line
