"""The progress bar and log lines of a skill run (quiet without `progress`); off a terminal,
where the bar shows nothing, a plain line a minute (`selftaught.progress_lines`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.progress_lines import ProgressLines, plain_lines_wanted


class RunProgress:
    """One bar (steps done, the stage, val current / best) and log lines printed above it."""

    def __init__(self, console: Console, show: bool):
        self.console = console
        self.show = show
        self._progress: Progress | None = None
        self._bar: Any = None
        self._lines = ProgressLines("optimize", None, enabled=False)
        self.stage = ""

    def log(self, msg: str) -> None:
        (self._progress.console if self._progress else self.console).print(msg, highlight=False)

    def bar(self, total: int, completed: int) -> Progress:
        """The bar, as a context manager that shows it while the run goes on."""
        self._progress = Progress(
            TextColumn("[bold]optimize"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stage]}"),
            TextColumn("{task.fields[scores]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.show,
            transient=True,
        )
        self._bar = self._progress.add_task(
            "optimize", total=total, completed=completed, stage="", scores=""
        )
        wanted = plain_lines_wanted(self.show, self.console)
        self._lines = ProgressLines(
            "optimize", total, enabled=wanted, unit="steps", start=completed
        )
        return self._progress

    def set_stage(self, stage: str, step: int | None = None) -> None:
        self.stage = f"step {step} · {stage}" if step else stage
        if self._progress is not None:
            self._progress.update(self._bar, stage=self.stage)
        self._lines.update(self._lines.done, note=self.stage)

    @property
    def active(self) -> bool:
        return self._progress is not None

    def update(self, completed: int, current: float, best: float) -> None:
        if self._progress is not None:
            self._progress.update(
                self._bar, completed=completed, scores=f"val current {current:.3f} best {best:.3f}"
            )
        self._lines.update(completed, note=f"val current {current:.3f} best {best:.3f}")
