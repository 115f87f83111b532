"""The search over demonstration sets (DSPy's BootstrapFewShot + random search, written for
this loop): where candidate demos come from, and the demo sets a step proposes.

Candidates come from the train split only: the target's own passing replies (bootstrapped
from the step's rollouts, never truncated), the references the scorer passes, and (with
`teacher_demos`) replies the optimizer model wrote that the scorer passes (`skill.teacher`).
Each goes through the leak check before it may be used. A step proposes, from its parent's demo set:
add one (while below the cap), swap one, a fresh set, drop one, round after round (later
fresh sets are random draws); sets already tried are skipped. On a task with few distinct
answers (Yes / No, a label) the first fresh set is stratified: each answer gets its share
of the slots. Every proposal then meets the same screening and gate as a rule edit."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from selftaught.demos import Demo, Leak, LeakCheck
from selftaught.rollout import Rollout
from selftaught.tasks.base import Example, Task
from selftaught.text import words

# The order sources are preferred in, for the same train item and when a set is filled: the
# user's corrections and the model's own replies first (what it can produce), then a teacher's
# verified reply (it shows the working, written by another model), then a bare reference.
SOURCE_RANK = {"correction": 0, "bootstrap": 0, "teacher": 1, "reference": 2}


def source_rank(source: str) -> int:
    return SOURCE_RANK.get(source, 3)


@dataclass
class DemoPool:
    """The demo candidates found so far (one per train example; a bootstrapped reply is
    preferred over a teacher's, and either over a reference: `SOURCE_RANK`), the leaks
    refused on the way, and the train items the teacher was already asked about."""

    demos: dict[str, Demo] = field(default_factory=dict)
    leaks: list[Leak] = field(default_factory=list)
    teacher_asked: list[str] = field(default_factory=list)

    def own(self) -> int:
        """Demos that are more than a bare reference (what `teacher_demos` counts)."""
        return sum(1 for d in self.demos.values() if d.source != "reference")

    def add(self, candidates: Iterable[Demo], check: LeakCheck) -> list[Demo]:
        """Add the clean candidates; returns those that are new."""
        clean, leaks = check.filter(candidates)
        self.leaks += [x for x in leaks if x not in self.leaks]
        new = []
        for d in clean:
            old = self.demos.get(d.id)
            if old is None or source_rank(d.source) < source_rank(old.source):
                self.demos[d.id] = d
                new.append(d)
        return new

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "demos": [d.to_dict() for d in self.demos.values()],
            "leaks": [x.__dict__ for x in self.leaks],
        }
        if self.teacher_asked:  # absent with the teacher off: the file is as before
            out["teacher_asked"] = list(self.teacher_asked)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DemoPool:
        demos = [Demo.from_dict(d) for d in raw.get("demos", [])]
        leaks = [Leak(**x) for x in raw.get("leaks", [])]
        return cls({d.id: d for d in demos}, leaks, list(raw.get("teacher_asked", [])))


def no_demo(ex: Example) -> bool:
    """An example no demo may come from (`state["no_demo"]` says why: sleep marks one checked
    by an end user's correction, whose words must not reach the skill)."""
    return bool(ex.state.get("no_demo"))


def bootstrapped(rollouts: Sequence[Rollout], examples: dict[str, Example]) -> list[Demo]:
    """The passing, untruncated replies of train rollouts, one per example."""
    out: dict[str, Demo] = {}
    for r in rollouts:
        ex = examples.get(r.example_id)
        if ex is None or not r.ok or r.truncated or r.example_id in out or no_demo(ex):
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
    `state["demo_source"]` (sleep marks a reference the user corrected as "correction"), and a
    fuller reply that passes the same scorer (`_reference_replies`)."""
    out = []
    for ex in examples:
        if ex.reference is None or not isinstance(ex.reference, str | int | float) or no_demo(ex):
            continue
        for reply in _reference_replies(ex):
            try:
                ok = task.score(reply, ex).hard
            except Exception:  # noqa: BLE001 - a scorer error is never a pass
                continue
            if ok:
                out.append(Demo.of(ex.id, ex.input, reply, ex.state.get("demo_source") or source))
                break
    return out


def _reference_replies(ex: Example) -> list[str]:
    """What a reference demo may reply, best first: the reply the user's own correction drew in
    the conversation (`state["reference_reply"]`, set by sleep for the operator's words only),
    then the reference itself."""
    drawn = str(ex.state.get("reference_reply") or "").strip()
    return [r for r in (drawn, str(ex.reference).strip()) if r]


def shows_work(reply: str) -> bool:
    """A reply that says more than a bare answer: several lines, or three or more word
    tokens ("-2 - 4 = -6", a sentence), not "-6" or "Paris"."""
    return "\n" in reply.strip() or len(words(reply)) >= 3


def work_steps(reply: str) -> int:
    """How many results a reply writes out as it goes: its `=` signs ("81 + 16 * 52 = 81 +
    832 = 913": 2; "-3 + 6 = 3": 1; "-6": 0). Lines of prose do not count: with SmolLM2-135M
    in the quick start, ranking its multi-line explanations first (lines counted as steps)
    kept the gain (test 0.250 -> 0.345) but made every reply longer and the run 559 s
    instead of 248 s."""
    return reply.count("=")


def _ranked(demos: Sequence[Demo], rng: random.Random) -> list[Demo]:
    """The order a demo set is filled in (as DSPy fills one: bootstrapped first): the model's
    own passing replies (and the user's corrections) that show their working, those with the
    most steps first, then its bare answers, then a teacher's verified replies, then
    references (`SOURCE_RANK`); shorter first among equals (ties in random order). Measured
    with Qwen2.5-Coder-0.5B on 80 held-out arithmetic items against the seed prompt alone
    (30/80): two worked own replies as turns 40/80 (15 wins / 5 losses), bare own answers
    33/80, references as a system section 18/80; and among worked replies, the two with the
    most steps beat the two shortest on each of three seeds (58 vs 45, 47 vs 36, 43 vs 38 of
    80; one demo: 48 vs 38, 43 vs 31, 43 vs 36): a one-step demo teaches the format, a demo
    that writes out its intermediate results teaches the working. (On SmolLM2-135M
    references taught it to answer without working.)"""
    order = list(demos)
    rng.shuffle(order)
    return sorted(
        order,
        key=lambda d: (
            source_rank(d.source),
            not shows_work(d.reply),
            -work_steps(d.reply),
            len(d.reply),
        ),
    )


def propose_sets(
    parent: Sequence[Demo],
    pool: Sequence[Demo],
    k: int,
    n: int,
    rng: random.Random,
    tried: set[tuple[str, ...]],
    stratify: bool = True,
) -> list[tuple[tuple[Demo, ...], str]]:
    """Up to `n` new demo sets (each at most `k` demos) around `parent`, with what was done.
    `tried` holds the id tuples already proposed; the new ones are added to it. `stratify`:
    the first fresh set gives each answer its share when the pool has few distinct ones."""
    parent_key = tuple(d.id for d in parent)
    out = []
    for demos, why in _moves(list(parent), pool, k, rng, stratify):
        key = tuple(d.id for d in demos)
        if key in tried or key == parent_key:
            continue
        tried.add(key)
        out.append((tuple(demos), why))
        if len(out) == n:
            break
    return out


def _moves(
    parent: list[Demo], pool: Sequence[Demo], k: int, rng: random.Random, stratify: bool
) -> Iterator[tuple[list[Demo], str]]:
    """The moves around `parent`, best guesses first, in rounds (DSPy's random search goes
    on the same way, one fresh draw after another): add the next ranked candidate (below the
    cap), swap a demo for the next ranked candidate `add` does not offer (at the cap: the
    best), a fresh set, drop a demo. The first fresh set is
    the top `k` ranked (stratified by answer on a label task); later ones are random draws of
    1..k from the better half of the ranking, so that a step whose first sets were tried
    still has new ones to offer."""
    others = _ranked([d for d in pool if d.id not in {p.id for p in parent}], rng)
    ranked = _ranked(pool, rng)
    drops = rng.sample(range(len(parent)), len(parent))
    for r in range(len(pool) + 1):
        if r < len(others) and len(parent) < k:
            yield [*parent, others[r]], f"add {others[r].id} ({others[r].source})"
        if others and parent:
            # below the cap `add` offers others[r] this round, so the swap takes the next one
            nxt = r + 1 if len(parent) < k else r
            i, pick = rng.randrange(len(parent)), others[min(nxt, len(others) - 1)]
            yield [*parent[:i], pick, *parent[i + 1 :]], f"swap {parent[i].id} for {pick.id}"
        if ranked and k:
            yield _fresh(ranked, k, r, rng, stratify)
        if len(parent) > 1 and r < len(drops):
            i = drops[r]
            yield [*parent[:i], *parent[i + 1 :]], f"drop {parent[i].id}"


def _fresh(
    ranked: list[Demo], k: int, r: int, rng: random.Random, stratify: bool
) -> tuple[list[Demo], str]:
    if r == 0:
        shared = stratified(ranked, k) if stratify else None
        if shared is not None:
            return shared, f"stratified set of {len(shared)}"
        top = ranked[: min(k, len(ranked))]
        return top, f"fresh set of {len(top)}"
    size = rng.randint(1, min(k, len(ranked)))
    better = ranked[: max(size, (len(ranked) + 1) // 2)]
    picked = {d.id for d in rng.sample(better, size)}
    draw = [d for d in ranked if d.id in picked]  # in ranked order
    return draw, f"random set of {len(draw)}"


def answer_key(reply: str) -> str:
    """A reply as an answer: its words, case and punctuation aside ("Yes." and "yes" match)."""
    return " ".join(words(reply))


def stratified(ranked: Sequence[Demo], k: int) -> list[Demo] | None:
    """`k` demos in which each distinct answer of the pool gets its share of the slots
    (largest remainder), the best ranked of each, in ranked order; None when the pool's
    replies take more distinct values than `k` (free text, where a share is below one demo)
    or a single one. Why: on a label task the model's own passing replies all carry the
    answer it already favours, so a set of them can only teach that answer; the pool, one
    demo per train item, holds the answers as train does. On gym:syllogism's dev seeds 0-2
    (Qwen2.5-Coder-0.5B, val 30) the top-ranked set was four of its own "No"s and left val
    where the seed prompt had it (11, 8, 8 of 30); the stratified set (one "No", three
    "Yes") took it to 20, 27 and 24 (benchmarks/bench_demo_kinds.py --stratify)."""
    keys = [answer_key(d.reply) for d in ranked]
    counts = Counter(keys)  # in order of first appearance: ties go to the better ranked
    if not 2 <= len(counts) <= k:
        return None
    n = min(k, len(ranked))
    exact = {a: n * c / len(ranked) for a, c in counts.items()}
    shares = {a: int(x) for a, x in exact.items()}
    for a in sorted(exact, key=lambda a: shares[a] - exact[a])[: n - sum(shares.values())]:
        shares[a] += 1  # a stable sort: equal remainders keep first-appearance order
    out = []
    for d, a in zip(ranked, keys, strict=True):
        if shares[a] > 0:
            shares[a] -= 1
            out.append(d)
    return out
