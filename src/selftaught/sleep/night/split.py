"""Split a night's tasks into train / val / test, disjoint, and present them as a `Task`.

Each task's split comes from a seeded hash of its id (the same request keeps its split from
night to night), then the splits are topped up to their minimum sizes in hash order; a task
whose split was already fixed (recalled from a past night, `recall.py`) is never moved. With
fewer tasks than `min_train + min_val` the night cannot gate anything and stages nothing: it
never falls back to validating on the training tasks (SkillOpt-Sleep does, then has to flag
the result as unverified).

Tasks of two splits are never one item (`selftaught.duplicates`, the notion mining merged
tonight's requests by): where two recalled tasks of different splits are (an older night split
them apart), the copy in train is dropped, else the one in test, so val keeps its items; the
drop is the night's `duplicates` (a line in report.md), and the night goes on.

A task whose check a model made (a self-consistency label, `weak.py`; the miner's check on a
re-ask or a bare rejection, `mine.BARE_VERDICT`) or that no user sent (a dream, `dream.py`) is
**train only** (`train_only`): it never goes to val or test, does not count toward
`min_train`, and one that is the same item as a val or test task is left out (its split stays
None and a note names the held-out task).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from selftaught.demos import split_skill
from selftaught.duplicates import WORD_SHARE, DuplicateIndex
from selftaught.errors import ConfigError, InputError
from selftaught.sleep.kinds_file import kind_tag
from selftaught.sleep.night.checks import score_example
from selftaught.sleep.night.mine import BARE_VERDICT, MinedTask, task_key
from selftaught.sleep.records import LateDuplicate, ProposalRecord, TrainOnlyUse, given
from selftaught.tasks.base import SPLITS, Example, Score, Split, TaskError, TaskKind
from selftaught.tasks.scorers import LlmJudge


class TooFewTasks(InputError):
    """Not enough tasks to train and gate; the message says how many and how many are needed."""


class SplitOverlap(TaskError):
    """What a night trains on is not its train tasks (a bug, never traffic: fails closed)."""


@dataclass
class SplitConfig:
    val_fraction: float = 0.3
    """Share of the night's tasks that gate the proposal."""
    test_fraction: float = 0.0
    """Share held out for a final measure the gate never sees (0: none, more tasks to gate)."""
    min_train: int = 2
    """Fewer train tasks than this: nothing to learn from, the night stages nothing."""
    min_val: int = 4
    """Fewer val tasks than this: nothing to gate with, the night stages nothing (0, with both
    fractions 0: no task is held out, the daily-use night of `NightConfig.val_split`)."""

    def __post_init__(self) -> None:
        if not (0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1):
            raise ConfigError("val_fraction and test_fraction must be in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError("val_fraction + test_fraction must leave room for training")
        if self.min_train < 1 or self.min_val < 0:
            raise ConfigError("min_train must be >= 1 and min_val >= 0")
        if self.min_val == 0 and (self.val_fraction or self.test_fraction):
            raise ConfigError(
                "min_val 0 holds nothing out: it goes with val_fraction and test_fraction 0"
            )

    @property
    def held_out(self) -> bool:
        """Whether the night holds tasks out (False: every task trains, `--no-val`)."""
        return self.min_val > 0


def _unit(task_id: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}\x00{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


TRAIN_ONLY = ("weak", "synthetic", BARE_VERDICT)


def train_only(task: MinedTask) -> str | None:
    """ "weak", "synthetic" or "bare_verdict" (the `state` key marking it) for a task that may
    train and never validate; None for a task mined with a check of its own."""
    return next(iter(task.state.train_only()), None)


def assign_splits(
    tasks: list[MinedTask],
    config: SplitConfig,
    near_duplicate: float = WORD_SHARE,
    dropped: list[LateDuplicate] | None = None,
    *,
    seed: int = 0,
) -> dict[str, list[MinedTask]]:
    """Set each task's split (a hash of its id and `seed`, the night's `training.seed`; one
    already set is kept) and return the splits; raises
    TooFewTasks when train or val cannot reach its minimum. A task that is one item (at
    `near_duplicate`) with a task of another split is dropped (`check_split`, appended to
    `dropped`). Train-only tasks go to train after the others are split (`add_train_only`)."""
    extra = [t for t in tasks if train_only(t)]
    tasks = [t for t in tasks if not train_only(t)]
    need = config.min_train + config.min_val
    if len(tasks) < need:
        raise TooFewTasks(
            f"too few tasks to gate: {len(tasks)} mined, at least {need} needed "
            f"({config.min_train} to train on, {config.min_val} to validate with); "
            "they are kept for the next night"
        )
    order = sorted(tasks, key=lambda t: (_unit(t.id, seed), t.id))
    if not config.held_out:  # a recalled held-out task stays held out, out of this night
        order = [t for t in order if t.split in (None, "train")]
    fixed = {id(t) for t in tasks if t.split is not None}  # recalled: never moved
    for task in order:
        if task.split is None:
            u = _unit(task.id, seed)
            test_cut = config.test_fraction
            task.split = (
                "test" if u < test_cut else "val" if u < test_cut + config.val_fraction else "train"
            )
    splits: dict[str, list[MinedTask]] = {s: [t for t in order if t.split == s] for s in SPLITS}

    def move(src: str, dst: str) -> bool:
        """Move the first task of `src` whose split is not fixed; False when there is none."""
        free = [t for t in splits[src] if id(t) not in fixed]
        if not free:
            return False
        splits[src].remove(free[0])
        free[0].split = dst
        splits[dst].append(free[0])
        return True

    while len(splits["val"]) < config.min_val and len(splits["train"]) > config.min_train:
        if not move("train", "val"):
            break
    while len(splits["train"]) < config.min_train and len(splits["val"]) > config.min_val:
        if not move("val", "train"):
            break
    for split, least in (("val", config.min_val), ("train", config.min_train)):
        while len(splits[split]) < least and splits["test"]:
            if not move("test", split):
                break
    _enough(splits, config)
    gone = check_split(splits, near_duplicate)
    if dropped is not None:
        dropped += gone
    if gone:
        _enough(splits, config)
    add_train_only(splits, extra, near_duplicate)
    return splits


def more_tasks_for_val(missing_val: int, config: SplitConfig) -> int | None:
    """About how many more checked tasks (ones that may validate: not weak, not synthetic)
    the traffic must bring for val to hold `missing_val` more, at `config.val_fraction` of
    them; None when val takes none."""
    if missing_val <= 0:
        return 0
    if config.val_fraction <= 0:
        return None
    return math.ceil(missing_val / config.val_fraction - 1e-9)


def _enough(splits: dict[str, list[MinedTask]], config: SplitConfig) -> None:
    if len(splits["train"]) < config.min_train or len(splits["val"]) < config.min_val:
        raise TooFewTasks(
            f"too few tasks to gate: {len(splits['train'])} train and {len(splits['val'])} val "
            f"(at least {config.min_train} and {config.min_val} needed)"
        )


def add_train_only(
    splits: dict[str, list[MinedTask]], tasks: list[MinedTask], threshold: float
) -> list[MinedTask]:
    """Add train-only `tasks` to `splits["train"]`; one that is one item with a val or test
    task is left out (fail closed: its split is None, a note names the held-out task).
    Returns those added."""
    held: DuplicateIndex[tuple[str, MinedTask]] = DuplicateIndex(threshold)
    for split in ("val", "test"):
        for other in splits.get(split, []):
            held.add(task_key(other), (split, other))
    added = []
    for task in tasks:
        hit = held.find(task_key(task))
        if hit is not None:
            task.split = None
            task.notes.append(
                f"left out: a near-duplicate of {hit[1].id} ({hit[0]}), and a "
                f"{train_only(task) or 'train-only'} task never overlaps a held-out one"
            )
            continue
        task.split = "train"
        splits.setdefault("train", []).append(task)
        added.append(task)
    return added


KEEP_FIRST = ("val", "test", "train")
"""Of two tasks of different splits that are one item, the one whose split comes first here
is kept: val is what the gate stands on, train what can spare one."""


def check_split(splits: dict[str, list[MinedTask]], threshold: float) -> list[LateDuplicate]:
    """Drop every task that is one item with a task of a split kept before its own
    (`KEEP_FIRST`): its split becomes None and a note names the task kept. The drops."""
    kept: DuplicateIndex[MinedTask] = DuplicateIndex(threshold)
    dropped: list[LateDuplicate] = []
    for split in KEEP_FIRST:
        stays = []
        for task in splits.get(split, []):
            key = task_key(task)
            other = next((o for o in kept.find_all(key) if o.split != split), None)
            if other is None:
                stays.append(task)
                kept.add(key, task)
                continue
            task.notes.append(f"dropped from {split}: the same item as {other.id} ({other.split})")
            dropped.append(
                LateDuplicate(
                    item=task.id, held_out=other.id, split=str(other.split), phase="split"
                )
            )
            task.split = None
        splits[split] = stays
    return dropped


class NightTask:
    """The night's mined tasks as a `Task`: each example is scored by its own checks."""

    kind: TaskKind = "agent"
    instructions = ""  # the requests are replayed exactly as the client sent them

    def __init__(
        self, project: str, splits: dict[str, list[MinedTask]], judge: LlmJudge | None = None
    ):
        self.name = f"sleep:{project}"
        self.judge = judge
        self._examples = {s: [example_of(t) for t in splits.get(s, [])] for s in SPLITS}

    def examples(self, split: Split) -> list[Example]:
        return list(self._examples[split])

    def score(self, output: str, example: Example) -> Score:
        return score_example(output, example, self.judge)

    def sizes(self) -> dict[str, Any]:
        return {s: len(v) for s, v in self._examples.items()}


def example_of(task: MinedTask) -> Example:
    """`task` as its scorer reads it: its checks as the `Example.state` dict (the one place a
    `TaskChecks` becomes it), with the task's sources, and its kind's tag among its tags
    (`kinds_file.kind_tag`: the gate's per-tag veto reads them)."""
    state = {**task.state.to_dict(), "sources": task.sources}
    if task.kind is not None:
        state["tags"] = [*task.state.tags, kind_tag(task.kind)]
    return Example(id=task.id, input=task.messages, reference=task.reference, state=state)


def train_only_use(
    splits: dict[str, list[MinedTask]], skill: str | None, proposal: ProposalRecord | None
) -> dict[str, TrainOnlyUse]:
    """What a staged proposal took from train-only tasks, by kind ("weak", "synthetic"): the
    ids of its skill's demos made from them (`skill`: the staged skill, None when the text was
    not staged), how many of its kept lines name them, and how many of them (those that may be
    a demo) an adapter it stages trained on. Empty when nothing was staged."""
    if proposal is None:
        return {}
    kinds = {t.id: k for t in splits.get("train", []) if (k := train_only(t))}
    demos = [d.id for d in split_skill(skill).demos] if skill is not None else []
    lines = proposal.lines
    adapter = proposal.adapter is not None
    out: dict[str, TrainOnlyUse] = {}
    for kind in TRAIN_ONLY:
        mine = {i for i, k in kinds.items() if k == kind}
        demoable = [t for t in splits.get("train", []) if t.id in mine and not t.state.no_demo]
        out[kind] = TrainOnlyUse(
            demos=tuple(d for d in demos if d in mine),
            lines=sum(1 for line in lines if mine & set(line.tasks)),
            adapter_tasks=len(demoable) if adapter else 0,
        )
    return out


def use_lines(used: TrainOnlyUse | None) -> list[str]:
    """report.md's line for one kind of `train_only_use` (nothing when nothing was staged)."""
    if not given(used):
        return []
    return [
        f"  - in the staged proposal: {len(used.demos)} demos, "
        f"{used.lines} lines naming them, {used.adapter_tasks} in the adapter's train set"
    ]
