"""A rich progress bar for training: steps, tokens, loss, tokens/s.

Written to stderr so that stdout stays clean for `--json` output; when stderr is not a
terminal (CI, a log file, a Prefect worker) rich does not animate, and the bar prints its
final state once when it stops instead of escape codes.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TrainProgress:
    """Context manager; `update(step, tokens, loss, tok_s)` after each optimizer step."""

    def __init__(self, enabled: bool, total_steps: int, start_step: int, stage: str) -> None:
        self.enabled = enabled and total_steps > start_step  # no bar for a phase with nothing left to train
        self._bar = None
        if self.enabled:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[tokens]:,} tok"),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tok_s]:,.0f} tok/s"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task(
                stage, total=total_steps, completed=start_step, tokens=0, loss="-", tok_s=0.0
            )

    def __enter__(self) -> "TrainProgress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, step: int, tokens: int, loss: float, tok_s: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step, tokens=tokens, loss=f"{loss:.4f}", tok_s=tok_s)
