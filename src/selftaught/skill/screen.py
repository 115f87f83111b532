"""Screen: with more candidates than `screen_keep`, score them all on the same seeded val
subset and keep the best that are not below their parent there (successive halving before
the full val split)."""

from __future__ import annotations

import random

from selftaught.skill.candidates import Candidate, not_below
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.state import SkillVersion


def wants_screening(config: SkillOptConfig, candidates: list[Candidate], val_size: int) -> bool:
    """Screen first when there are more candidates than go to full val and the subset is a
    real subset of val."""
    return len(candidates) > config.screen_keep and 0 < config.screen_size < val_size


async def screen(
    config: SkillOptConfig,
    scorer: SkillScorer,
    step: int,
    parent: SkillVersion,
    candidates: list[Candidate],
) -> list[Candidate]:
    """Score every candidate on the same seeded val subset; keep the best `screen_keep`
    that are not below the parent there."""
    ids = {
        ex.id
        for ex in random.Random(config.seed * 31 + step).sample(scorer.val_set, config.screen_size)
    }
    parent_scores = scorer.val_metric(parent.hash)
    kept = set()
    for c in candidates:
        val = await scorer.val(c.skill, ids)
        c.rollouts += val.rollouts
        c.cached = val.all_cached
        scores = scorer.metric(val.items)
        c.screen = sum(v or 0.0 for v in scores.values()) / len(ids)
        if not_below(scores, parent_scores, ids):
            kept.add(c.skill.hash)
    ranked = sorted(candidates, key=lambda c: -(c.screen or 0.0))  # stable: order breaks ties
    return [c for c in ranked if c.skill.hash in kept][: config.screen_keep]
