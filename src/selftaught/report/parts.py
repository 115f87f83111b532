"""Pieces every report page shows: the header with the run's status and notes, and an
estimate (accuracy with its 95% interval) as text, as a table cell and as a chart point."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone

from selftaught.report.html import Html, details, join, table, tag
from selftaught.report.readers import Estimate, Failure, Run
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
    if b is None:
        return "–" if a is None else f"{a.value:.3f} → …"
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


MAX_FAILURES = 60  # per group: a long run's failures stay readable (the rest are counted)


def attempt_cell(f: Failure) -> Html:
    """The reply's head, or an episode's whole trajectory: each call with its arguments and
    result, then the final answer (every line escaped)."""
    if not f.trajectory:
        return tag("code", f.reply)
    return tag("ol", join(tag("li", tag("code", line)) for line in f.trajectory), class_="traj")


def failure_groups(failures: Sequence[Failure]) -> Html:
    """Failed examples grouped by where they failed, with the scorer's feedback."""
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(f.where, []).append(f)
    parts = []
    for i, (where, items) in enumerate(groups.items()):
        rows = [
            [
                f.example_id,
                attempt_cell(f),
                f.feedback + (f" (error: {f.error})" if f.error else ""),
                "yes" if f.truncated else "",
            ]
            for f in items[:MAX_FAILURES]
        ]
        more = len(items) - MAX_FAILURES
        what = "trajectory" if any(f.trajectory for f in items) else "reply (head)"
        body = table(["example", what, "scorer's feedback", "truncated"], rows)
        if more > 0:
            body += tag("p", f"… and {more} more (see the run's diagnostics/)", class_="empty")
        parts.append(details(f"{where} — {len(items)} failed", body, open_=i == 0))
    return join(parts) if parts else tag("p", "no failure recorded yet", class_="empty")
