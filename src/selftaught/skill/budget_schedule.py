"""Edit-budget schedules: the "textual learning rate", at most N edits per step, decaying
from `max_budget` to `min_budget` over the run (large moves early, fine-tuning late)."""

from __future__ import annotations

import math
from typing import Literal

from selftaught.errors import ConfigError

Schedule = Literal["constant", "linear", "cosine"]
SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def edit_budget(
    step: int, total_steps: int, max_budget: int, min_budget: int, schedule: Schedule = "cosine"
) -> int:
    """Edit budget for `step` (1-based) of `total_steps`. Pure.

    constant: always `max_budget`; linear / cosine: `max_budget` at the first step,
    `min_budget` at the last, rounded to the nearest integer."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if min_budget < 0 or max_budget < min_budget:
        raise ConfigError(f"need 0 <= min_budget <= max_budget, got {min_budget}, {max_budget}")
    if schedule == "constant" or total_steps <= 1:
        return max_budget
    t = min(max(step - 1, 0), total_steps - 1) / (total_steps - 1)  # progress in [0, 1]
    frac = 1.0 - t if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return int(round(min_budget + (max_budget - min_budget) * frac))
