"""What a SkillOpt run may call, counted before it runs (`sleep plan` counts a night's skill
and memory phases with it).

Every count is an upper bound: a run calls exactly this many times only when nothing is cached,
every minibatch is full, every analyst reply needs its repair and every step proposes its full
set of candidates. Each part follows the trainer's own loop (`trainer.py`): the starting skill
on val; per step, the train attempts (`batch_size` x `accumulate_steps` examples, K each), the
analyst's reflections on minibatches of failed, solved and contrasted attempts (each at most
`max_minibatches`), their hierarchical merges (`aggregate.py`) and repairs, teacher demos, and
the candidates' val replays (successive halving first when it applies, `screen.py`); the train
summary once; the slow update when due; the final test (outside the budget) on the starting and
the best skill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from selftaught.skill.config import SkillOptConfig


@dataclass(frozen=True)
class Sizes:
    """Items per split; for a judge's count, the items of each split it scores."""

    train: int
    val: int
    test: int = 0


@dataclass(frozen=True)
class RunCalls:
    """The most calls one run makes, by part (target replays and analyst calls)."""

    steps: int
    candidates_per_step: int
    baseline: int  # the starting skill on val
    rollouts: int  # train attempts, every step
    candidates: int  # the candidates' val replays (screening included), every step
    pooled: int  # the pooled val's items (`pooled_val`)
    slow: int  # the slow update's val replays, when due
    test: int  # the starting and the best skill on test: outside the budget
    analyst: int  # reflections, merges, repairs, teacher demos, the train summary

    @property
    def target(self) -> int:
        """Every target replay, the test's included."""
        return self.budgeted_target + self.test

    @property
    def budgeted_target(self) -> int:
        """The target replays the run's budget counts (all but the test)."""
        return self.baseline + self.rollouts + self.candidates + self.pooled + self.slow


def merge_calls(patches: int, batch: int) -> int:
    """Merge calls of `patches` non-empty patches merged `batch` at a time, level by level
    until one is left (a group of one needs no call)."""
    calls = 0
    while patches > 1:
        groups = math.ceil(patches / batch)
        calls += groups - (patches % batch == 1)
        patches = groups
    return calls


def reflect_calls(examples: int, groups: int, config: SkillOptConfig) -> int:
    """The most reflections on one batch of `examples` attempted examples split among
    `groups` kinds (failed, solved, contrasted): each kind's minibatches, at most
    `max_minibatches` of each."""
    if examples <= 0:
        return 0
    chunks = math.ceil(examples / config.minibatch_size) + groups - 1
    return min(groups * config.max_minibatches, chunks, examples)


def step_batches(n_train: int, config: SkillOptConfig) -> list[int]:
    """Train examples of each step (the last of an epoch may be short), every epoch, capped
    at `max_steps`."""
    size = config.batch_size * config.accumulate_steps
    per_epoch = [min(size, n_train - i) for i in range(0, n_train, size)]
    steps = per_epoch * config.epochs
    return steps[: config.max_steps] if config.max_steps is not None else steps


def _analyst_per_step(batch: int, config: SkillOptConfig, agent: bool) -> int:
    """One step's analyst calls: per proposal, the reflections on each accumulated batch,
    their merges, and a repair for each; a coding agent as the analyst edits the skill in
    one run per proposal (`agent_edit.py`)."""
    if not config.proposals or agent:
        return config.proposals
    failure = 1 + (config.rollouts_k > 1)  # failed, and contrasted attempts with K > 1
    success = int(config.reflect_on_successes)
    micro = [min(config.batch_size, batch - i) for i in range(0, batch, config.batch_size)]
    fail_side = sum(reflect_calls(m, failure, config) for m in micro)
    succ_side = sum(reflect_calls(m, success, config) for m in micro) if success else 0
    fail_side += int(config.grounded_proposals)
    merges = 0
    if config.llm_merge:
        b = config.merge_batch_size
        merges = merge_calls(fail_side, b) + merge_calls(succ_side, b) + 1
    calls = fail_side + succ_side + merges
    return config.proposals * calls * (2 if config.repair else 1)


def candidates_per_step(config: SkillOptConfig, demos_on: bool, user_edits: bool) -> int:
    """A step's candidates at most: each proposal's rules (the user's edits make one without
    an analyst), the demo sets and the two merges of pool members."""
    rules = config.proposals or int(user_edits)
    demos = config.demo_sets_per_step if demos_on else 0
    merges = 2 if config.merge and config.pool and demos_on else 0
    return rules + demos + merges


def val_replays(candidates: int, n_val: int, counted: int, config: SkillOptConfig) -> int:
    """A step's candidates on val: all on the screening subset, then `screen_keep` on the
    rest, when successive halving applies (`screen.wants_screening`); else all on full val.
    `counted`: the val items that count (all, or those a judge scores)."""
    screened = candidates > config.screen_keep and 0 < config.screen_size < n_val
    if not screened:
        return candidates * counted
    first = min(config.screen_size, counted)
    rest = min(n_val - config.screen_size, counted)
    return candidates * first + min(config.screen_keep, candidates) * rest


def run_calls(
    config: SkillOptConfig,
    sizes: Sizes,
    *,
    demos_on: bool,
    user_edits: bool = False,
    counted: Sizes | None = None,
    agent_analyst: bool = False,
) -> RunCalls:
    """The most calls a run of `config` makes on `sizes` (module doc). `demos_on`: the run
    searches demo sets (the skill, not the memory); `user_edits`: edits proposed from outside
    join the first step (a night's memory phase). `counted`: count only these items of each
    split (a judge's: the tasks it scores); the analyst's calls are then 0. `agent_analyst`:
    the analyst is a coding agent (one run per proposal)."""
    judged = counted is not None
    counted = counted or sizes
    n_train = max(sizes.train - config.pooled_val, 0)
    batches = step_batches(n_train, config) if n_train else []
    share = min(counted.train, n_train)
    k = config.rollouts_k
    per_step = candidates_per_step(config, demos_on, user_edits)
    candidates = len(batches) * val_replays(per_step, sizes.val, counted.val, config)
    analyst = 0
    if not judged:
        analyst = sum(_analyst_per_step(b, config, agent_analyst) for b in batches)
        analyst += config.teacher_demos * len(batches) if demos_on else 0
        analyst += int(config.grounded_proposals and config.proposals > 0)
        analyst += 2 * int(bool(config.slow_every))  # merging overlaps, and its repair
    slow = (config.slow_max_trials + 2) * counted.val if config.slow_every else 0
    return RunCalls(
        steps=len(batches),
        candidates_per_step=per_step,
        baseline=counted.val,
        rollouts=sum(min(b, share) for b in batches) * k,
        candidates=candidates,
        pooled=3 * min(config.pooled_val, counted.train) * len(batches),
        slow=slow,
        test=2 * counted.test if config.evaluate_test else 0,
        analyst=analyst,
    )
