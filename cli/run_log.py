"""What a training run prints, and the log file that keeps everything else.

A run's terminal is for its user: our progress bars, the lines our stages log (a few per stage),
and every error. Left to themselves the libraries fill it: Prefect's lifecycle line for every
task run ("Beginning flow run", "Finished in state Completed()"), transformers' kernel fall-back
warnings, FutureWarnings and UserWarnings, weight-loading, lm-eval and modelopt progress bars.
So unless `--verbose`, the terminal keeps

    every record at ERROR or above, whoever logs it, but Prefect's exception records (a failed task or
    flow run's traceback, and its "Finished in state Failed" lines for bad input): the command ends
    with the error in one line (cli/output.py `guarded`: exit 2 for bad input), `--debug` shows them;
    records of our code (the `stagewise` loggers, and the Prefect run loggers when our code is the
    caller: `store.policy.run_logger`) at INFO and above;
    Prefect's own records at WARNING and above;

and drops library progress bars (tqdm, which they all use; ours are rich) and library `print`s
(modelopt announces every quantizer it inserts that way). Nothing is lost:
every record, shown or not, library warnings included (`warnings` is routed through logging),
goes to `<workdir>/logs/<UTC time>-<pid>.log`, and the Prefect UI still has every run line. A
rollout worker process (model/rollout/process.py) writes its stderr to the same file
(WORKER_STDERR_ENV), unless `--verbose`.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import sys
import time
from pathlib import Path

from stagewise.data.errors import BadInput

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LIBRARIES_THAT_PRINT = ("modelopt", "transformers", "accelerate", "peft", "datasets", "lm_eval", "torch")
"""Top-level packages whose `print` calls a quiet run sends to the log file (`<package>.print` logger)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
WORKER_STDERR_ENV = "STAGEWISE_WORKER_STDERR"
"""A file a worker process appends its stderr to (read by model/rollout/process.py)."""


class TerminalFilter(logging.Filter):
    """The rule of the module docstring, on a terminal handler (`tracebacks`: keep Prefect's exception records)."""

    def __init__(self, tracebacks: bool = False) -> None:
        import prefect

        super().__init__()
        self.prefect_dir = str(Path(prefect.__file__).parent) + os.sep
        self.tracebacks = tracebacks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("prefect") and not self.tracebacks and _reports_a_failure(record):
            return False
        if record.levelno >= logging.ERROR:
            return True
        if record.name == "stagewise" or record.name.startswith("stagewise."):
            return record.levelno >= logging.INFO
        if record.name.startswith("prefect"):
            ours = not record.pathname.startswith(self.prefect_dir)
            run_line = record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))
            return record.levelno >= logging.WARNING or (run_line and ours and record.levelno >= logging.INFO)
        return False


def _reports_a_failure(record: logging.LogRecord) -> bool:
    """A Prefect record that repeats a failure the command reports itself: one carrying a traceback, or
    one whose text names our BadInput (e.g. "Finished in state Failed('... BadInput: ...')")."""
    if record.exc_info:
        return True
    return record.levelno >= logging.ERROR and BadInput.__name__ in record.getMessage()


def quiet_libraries(verbose: bool) -> None:
    """Unless `verbose`, switch library progress bars off for this process and the ones it starts.

    Call before anything imports tqdm (torch, transformers and Prefect do): tqdm reads TQDM_DISABLE
    once, when it is first imported; subprocesses (rollout workers, engines) inherit it. Writes
    nothing: a run refused before it starts leaves no trace in its workdir."""
    if not verbose:
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def library_prints_to_log() -> None:
    """From now on, `print` called by a module of LIBRARIES_THAT_PRINT (to stdout) logs its text at INFO
    to the `<package>.print` logger instead: the log file keeps it, the terminal filter drops it.
    Everyone else's print, ours and a user's, prints. Idempotent."""
    shown = builtins.print
    if getattr(shown, "library_prints_to_log", False):
        return

    def print_or_log(*values: object, sep: str | None = " ", end: str | None = "\n", file=None, flush: bool = False):
        package = sys._getframe(1).f_globals.get("__name__", "").split(".")[0]
        if package in LIBRARIES_THAT_PRINT and (file is None or file is sys.stdout):
            text = _ANSI.sub("", (" " if sep is None else sep).join(map(str, values))).strip()
            if text:
                logger = logging.getLogger(f"{package}.print")
                logger.setLevel(logging.INFO)
                logger.info(text)
            return
        shown(*values, sep=sep, end=end, file=file, flush=flush)

    print_or_log.library_prints_to_log = True  # type: ignore[attr-defined]
    builtins.print = print_or_log


def start_run_log(workdir: str | Path, verbose: bool, tracebacks: bool = False) -> Path:
    """Route every record to a new log file under `<workdir>/logs/` and, unless `verbose`, filter the
    terminal by TerminalFilter (`tracebacks`, from --debug: Prefect's exception records shown too).
    Returns the log file's path. Called once the run's input has passed
    every check (flows/pipeline.py's `on_start`), after `quiet_libraries`."""
    quiet_libraries(verbose)
    import prefect.main  # noqa: F401 - Prefect configures logging here (its console on the root logger), and

    # skips the root logger for good when one of ours is there first: ours come after
    from transformers.utils import logging as hf_logging

    logging.captureWarnings(True)  # warnings.warn -> the py.warnings logger: filtered, and in the file
    hf_logging.disable_default_handler()  # transformers' own stderr handler: its records go to the root's
    hf_logging.enable_propagation()
    if not verbose:  # transformers' weight-loading bar asks tqdm for itself, past TQDM_DISABLE
        hf_logging.disable_progress_bar()
    logging.getLogger("stagewise").setLevel(logging.INFO)
    logs = Path(workdir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    if not verbose:
        library_prints_to_log()
        os.environ[WORKER_STDERR_ENV] = str(path)
        for handler in root.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.addFilter(TerminalFilter(tracebacks))
    root.addHandler(to_file)
    return path
