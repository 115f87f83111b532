"""The candidate pool: every skill that passed the gate, with its per-val-item scores. Pure.

As in GEPA, the next step's parent is drawn from the per-instance Pareto front, not only the
single best: a candidate that is best on some val items keeps its chance to be improved on,
even when another is best on average. A merge pairs two front members that win on different
items (rules from one, demos from the other).

- front: for each val item, the candidates with the top score on it; a candidate whose set of
  such items is a strict subset of another's is dominated and dropped;
- parent: drawn among the front, each weighted by how many items it is on top of;
- merge pair: the two front members whose won items differ the most (ties: the better sum).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ItemScores = Mapping[str, float | None]


@dataclass(frozen=True)
class Member:
    """A pool member: its version and per-val-item metric (None: errored, counts as 0)."""

    version: str
    scores: ItemScores

    def total(self) -> float:
        return sum(v or 0.0 for v in self.scores.values())


def top_items(members: Sequence[Member]) -> dict[str, set[str]]:
    """version -> the val items on which it has the top score (ties: all of them)."""
    items = sorted({i for m in members for i in m.scores})
    tops: dict[str, set[str]] = {m.version: set() for m in members}
    for item in items:
        best = max((m.scores.get(item) or 0.0) for m in members)
        if best <= 0.0:
            continue  # nobody solves it: it says nothing about who is better
        for m in members:
            if (m.scores.get(item) or 0.0) >= best - 1e-9:
                tops[m.version].add(item)
    return tops


def pareto_front(members: Sequence[Member]) -> list[Member]:
    """Members that are on top of some val item and not dominated; in pool order. With no
    item solved by anyone, the best total (the first one) stands alone."""
    if not members:
        return []
    tops = top_items(members)
    alive = [m for m in members if tops[m.version]]
    front = [
        m
        for m in alive
        if not any(
            tops[m.version] < tops[o.version]
            or (tops[m.version] == tops[o.version] and _earlier_better(o, m, members))
            for o in alive
            if o is not m
        )
    ]
    return front or [max(members, key=lambda m: m.total())]


def _earlier_better(o: Member, m: Member, members: Sequence[Member]) -> bool:
    """Of two members on top of the same items, keep one: the better total, then the
    earlier (a later copy adds no diversity)."""
    if o.total() != m.total():
        return o.total() > m.total()
    return members.index(o) < members.index(m)


def pick_parent(members: Sequence[Member], rng: random.Random) -> Member:
    """A front member, drawn with weight = how many val items it is on top of."""
    front = pareto_front(members)
    tops = top_items(front)
    weights = [max(1, len(tops[m.version])) for m in front]
    return rng.choices(front, weights=weights, k=1)[0]


def merge_pair(members: Sequence[Member]) -> tuple[Member, Member] | None:
    """Two front members that win on different val items, or None when the front has fewer
    than two such members."""
    front = pareto_front(members)
    tops = top_items(front)
    best: tuple[int, float, Member, Member] | None = None
    for i, a in enumerate(front):
        for b in front[i + 1 :]:
            only_a, only_b = tops[a.version] - tops[b.version], tops[b.version] - tops[a.version]
            if not only_a or not only_b:
                continue
            key = (len(only_a) + len(only_b), a.total() + b.total(), a, b)
            if best is None or key[:2] > best[:2]:
                best = key
    return None if best is None else (best[2], best[3])
