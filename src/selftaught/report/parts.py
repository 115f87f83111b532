"""Pieces every report page shows: the header with the run's status and notes, and an
estimate (accuracy with its 95% interval) as text, as a table cell and as a chart point."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from selftaught.report.html import Html, join, tag
from selftaught.report.runs import Estimate, Run
from selftaught.report.svg import Point


def point(x: float, e: Estimate | None, what: str) -> Point:
    if e is None:
        return Point(x, math.nan)
    return Point(x, e.value, e.lo, e.hi, f"{what}: {e.text()}")


def header(kind: str, run: Run, task: str) -> Html:
    """Title, run directory, status (finished / not yet / stopped by an error) and notes."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    status = run.status
    cls = "error" if status.error else ("finished" if status.finished else "unfinished")
    text = status.text + (f" — {status.error}" if status.error else "")
    notes = join(tag("li", n) for n in run.notes)
    return join(
        [
            tag("h1", f"selftaught {kind} · {task}"),
            tag("p", f"{run.root.resolve()} · report generated {stamp}", class_="sub"),
            tag("div", text, class_=f"status {cls}", id="status"),
            tag("ul", notes, class_="notes", id="notes") if run.notes else Html(""),
        ]
    )


def change(a: Estimate | None, b: Estimate | None) -> str:
    if a is None and b is None:
        return "–"
    if b is None:
        return f"{a.value:.3f} → …"  # type: ignore[union-attr]
    if a is None:
        return f"… → {b.value:.3f}"
    return f"{a.value:.3f} → {b.value:.3f}"


def ci_text(e: Estimate | None) -> str:
    return e.text() if e is not None else ""


def estimate_cell(e: Estimate | None) -> Html:
    """A table cell: the value (and counts) on one line, the 95% interval under it."""
    if e is None:
        return Html("–")
    counts = f" ({e.solved}/{e.n})" if e.solved is not None and e.n else ""
    ci = tag("div", f"{e.lo:.3f}–{e.hi:.3f}", class_="d") if e.lo is not None else Html("")
    return tag("b", f"{e.value:.3f}") + counts + ci
