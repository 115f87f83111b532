"""Elite selection for expert iteration: a pure function from scored samples to the ones
worth training on (threshold, top fraction per prompt, dedupe, cap per prompt)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from selftaught.errors import ConfigError
from selftaught.weights.sampling import Sample


@dataclass
class EliteStats:
    """What the filter did, for the round's history row."""

    samples: int
    prompts: int
    kept: int
    prompts_kept: int
    below_threshold: int
    duplicates: int
    over_cap: int
    truncated_kept: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _norm(text: str) -> str:
    return " ".join(text.split())


def select_elite(
    samples: Sequence[Sample],
    *,
    min_score: float | None = 1.0,
    elite_fraction: float = 1.0,
    max_per_prompt: int | None = None,
    dedupe: bool = True,
    keep_truncated: bool = False,
) -> tuple[list[Sample], EliteStats]:
    """Keep, per prompt: samples scoring >= `min_score` (None: no threshold), then the top
    `elite_fraction` of that prompt's samples by score (ceil, so a solved prompt with k=4 and
    0.25 keeps one), minus duplicates (whitespace-normalised target), at most
    `max_per_prompt`. Truncated replies are dropped unless `keep_truncated` (training on a
    cut reply teaches the model to ramble). Order: by prompt as first seen, best first."""
    if not 0.0 < elite_fraction <= 1.0:
        raise ConfigError(f"elite_fraction must be in (0, 1], got {elite_fraction}")
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.example_id].append(s)
    kept: list[Sample] = []
    below = dups = over = 0
    for group in groups.values():
        top_n = max(1, math.ceil(elite_fraction * len(group)))
        ok = [
            s
            for s in group
            if (min_score is None or s.score >= min_score) and (keep_truncated or not s.truncated)
        ]
        below += len(group) - len(ok)
        # stable sort: best score first; among equals, the shorter reply (less to imitate)
        ranked = sorted(ok, key=lambda s: (-s.score, len(s.target)))[:top_n]
        over += len(ok) - len(ranked)
        seen: set[str] = set()
        chosen: list[Sample] = []
        for s in ranked:
            key = _norm(s.target)
            if dedupe and key in seen:
                dups += 1
                continue
            seen.add(key)
            if max_per_prompt is not None and len(chosen) >= max_per_prompt:
                over += 1
                continue
            chosen.append(s)
        kept.extend(chosen)
    stats = EliteStats(
        samples=len(samples),
        prompts=len(groups),
        kept=len(kept),
        prompts_kept=len({s.example_id for s in kept}),
        below_threshold=below,
        duplicates=dups,
        over_cap=over,
        truncated_kept=sum(s.truncated for s in kept),
    )
    return kept, stats


def dedupe_samples(samples: Sequence[Sample]) -> list[Sample]:
    """`samples` with a reply to a prompt kept once (the first; whitespace-normalised target),
    in order: ReST's grown dataset holds what several rounds found once each."""
    seen: set[tuple[str, str]] = set()
    out = []
    for s in samples:
        key = (s.example_id, _norm(s.target))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
