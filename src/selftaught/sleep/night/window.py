"""Which rows of its window a night reads: the caps, and each client's fair share.

A night reads its window oldest first until `max_tasks` rows or `max_sessions` transcript
sessions are read; what is left after that stop waits for the next night. Before that, no
client may fill the night: each client (`mine.client_label`: an end user's key or label,
`anonymous`, `import:<file>`, `unknown` for rows that name none) is allowed at most
`client_allowance` rows, so that it holds no more than `max_client_share` of what the night
reads, or 1/k of it with k clients in the window (two clients may each hold half; a lone client
is not capped). The operator's rows (client `operator`, harvests of the operator's own agents)
are never capped but count in the total. A client's rows over its allowance are left out for
good, not queued: a flood today must not fill tomorrow's night instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from selftaught.sleep.intake.log import OPERATOR, Interaction
from selftaught.sleep.night.mine import client_label


@dataclass
class Take:
    """The rows a night reads, why it stopped early (the rest waits), and per client how many
    rows the window held, how many were read and how many were left out over its share."""

    rows: list[Interaction]
    capped: str | None = None
    allowance: int | None = None  # rows one client may contribute (None: no cap tonight)
    share: float = 1.0  # the share the allowance keeps each client under
    window: Counter[str] = field(default_factory=Counter)
    read: Counter[str] = field(default_factory=Counter)
    left_out: Counter[str] = field(default_factory=Counter)

    def clients(self) -> dict[str, dict[str, int]]:
        return {
            c: {"window": n, "read": self.read[c], "left_out": self.left_out[c]}
            for c, n in self.window.most_common()
        }

    def to_dict(self) -> dict[str, Any]:
        return {"allowance": self.allowance, "share": self.share, "clients": self.clients()}


def client_allowance(
    counts: dict[str, int], operator_rows: int, max_share: float, capacity: int
) -> tuple[int | None, float]:
    """(rows each capped client may contribute, the share that keeps it under): the largest A
    such that no client holds more than `share = max(max_share, 1/k)` of the rows read,
    A <= share * T(A), with T(A) = operator_rows + sum(min(c, A)) kept within `capacity`
    where it can be. (None, 1.0) when fewer than two clients (the operator counting as one)
    share the window. T(A) grows by the number of clients still above A, so the A that
    satisfy the share form an interval from 1: the first A that fails ends the search."""
    k = len(counts) + (operator_rows > 0)
    if k < 2 or not counts:
        return None, 1.0
    share = max(max_share, 1.0 / k)
    best, total = 1, operator_rows + len(counts)  # A = 1: every client's first row
    for a in range(2, max(counts.values()) + 1):
        total += sum(1 for c in counts.values() if c >= a)
        if a > share * total or total > capacity:
            break
        best = a
    return best, share


def take_fairly(
    rows: list[Interaction], max_tasks: int, max_sessions: int, max_client_share: float
) -> Take:
    """The rows (oldest first) a night reads from `rows` (see the module doc)."""
    labels = [client_label(it) for it in rows]
    capped_counts = Counter(c for c in labels if c != OPERATOR)
    operator_rows = len(labels) - sum(capped_counts.values())
    allowance, share = client_allowance(
        capped_counts, operator_rows, max_client_share, min(max_tasks, len(rows))
    )
    take = Take([], allowance=allowance, share=share, window=Counter(labels))
    sessions: set[str] = set()
    for it, label in zip(rows, labels, strict=True):
        if len(take.rows) >= max_tasks:
            take.capped = f"max_tasks ({max_tasks})"
            break
        if allowance is not None and label != OPERATOR and take.read[label] >= allowance:
            take.left_out[label] += 1
            continue
        sid = it.session_id or (it.meta.get("session_id") if isinstance(it.meta, dict) else None)
        session = None if sid is None else f"{it.client or ''}\0{sid}"  # a client's session
        if session is not None and session not in sessions:
            if len(sessions) >= max_sessions:
                take.capped = f"max_sessions ({max_sessions})"
                break
            sessions.add(session)
        take.rows.append(it)
        take.read[label] += 1
    return take
