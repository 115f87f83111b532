"""The search over demonstration sets (DSPy's BootstrapFewShot + random search, written for
this loop): where candidate demos come from, and the demo sets a step proposes.

Candidates come from the train split only: the target's own passing replies (bootstrapped
from the step's rollouts, never truncated) and the references the scorer passes. Each goes
through the leak check before it may be used. A step proposes, from its parent's demo set:
add one (while below the cap), swap one, drop one, and a fresh random set; sets already tried
are skipped. Every proposal then meets the same screening and gate as a rule edit."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from selftaught.demos import Demo, Leak, LeakCheck
from selftaught.rollout import Rollout
from selftaught.tasks.base import Example, Task
from selftaught.text import words


@dataclass
class DemoPool:
    """The demo candidates found so far (one per train example; a bootstrapped reply is
    preferred over a reference: it shows what the model itself can produce), and the leaks
    refused on the way."""

    demos: dict[str, Demo] = field(default_factory=dict)
    leaks: list[Leak] = field(default_factory=list)

    def add(self, candidates: Iterable[Demo], check: LeakCheck) -> list[Demo]:
        """Add the clean candidates; returns those that are new."""
        clean, leaks = check.filter(candidates)
        self.leaks += [x for x in leaks if x not in self.leaks]
        new = []
        for d in clean:
            old = self.demos.get(d.id)
            if old is None or (old.source == "reference" and d.source != "reference"):
                self.demos[d.id] = d
                new.append(d)
        return new

    def to_dict(self) -> dict[str, object]:
        return {
            "demos": [d.to_dict() for d in self.demos.values()],
            "leaks": [x.__dict__ for x in self.leaks],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> DemoPool:
        demos = [Demo.from_dict(d) for d in raw.get("demos", [])]  # type: ignore[union-attr]
        leaks = [Leak(**x) for x in raw.get("leaks", [])]  # type: ignore[union-attr]
        return cls({d.id: d for d in demos}, leaks)


def bootstrapped(rollouts: Sequence[Rollout], examples: dict[str, Example]) -> list[Demo]:
    """The passing, untruncated replies of train rollouts, one per example."""
    out: dict[str, Demo] = {}
    for r in rollouts:
        ex = examples.get(r.example_id)
        if ex is None or not r.ok or r.truncated or r.example_id in out:
            continue
        assert r.score is not None
        if r.score.hard and r.reply.strip():
            out[r.example_id] = Demo.of(ex.id, ex.input, r.reply.strip(), "bootstrap")
    return list(out.values())


def from_references(
    task: Task, examples: Iterable[Example], source: str = "reference"
) -> list[Demo]:
    """Examples whose reference, given as the reply, passes the task's own scorer (a
    reference in a form the scorer rejects would teach the wrong format). A scorer that
    raises on a reference skips it: no demo, no score. An example may name its own source in
    `state["demo_source"]` (sleep marks a reference the user corrected as "correction")."""
    out = []
    for ex in examples:
        if ex.reference is None or not isinstance(ex.reference, str | int | float):
            continue
        reply = str(ex.reference).strip()
        if not reply:
            continue
        try:
            ok = task.score(reply, ex).hard
        except Exception:  # noqa: BLE001 - a scorer error is never a pass
            continue
        if ok:
            out.append(Demo.of(ex.id, ex.input, reply, ex.state.get("demo_source") or source))
    return out


def shows_work(reply: str) -> bool:
    """A reply that says more than a bare answer: several lines, or three or more word
    tokens ("-2 - 4 = -6", a sentence), not "-6" or "Paris"."""
    return "\n" in reply.strip() or len(words(reply)) >= 3


def _ranked(demos: Sequence[Demo], rng: random.Random) -> list[Demo]:
    """The order a demo set is filled in (as DSPy fills one: bootstrapped first): the
    model's own passing replies that show their working, then its bare answers, then
    references; shortest first within each (ties in random order). Measured with Qwen2.5-
    Coder-0.5B on 80 held-out arithmetic items, two demos as turns against none (30/80):
    worked own replies 40/80 (15 wins / 5 losses), bare own answers 33/80 (13 / 10),
    references as a system section 18/80 (4 / 16). On SmolLM2-135M references taught it to
    answer without working, and a short worked reply was the demo that helped."""
    order = list(demos)
    rng.shuffle(order)
    return sorted(
        order, key=lambda d: (d.source == "reference", not shows_work(d.reply), len(d.reply))
    )


def propose_sets(
    parent: Sequence[Demo],
    pool: Sequence[Demo],
    k: int,
    n: int,
    rng: random.Random,
    tried: set[tuple[str, ...]],
) -> list[tuple[tuple[Demo, ...], str]]:
    """Up to `n` new demo sets (each at most `k` demos) around `parent`, with what was done.
    `tried` holds the id tuples already proposed; the new ones are added to it."""
    parent = list(parent)
    others = _ranked([d for d in pool if d.id not in {p.id for p in parent}], rng)
    moves: list[tuple[list[Demo], str]] = []
    if others and len(parent) < k:
        moves.append(([*parent, others[0]], f"add {others[0].id} ({others[0].source})"))
    if others and parent:
        i, pick = rng.randrange(len(parent)), others[min(1, len(others) - 1)]
        moves.append(([*parent[:i], pick, *parent[i + 1 :]], f"swap {parent[i].id} for {pick.id}"))
    if pool and k:
        fresh = _ranked(pool, rng)[: min(k, len(pool))]
        moves.append((fresh, f"fresh set of {len(fresh)}"))
    if len(parent) > 1:
        i = rng.randrange(len(parent))
        moves.append(([*parent[:i], *parent[i + 1 :]], f"drop {parent[i].id}"))
    out = []
    for demos, why in moves:
        key = tuple(d.id for d in demos)
        if key in tried or key == tuple(d.id for d in parent):
            continue
        tried.add(key)
        out.append((tuple(demos), why))
        if len(out) == n:
            break
    return out
