"""The split phase: the night's tasks split train / val / test, disjoint, weak labels and
dreamt variants added to train, every task given its kind of request, and the tasks written
with the task that replays them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from selftaught.gate import gate_power, smallest_accepted_gain
from selftaught.models.base import ChatModel
from selftaught.models.usage import TrackedModel
from selftaught.policy import Policy
from selftaught.runs import (
    write_jsonl,
)
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.kinds_file import load_kinds
from selftaught.sleep.night import summary
from selftaught.sleep.night.agent_replay import (
    AgentNightTask,
    is_agent,
)
from selftaught.sleep.night.config import NightConfig, NightModels
from selftaught.sleep.night.dream import dream
from selftaught.sleep.night.evidence import EvidenceModel
from selftaught.sleep.night.kinds import NightKinds, find_kinds
from selftaught.sleep.night.mine import (
    MinedTask,
)
from selftaught.sleep.night.phases.context import NightContext, Phase, Splits
from selftaught.sleep.night.replay import night_task
from selftaught.sleep.night.split import (
    NightTask,
    add_train_only,
    assign_splits,
    more_tasks_for_val,
    train_only,
)
from selftaught.sleep.night.weak import (
    WaitingLabel,
    load_waiting,
    settle_weak,
    still_waiting,
    verify_waiting,
    weak_label,
)
from selftaught.sleep.records import (
    GateMode,
    LateDuplicate,
    NightPower,
    SmallestGainRecord,
    SplitCounts,
    WeakRecord,
)
from selftaught.sleep.result import NightDraft
from selftaught.tasks.episode import is_tool_task


class SplitPhase(Phase):
    """Split the harvest train / val / test, disjoint (too few to gate: `TooFewTasks`, nothing
    is staged); then, when asked, weak labels (`--pseudo-k`, `weak.py`) and synthetic
    variants (`--dream`, `dream.py`) join train only; every task gets its kind
    (`kinds.py`); the gate's power on this val is said, and the tasks written (tasks.jsonl)
    with the task that replays them."""

    name = "split"
    seconds = "mine"
    after = "after mining"

    def run(self, ctx: NightContext) -> SplitCounts:
        night, config, models, harvest = ctx.night, ctx.config, ctx.models, ctx.harvest
        assert harvest is not None, "the split phase splits what the mine phase harvested"
        combined, mining = harvest.combined, harvest.mining
        dropped: list[LateDuplicate] = []
        try:
            splits = assign_splits(
                combined, config.split, mining.near_duplicate, dropped, seed=config.training.seed
            )
        finally:  # a split too small after its drops still says what it dropped
            night.drop_duplicates(*dropped)
        waiting = None
        if config.weak.k and is_agent(models.target):
            night.note("weak labels: not sampled on an agent target")
        elif config.weak.k:
            target = TrackedModel(EvidenceModel(models.target, ctx.evidence, "target"),
                                  ctx.ledger, "target")  # fmt: skip
            policy = Policy(ctx.adopted.skill, ctx.adopted.memory)
            waiting, night.weak = _weak_labels(night, harvest.unchecked, combined, splits,
                                               config, target, policy, ctx.home)  # fmt: skip
        if config.dream.n:
            analyst = EvidenceModel(models.optimizer, ctx.evidence, "optimizer")
            _, dreamt = dream(
                splits,
                config.dream,
                TrackedModel(analyst, ctx.ledger, "optimizer"),
                config.training,
                mining.near_duplicate,
                config.training.seed,
            )
            night.dream = dreamt
        mined_now = {id(t) for t in harvest.tonight}
        recalled = [t for t in combined if id(t) not in mined_now]
        kinds = _kinds(night, splits, recalled, config, ctx.home)
        tasks = Splits(harvest.tonight, splits, harvest.rest, harvest.private_ids, waiting, kinds)
        ctx.tasks = tasks
        night.splits = SplitCounts(
            train=len(splits["train"]), val=len(splits["val"]), test=len(splits["test"])
        )
        if night.gate is not None:
            night.gate = _gate_power(night.gate, len(splits["val"]), config, ctx.console)
        ctx.task = _write_tasks(night, tasks, models, ctx.night_dir)
        return night.splits


def _kinds(
    night: NightDraft,
    splits: dict[str, list[MinedTask]],
    recalled: list[MinedTask],
    config: NightConfig,
    home: Path,
) -> NightKinds:
    """Every task of the night given its kind of request (`kinds.py`); recalled and dreamt
    tasks are not tonight's traffic. With many skills, a starting skill that is no kind yet
    takes the tasks its card routes (`skills.starting_cards`)."""
    from selftaught.sleep.adoption.skill_units import skill_names
    from selftaught.sleep.night.skills import starting_cards

    seeds = starting_cards(night.project, home, config.skills_from) if config.many_skills else []
    tasks = [t for split in splits.values() for t in split]
    dreamt = [t for t in tasks if train_only(t) == "synthetic"]
    return find_kinds(
        tasks,
        load_kinds(night.project, home),
        config.kinds,
        night.night,
        not_traffic={t.id for t in [*recalled, *dreamt]},
        seeds=seeds,
        reserved={*skill_names(night.project, home), *(c.name for c in seeds)},
    )


def _weak_labels(
    night: NightDraft,
    unchecked: list[Interaction],
    checked: list[MinedTask],
    splits: dict[str, list[MinedTask]],
    config: NightConfig,
    target: ChatModel,
    policy: Policy,
    home: Path,
) -> tuple[list[WaitingLabel], WeakRecord]:
    """Weak labels (`weak.py`) added to train after the split (a night too small to gate
    spends nothing on them), past ones scored where a real reference came since: what the
    project's weak-label file is to hold after the night, and the night's `weak`."""
    found, labels = weak_label(
        unchecked, checked, config.weak, config.mining, target, policy, config.training
    )
    add_train_only(splits, found, config.mining.near_duplicate)
    labels = settle_weak(splits, found, config.weak, labels)
    past = load_waiting(night.project, home)
    left, labels = verify_waiting(past, checked, config.mining.near_duplicate, labels)
    waiting = still_waiting(left, found, night.night)
    return waiting, labels.but(waiting=len(waiting))


def _gate_power(mode: GateMode, n_val: int, config: NightConfig, console: Console) -> GateMode:
    """The gate's power on tonight's val tasks, said before the first training call and kept
    in the report: the smallest gain it could accept, the val tasks the gain the night looks
    for needs, and about how many more tasks of the traffic that takes."""
    gate = config.training.gate
    power = gate_power(n_val, gate, items="val tasks")
    missing = None if power.needed_val is None else power.needed_val - n_val
    more = None if missing is None else more_tasks_for_val(missing, config.split)
    line = power.line()
    if missing is not None and missing > 0:
        line += (
            f"; about {more} more checked tasks of your traffic"
            if more is not None
            else "; val takes no task (val_fraction 0)"
        )
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    smallest = SmallestGainRecord.of(smallest_accepted_gain(n_val, gate))
    night_power = NightPower(
        target_gain=power.target_gain,
        needed_val=power.needed_val,
        more_tasks=more,
        val_fraction=config.split.val_fraction,
    )
    return dataclasses.replace(mode, smallest_gain=smallest, power=night_power)


def _write_tasks(
    night: NightDraft, mined: Splits, models: NightModels, night_dir: Path
) -> NightTask:
    """tasks.jsonl (every task of the night, recalled ones marked) and the task the night
    replays them with: on the agent itself, else on a chat model (the night's `replay`)."""
    tonight = {id(t) for t in mined.tonight}
    rows_out = [
        {**summary.task_row(t), "recalled": id(t) not in tonight}
        for s in mined.splits.values()
        for t in s
    ]
    write_jsonl(night_dir / "tasks.jsonl", rows_out)
    agent = is_agent(models.target)
    project = night.project
    task = AgentNightTask(project, mined.splits) if agent else night_task(project, mined.splits)
    night.replay = "agent" if agent else "episode" if is_tool_task(task) else "reply"
    return task
