"""Progress on a non-terminal: one plain line at most once a minute per long phase.

The rich bars (rollouts, an optimize run) are transient and show nothing when their console is
not a terminal (a log file, `nohup`, a CI job, a systemd night), so a run of an hour said
nothing until it ended. There, with progress on, a long phase prints a line like

    [selftaught] rollout: 24/40 · 0.40/s · 85 tok/s · 1m00s elapsed · ETA 40s

to stderr: done / total, the rate (items per second and, when the caller counts them, generated
tokens per second), the time so far and an estimate of what is left. A phase shorter than the
interval prints nothing; one that printed a line prints a last one when it ends.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

INTERVAL_S = 60.0
CLOCK: Callable[[], float] = time.monotonic  # the default clock (tests put a fake one here)


def plain_lines_wanted(progress: bool, console: Any = None) -> bool:
    """Whether a phase prints plain lines: progress is on and the bar's console (rich's
    default one when None) is not a terminal, so the bar shows nothing."""
    if not progress:
        return False
    if console is None:
        from rich import get_console

        console = get_console()
    return not console.is_terminal


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `2h04m`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLines:
    """The plain lines of one phase (`enabled` False: silent, nothing is computed)."""

    def __init__(
        self,
        phase: str,
        total: int | None,
        *,
        enabled: bool,
        stream: TextIO | None = None,
        clock: Callable[[], float] | None = None,
        interval_s: float = INTERVAL_S,
        unit: str = "",
        start: int = 0,
    ) -> None:
        self.phase, self.total, self.enabled = phase, total, enabled
        self.stream = stream
        self.clock, self.interval_s, self.unit = clock or CLOCK, interval_s, unit
        self.start = self.done = start  # done before this process started (a resumed run)
        self.tokens = 0
        self.note = ""
        self.printed = 0
        self.started = self.clock() if enabled else 0.0
        self._last = self.started

    def advance(self, n: int = 1, *, tokens: int = 0, note: str | None = None) -> None:
        """`n` more items done (`tokens` generated for them)."""
        self.update(self.done + n, tokens=self.tokens + tokens, note=note)

    def update(self, done: int, *, tokens: int | None = None, note: str | None = None) -> None:
        """Items done so far (absolute); prints when a line is due."""
        if not self.enabled:
            return
        self.done = done
        if tokens is not None:
            self.tokens = tokens
        if note is not None:
            self.note = note
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._print(now)

    def finish(self) -> None:
        """A last line, only when this phase printed one before (it was long)."""
        if self.enabled and self.printed:
            self._print(self.clock(), final=True)

    def line(self, now: float, final: bool = False) -> str:
        elapsed = max(now - self.started, 1e-9)
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        parts = [f"[selftaught] {self.phase}: {count}{self.unit and ' ' + self.unit}"]
        rate = (self.done - self.start) / elapsed
        parts.append(f"{rate:.2f}/s" if rate >= 0.1 else f"{rate * 60:.1f}/min")
        if self.tokens:
            parts.append(f"{self.tokens / elapsed:.0f} tok/s")
        parts.append(f"{duration(elapsed)} elapsed")
        if final:
            parts.append("done")
        elif self.total is not None and rate > 0 and self.done < self.total:
            parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)

    def _print(self, now: float, final: bool = False) -> None:
        stream = self.stream or sys.stderr
        print(self.line(now, final), file=stream, flush=True)
        self._last = now
        self.printed += 1
