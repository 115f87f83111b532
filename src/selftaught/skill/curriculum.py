"""The order of the train batches: a seeded shuffle per epoch, and the curriculum
(`SkillOptConfig.curriculum`): the first epoch from easier to harder train examples.

A task gives each example's difficulty as `Example.state["difficulty"]` (a real number, higher
is harder; `GymTask` reads it from reasoning-gym's own metadata, a JSONL line may carry one).
Only the order of train changes: no train example is added or dropped, and val and test are
never touched, so the gate judges every candidate on the task as given."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from selftaught.errors import ConfigError, TaskError
from selftaught.tasks.base import DIFFICULTY, Example


def example_difficulty(example: Example) -> float | None:
    """The example's difficulty (None where its task gives none); a value that is not a finite
    number is the task's error, named."""
    value = example.state.get(DIFFICULTY) if isinstance(example.state, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TaskError(
            f"example {example.id!r}: state[{DIFFICULTY!r}] must be a finite number, got {value!r}"
        )
    return float(value)


def epoch_order(examples: Sequence[Example], seed: int, epoch: int) -> list[Example]:
    """The train split in `epoch`'s seeded shuffle (a resumed run draws the same one)."""
    order = list(examples)
    random.Random(seed * 100_003 + epoch).shuffle(order)
    return order


def orderable(examples: Sequence[Example]) -> bool:
    """Whether a curriculum can order `examples`: each has a difficulty, not all the same."""
    levels = [example_difficulty(ex) for ex in examples]
    return None not in levels and len(set(levels)) > 1


def curriculum_order(examples: Sequence[Example], seed: int, task_name: str) -> list[Example]:
    """The first epoch's order: easier first, ties in the epoch's seeded shuffle (a stable
    sort of it). Refused where the task gives no difficulty to some train example, or where
    every train example has the same one (there is nothing to order)."""
    shuffled = epoch_order(examples, seed, 0)
    given = [example_difficulty(ex) for ex in shuffled]
    levels = [level for level in given if level is not None]
    if len(levels) < len(given):
        raise ConfigError(
            f"curriculum: task {task_name!r} gives no difficulty to {len(given) - len(levels)} of "
            f"its {len(given)} train examples (Example.state[{DIFFICULTY!r}]); a curriculum needs "
            "one on every train example: turn --curriculum off for this task"
        )
    if len(set(levels)) < 2:
        raise ConfigError(
            f"curriculum: every train example of task {task_name!r} has the same difficulty "
            f"({levels[0] if levels else None}), so there is nothing to order: turn "
            "--curriculum off or widen the task's difficulty range"
        )
    ranked = sorted(zip(levels, shuffled, strict=True), key=lambda pair: pair[0])  # stable
    return [ex for _, ex in ranked]
