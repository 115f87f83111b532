"""The pooled val (`SkillOptConfig.pooled_val`, issue 52): a second held-out pool the gate reads
with the step's val where val alone is too small to see a gain (`gate.pooled_gate`, and
`gate.smallest_accepted_gain` for the power of each).

The pool is split from train before training (a seeded draw of `pooled_val` items): the task's
own val and test splits stay as the task made them, and what is drawn leaves train, so it never
reaches a rollout the analyst reflects on, a demo, the teacher or the train summary. Anything
still learned that overlaps it fails closed, naming the items: a train item with the same id or
(nearly) the same input as a pool item, or a demo of the starting skill that copies one."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from selftaught.demos import Demo, DemoLeakError, HeldOut, LeakCheck
from selftaught.errors import ConfigError
from selftaught.tasks.base import Example

POOL_SPLIT = "pool"  # the split name a leak names


def split_pool(train: Sequence[Example], n: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train without the pool, the pool): `n` train items drawn with a seeded shuffle, the
    rest of train in its own order."""
    if n >= len(train):
        raise ConfigError(
            f"pooled_val {n} would leave no train item (train has {len(train)}); lower it"
        )
    order = list(range(len(train)))
    random.Random(seed * 1_000_037 + 52).shuffle(order)
    drawn = set(order[:n])
    pool = [train[i] for i in sorted(drawn)]
    return [ex for i, ex in enumerate(train) if i not in drawn], pool


def pool_check(pool: Iterable[Example], learned: Iterable[Example] = ()) -> LeakCheck:
    """The leak check against the pool's inputs (demos, the teacher and the summary use it
    with the val / test one); `learned`: the items checked against it, for their references."""
    return LeakCheck(
        (HeldOut(POOL_SPLIT, ex.id, ex.prompt_text(), ex.reference) for ex in pool),
        {ex.id: ex.reference for ex in learned},
    )


def check_pool(pool: Sequence[Example], learned: Sequence[Example], demos: Iterable[Demo]) -> None:
    """Fail closed, naming the items, when what is learned from (`learned`: train, and the
    starting skill's `demos`) overlaps the pool by id or by (nearly) the same input."""
    ids = {ex.id for ex in pool}
    same_id = sorted(ex.id for ex in learned if ex.id in ids)
    if same_id:
        raise DemoLeakError(
            "the pooled val shares items with train (the pool never feeds what is learned): "
            + ", ".join(same_id[:5])
        )
    check = pool_check(pool, learned)
    check.assert_clean([*(Demo.of(ex.id, ex.input, "", "train") for ex in learned), *demos])
