"""Confidence intervals and paired significance tests for small eval sets.

Small val sets make a strict `>` accept noise, so the gate can ask for a paired test."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from statistics import NormalDist

from selftaught.errors import InputError

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (good at small n and near 0 or 1)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exact at the ends: rounding leaves ~1e-17 where the bound is 0 (or 1)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return (lo, hi)


def z_for(confidence: float) -> float:
    """The two-sided normal quantile of a confidence level (0.95 -> 1.96)."""
    if not 0.0 < confidence < 1.0:
        raise InputError(f"a confidence level is in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def newcombe_interval(
    s1: float, n1: int, s2: float, n2: int, z: float = Z95
) -> tuple[float, float]:
    """Interval for p1 - p2 of two independent proportions by Newcombe's hybrid score method
    (Newcombe 1998, method 10: each side's Wilson interval, combined); (-1, 1) when a side has
    no observations."""
    if n1 == 0 or n2 == 0:
        return (-1.0, 1.0)
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson_interval(s1, n1, z)
    l2, u2 = wilson_interval(s2, n2, z)
    diff = p1 - p2
    lo = diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return (max(-1.0, lo), min(1.0, hi))


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Normal-approximation interval for a mean of values in [0, 1], clipped to [0, 1]."""
    n = len(values)
    if n == 0:
        return (0.0, 1.0)
    m = sum(values) / n
    if n == 1:
        return (0.0, 1.0)
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return (max(0.0, m - half), min(1.0, m + half))


def sign_test_pvalue(wins: int, losses: int) -> float:
    """One-sided exact sign test (McNemar on discordant pairs): P(X >= wins) under p=0.5.

    The question "is the new one better?" — the gate's question (a candidate is kept only
    when it wins), never a report's: a report asks "do the two differ?", which is
    `sign_test_two_sided`."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / (1 << n)


def sign_test_two_sided(wins: int, losses: int) -> float:
    """Exact two-sided sign test (exact McNemar on the discordant pairs): the probability,
    under p = 0.5, of a split at least as uneven as `wins` / `losses` in either direction:
    twice the smaller tail, at most 1. What a table of results reports."""
    if wins < 0 or losses < 0:
        raise InputError(f"wins and losses are counts >= 0, got {wins} and {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(max(wins, losses), n + 1)) / (1 << n)
    return min(1.0, 2.0 * tail)


def min_detectable_wins(alpha: float = 0.05) -> int:
    """The fewest discordant pairs, all of them wins (no loss), whose two-sided exact sign
    test reaches p < `alpha`: 6 at alpha 0.05 (p = 2 * 2^-6 = 0.031; 5 gives 0.0625)."""
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha is in (0, 1), got {alpha}")
    wins = 1
    while sign_test_two_sided(wins, 0) >= alpha:
        wins += 1
    return wins


def min_detectable_difference(n: int, alpha: float = 0.05) -> float | None:
    """The smallest accuracy difference a paired comparison on `n` items can show at `alpha`
    (two-sided exact sign test), in the most favourable case: `min_detectable_wins` items
    won and none lost, as a share of `n`. Any real comparison needs at least this much (with
    losses it needs more). None when `n` items are too few to show any difference."""
    if n < 0:
        raise InputError(f"n is a count of items >= 0, got {n}")
    wins = min_detectable_wins(alpha)
    return None if wins > n else wins / n


def paired_bootstrap_pvalue(
    new: Sequence[float], old: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> float:
    """One-sided paired bootstrap: share of resamples where mean(new - old) <= 0."""
    if len(new) != len(old):
        raise InputError("paired test needs scores on the same examples")
    diffs = [a - b for a, b in zip(new, old, strict=True)]
    n = len(diffs)
    if n == 0 or all(d == 0 for d in diffs):
        return 1.0
    rng = random.Random(seed)
    not_better = 0
    for _ in range(resamples):
        s = sum(diffs[rng.randrange(n)] for _ in range(n))
        not_better += s <= 0
    return not_better / resamples
