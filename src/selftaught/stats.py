"""Confidence intervals and paired significance tests for small eval sets.

Small val sets make a strict `>` accept noise, so the gate can ask for a paired test."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

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
    """One-sided exact sign test (McNemar on discordant pairs): P(X >= wins) under p=0.5."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


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
