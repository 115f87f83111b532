"""A step's candidates: each proposal's new rules (with the parent's demos), demo sets around
the parent's, and a merge of two pool members; each saved as a version of the run
(`vNNNN`, then `vNNNN-J`)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from selftaught.demos import split_skill
from selftaught.gate import ValScores
from selftaught.rollout import Rollout
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import propose_sets
from selftaught.skill.documents import TrainedDocument, VersionStore
from selftaught.skill.pool import Member, merge_pair
from selftaught.skill.propose import Proposal
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.state import RunState, SkillVersion

Draft = tuple[str, str, str, Proposal | None]  # text, kind, why, the proposal it came from


@dataclass
class Candidate:
    """A skill a step proposes: new rules, a new demo set, or a merge of two pool members."""

    skill: SkillVersion
    kind: str  # rules | demos | merge
    why: str
    proposal: Proposal | None = None
    screen: float | None = None  # mean metric on the screening val items (None: not screened)
    full: bool = False  # scored on the whole val split
    rollouts: list[Rollout] = field(default_factory=list)
    cached: bool = True

    def to_dict(self) -> dict[str, Any]:
        demos = split_skill(self.skill.text).demos
        return {
            "version": self.skill.version,
            "hash": self.skill.hash,
            "kind": self.kind,
            "why": self.why,
            "demos": [f"{d.id} ({d.source})" for d in demos],
            "screen": None if self.screen is None else round(self.screen, 4),
            "full_val": self.full,
        }


def not_below(scores: ValScores, parent: ValScores, ids: Iterable[str]) -> bool:
    """The candidate solves at least as much as its parent on `ids` (the screening rule)."""
    ids = list(ids)
    return sum(scores.get(i) or 0.0 for i in ids) >= sum(parent.get(i) or 0.0 for i in ids) - 1e-9


class CandidateBuilder:
    """Drafts a step's candidates, skips duplicates and what is not worth scoring, and saves
    the rest as versions."""

    def __init__(
        self,
        config: SkillOptConfig,
        document: TrainedDocument,
        versions: VersionStore,
        scorer: SkillScorer,
        demos_on: bool,
    ):
        self.config = config
        self.document = document
        self.versions = versions
        self.scorer = scorer
        self.demos_on = demos_on

    def candidates(
        self, st: RunState, step: int, parent: SkillVersion, proposals: list[Proposal]
    ) -> list[Candidate]:
        """The step's candidates: each proposal's new rules (with the parent's demos), demo
        sets around the parent's, and a merge of two pool members; duplicates are skipped, and so
        are demo sets and merges already scored on the whole val split (a rule candidate that
        was is gated again from the cache, for free)."""
        drafts = self._drafts(st, step, parent, proposals)
        seen = {parent.hash}
        out: list[Candidate] = []
        for text, kind, why, proposal in drafts:
            h = self.document.hash(text)
            if h in seen:
                continue
            seen.add(h)
            version = f"v{step:04d}" + (f"-{len(out)}" if out else "")
            out.append(Candidate(self.versions.save(version, text), kind, why, proposal))
        return out

    def _drafts(
        self, st: RunState, step: int, parent: SkillVersion, proposals: list[Proposal]
    ) -> list[Draft]:
        parts = self.document.parts(parent.text)
        drafts: list[Draft] = []
        for i, p in enumerate(proposals, 1):
            if p.update.applied and p.update.text != parts.rules:
                text = self.document.join(p.update.text, parts.demos)
                drafts.append((text, "rules", f"proposal {i}: {len(p.update.applied)} edits", p))
        if self.demos_on:
            rng = random.Random(self.config.seed * 7_919 + step)
            n, pool = self.config.demo_sets_per_step, list(st.demo_pool.demos.values())
            k, stratify = self.config.demos_max, self.config.demo_stratify
            moves = propose_sets(parts.demos, pool, k, 4 * n, rng, set(), stratify)
            fresh: list[Draft] = [
                (self.document.join(parts.rules, d), "demos", why, None) for d, why in moves
            ]
            drafts += [d for d in fresh if self.worth_scoring(d[0], parent)][:n]
        if self.config.merge and self.config.pool and self.demos_on:
            drafts += [d for d in self.merges(st) if self.worth_scoring(d[0], parent)]
        return drafts

    def merges(self, st: RunState) -> list[Draft]:
        """Rules of one pool member with the demos of another, for the two front members
        that win on different val items."""
        pair = merge_pair(self.members(st)) if len(st.pool) > 1 else None
        if pair is None:
            return []
        a, b = (self.document.parts(self.versions.load(m.version).text) for m in pair)
        va, vb = pair[0].version, pair[1].version
        join = self.document.join
        return [
            (join(a.rules, b.demos), "merge", f"rules of {va} + demos of {vb}", None),
            (join(b.rules, a.demos), "merge", f"rules of {vb} + demos of {va}", None),
        ]

    def members(self, st: RunState) -> list[Member]:
        """The pool's versions with their val metric per item."""
        members = []
        for version in st.pool:
            skill = self.versions.load(version)
            members.append(Member(version, self.scorer.val_metric(skill.hash)))
        return members

    def worth_scoring(self, text: str, parent: SkillVersion) -> bool:
        """Not yet scored on the whole val split, and not already below `parent` on the val
        items it was screened on in an earlier step: as DSPy's random search, a demo set or
        merge is scored once, and the budget goes to sets not seen yet."""
        h = self.document.hash(text)
        cache = self.scorer.val_cache
        if cache.complete(h, (ex.id for ex in self.scorer.val_set)):
            return False
        seen = self.scorer.metric(cache.get(h))
        return not seen or not_below(seen, self.scorer.val_metric(parent.hash), seen)
