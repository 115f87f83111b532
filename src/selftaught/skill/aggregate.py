"""Aggregate: merge the patches of many reflections hierarchically, SkillOpt style.

Failure-driven and success-driven patches are merged separately (groups of
`merge_batch_size`, level by level until one patch remains), then one final merge combines the
two. A group of one patch needs no call. When a merge reply is unusable (invalid JSON after
the repair, or a backend error) the group falls back to a deterministic merge (dedupe, rank
by support), so proposals are never lost to a bad merge."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field, replace

from selftaught.skill.document import Edit
from selftaught.skill.reflect import Analyst, AnalystCall
from selftaught.skill.select import dedupe_edits, rank_edits


def deterministic_merge(patches: list[list[Edit]], source: str | None = None) -> list[Edit]:
    merged = rank_edits(dedupe_edits(e for p in patches for e in p))
    return [replace(e, source=source) for e in merged] if source else merged


def _carry_support(merged: list[Edit], inputs: list[list[Edit]]) -> list[Edit]:
    """An LLM merge loses the support counts: give each merged edit the summed support of
    the input edits with the same content (or 1 when it was reworded)."""
    support: dict[str, int] = {}
    for e in (e for p in inputs for e in p):
        support[e.key()[2]] = support.get(e.key()[2], 0) + e.support
    return [replace(e, support=max(1, support.get(e.key()[2], 1))) for e in merged]


@dataclass
class Aggregation:
    edits: list[Edit] = field(default_factory=list)
    calls: list[AnalystCall] = field(default_factory=list)
    fallbacks: int = 0  # merge groups that fell back to the deterministic merge


async def _merge_group(
    analyst: Analyst | None,
    skill: str,
    group: list[list[Edit]],
    max_edits: int,
    source: str,
    agg: Aggregation,
) -> list[Edit]:
    group = [p for p in group if p]
    if len(group) <= 1:
        return group[0] if group else []
    if analyst is None:
        return deterministic_merge(group)
    call = await analyst.merge(skill, group, max_edits)
    agg.calls.append(call)
    if call.status in ("ok", "repaired") and call.edits:
        return _carry_support([replace(e, source=source) for e in call.edits], group)
    agg.fallbacks += 1
    return deterministic_merge(group)


async def merge_hierarchically(
    analyst: Analyst | None,
    skill: str,
    patches: list[list[Edit]],
    *,
    merge_batch_size: int,
    max_edits: int,
    source: str,
    agg: Aggregation,
) -> list[Edit]:
    level = [p for p in patches if p]
    while len(level) > 1:
        groups = [level[i : i + merge_batch_size] for i in range(0, len(level), merge_batch_size)]
        level = list(
            await asyncio.gather(
                *(_merge_group(analyst, skill, g, max_edits, source, agg) for g in groups)
            )
        )
        level = [p for p in level if p]
    return level[0] if level else []


async def aggregate(
    analyst: Analyst | None,
    skill: str,
    failure_patches: list[list[Edit]],
    success_patches: list[list[Edit]],
    *,
    merge_batch_size: int = 8,
    max_edits: int = 8,
) -> Aggregation:
    """Merge failure- and success-driven patches separately, then together. `analyst=None`
    merges deterministically (no LLM call)."""
    agg = Aggregation()
    merge = functools.partial(
        merge_hierarchically, merge_batch_size=merge_batch_size, max_edits=max_edits, agg=agg
    )
    fail, succ = await asyncio.gather(
        merge(analyst, skill, failure_patches, source="failure"),
        merge(analyst, skill, success_patches, source="success"),
    )
    if fail and succ:
        # keep failure-driven first when the final merge falls back (they carry the signal)
        agg.edits = await _merge_group(analyst, skill, [fail, succ], max_edits, "merge", agg)
    else:
        agg.edits = fail or succ
    return agg
