"""Edit-budget schedules: the "textual learning rate", at most N edits per step, decaying
from `max_budget` to `min_budget` over the run (large moves early, fine-tuning late), or
adapting to the gate (`adaptive`, the seed's "autonomous LR"): it starts at `max_budget`,
shrinks by one after a step the gate rejected and grows by one after one it accepted,
within [max(min_budget, 1), max_budget]."""

from __future__ import annotations

import math
from typing import Literal

from selftaught.errors import ConfigError

Schedule = Literal["constant", "linear", "cosine", "adaptive"]
SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine", "adaptive")


def edit_budget(
    step: int, total_steps: int, max_budget: int, min_budget: int, schedule: Schedule = "cosine"
) -> int:
    """Edit budget for `step` (1-based) of `total_steps`. Pure.

    constant: always `max_budget`; linear / cosine: `max_budget` at the first step,
    `min_budget` at the last, rounded to the nearest integer; adaptive: `max_budget` (its
    first step's; `adapted_budget` gives each next one)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if min_budget < 0 or max_budget < min_budget:
        raise ConfigError(f"need 0 <= min_budget <= max_budget, got {min_budget}, {max_budget}")
    if schedule in ("constant", "adaptive") or total_steps <= 1:
        return max_budget
    t = min(max(step - 1, 0), total_steps - 1) / (total_steps - 1)  # progress in [0, 1]
    frac = 1.0 - t if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return int(round(min_budget + (max_budget - min_budget) * frac))


def adapted_budget(budget: int, accepted: bool, max_budget: int, min_budget: int) -> int:
    """The adaptive schedule's next budget after a step with `budget`: one more after a step
    the gate accepted, one fewer after one it rejected, within [max(min_budget, 1),
    max_budget] (never 0: a step without edits could never be accepted again). Pure."""
    low = min(max(min_budget, 1), max_budget)
    return min(max(budget + (1 if accepted else -1), low), max_budget)
