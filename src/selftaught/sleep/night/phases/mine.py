"""The mine phase: tasks with checks from tonight's rows (`night/mine.py`, `signals.py`,
`agent_outcome.py`, `miner.py`), near-duplicates merged, then past tasks recalled with their
splits (`recall.py`) and the ones the target cannot be checked on left out."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from selftaught.demos import split_skill
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.threads import logged_tools
from selftaught.sleep.night import recall
from selftaught.sleep.night.agent_outcome import (
    WorkspaceMiner,
    for_target,
    read_outcomes,
)
from selftaught.sleep.night.agent_replay import (
    NOT_CHECKABLE,
    for_agent,
    is_agent,
)
from selftaught.sleep.night.config import NightConfig, NightModels, is_remote
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.followup_model import ModelReader
from selftaught.sleep.night.mine import (
    NO_CHECK,
    MineConfig,
    MinedTask,
    merge_near_duplicates,
    mine_one,
)
from selftaught.sleep.night.miner import Miner, Pending, wants_check
from selftaught.sleep.night.phases.context import Harvest, NightContext, Phase
from selftaught.sleep.night.replay import conversations, mine_tool_task
from selftaught.sleep.night.signals import REDONE, is_redo, read_threads, rejected_signals
from selftaught.sleep.paths import (
    Adopted,
)
from selftaught.sleep.records import (
    MinerRecord,
    MiningRecord,
)
from selftaught.sleep.result import NightDraft
from selftaught.tasks.scorers import LlmJudge


class MinePhase(Phase):
    """Mine tonight's tasks (checks from the users' own verdicts, the agents' test runs,
    references and rules, the miner's written checks), merge near-duplicates, recall past
    tasks; the night's `mining` and `recall` are known as soon as it ends (a night too small
    to gate still reports them)."""

    name = "mine"
    seconds = "mine"

    def run(self, ctx: NightContext) -> MiningRecord:
        night, config, models = ctx.night, ctx.config, ctx.models
        kept, withheld = _private_filter(ctx.rows, models, config.allow_remote)
        mining = dataclasses.replace(config.mining, judge=models.judge is not None)
        unchecked: list[Interaction] = []
        miner = _night_miner(config, models, mining, ctx.ledger, ctx.evidence)
        rejected = rejected_signals(night.project, ctx.home)
        workspaces = WorkspaceMiner(night.project, ctx.home)
        tasks, mined = mine(kept, mining, rejected, unchecked, miner, workspaces)
        night.mining = dataclasses.replace(mined, withheld_private=withheld)
        if ctx.ledger.roles:  # the miner's calls, even when the night stops before consolidating
            night.usage = ctx.ledger.to_dict()
        if mined.miner is not None and mined.miner.backend_errors:
            night.note(
                f"{mined.miner.backend_errors} miner calls failed (first: "
                f"{mined.miner.first_error}); those rows were left without a written check"
            )
        if withheld:
            night.note(
                f"{withheld} private (harvested) interactions were left out: "
                f"{', '.join(models.remote())} is a remote model; mark them reviewed or pass "
                "--allow-remote to use them"
            )
        combined, rest = _recall(night, tasks, config, models, ctx.adopted, ctx.home, mining)
        combined = _checkable(night, combined, tasks, is_agent(models.target))
        private_ids = {it.id for it in kept if it.private and not it.reviewed}
        ctx.harvest = Harvest(tasks, combined, rest, private_ids, unchecked, mining)
        return night.mining


def _private_filter(
    rows: list[Interaction], models: NightModels, allow_remote: bool
) -> tuple[list[Interaction], int]:
    remote = models.remote()
    if not remote or allow_remote:
        return rows, 0
    kept = [it for it in rows if not it.private or it.reviewed]
    return kept, len(rows) - len(kept)


def mine(
    interactions: list[Interaction],
    config: MineConfig,
    rejected: set[str] | None = None,
    unchecked: list[Interaction] | None = None,
    miner: Miner | None = None,
    workspaces: WorkspaceMiner | None = None,
) -> tuple[list[MinedTask], MiningRecord]:
    """Tasks from `interactions` (already filtered for privacy by the caller), with the
    night's `mining` (what was dropped and why): chat threads read for the user's own verdicts first
    (`signals.read_threads`; `rejected`: signals the operator rejected), coding agents' rows
    for their own test runs (`agent_outcome.read_outcomes`), then a solved agent row with a
    session record through `workspaces` (a workspace task, when its check is two-sided),
    plain exchanges through `mine.mine_one`, tool-using conversations through
    `replay.mine_tool_task` (here, above both, so neither imports the other back). `miner`
    reads the next turns the rules could not (`followup_model.py`, when `read_followups` is
    set) and writes checks for the plain exchanges left without a strong one (`miner.py`).
    `unchecked`: receives the plain exchanges still dropped for having nothing to check them
    by (`mine.NO_CHECK`), as rows read from their threads, for `weak.py` (they are still
    counted as dropped)."""
    reader = ModelReader(miner) if miner is not None and miner.config.read_followups else None
    rows, _, conversation = read_threads(interactions, config, rejected, reader)
    rows, _, agent = read_outcomes(rows, rejected)
    signals = Counter(conversation.signals)  # one count of signals by kind, whatever the source
    signals.update(agent.signals)
    conversation = conversation.but(signals=dict(signals))
    dropped: Counter[str] = Counter()
    redone = sum(is_redo(it) for it in rows)  # a retry's reply, and its episode's tool calls
    if redone:
        dropped[REDONE] = redone
    tasks: list[MinedTask] = []
    steps = 0  # earlier steps of a tool-using conversation, folded into its last one
    pending: list[Pending] = []  # plain exchanges without a strong check, for the miner
    for group in conversations([it for it in rows if not is_redo(it)]):
        steps += len(group) - 1
        task = workspaces.mine(group[0], config) if workspaces is not None else None
        why: str | None = None
        if task is None and logged_tools(group[0]):
            task, why = mine_tool_task(group, config)
        elif task is None:
            task, why = mine_one(group[0], config)
            if miner is not None and wants_check(task, why):
                pending.append(Pending(group[0], task, why))
                continue
        _keep(group[0], task, why, tasks, dropped, unchecked)
    written = MinerRecord.empty()  # `{}`: no miner ran
    if miner is not None:
        found, written = miner.resolve(pending, rows)
        for p, (task, why) in zip(pending, found, strict=True):
            _keep(p.row, task, why, tasks, dropped, unchecked)
    merged = merge_near_duplicates(tasks, config.near_duplicate)
    seen: Counter[str] = Counter()
    for task in merged:  # equal ids from prompts that differ only in punctuation
        seen[task.id] += 1
        if seen[task.id] > 1:
            task.id = f"{task.id}-{seen[task.id]}"
    return merged, MiningRecord(
        read=len(interactions),
        tasks=len(merged),
        merged=len(tasks) - len(merged) + steps,
        by_check=dict(Counter(t.check for t in merged)),
        negative=sum(t.negative for t in merged),
        dropped=dict(dropped),
        conversation=conversation,
        miner=written,
        agent=agent if workspaces is None else workspaces.counted(agent),
    )


def _keep(
    row: Interaction,
    task: MinedTask | None,
    why: str | None,
    tasks: list[MinedTask],
    dropped: Counter[str],
    unchecked: list[Interaction] | None,
) -> None:
    """A mined row's outcome: its task kept, or why it was dropped (and, with nothing to check
    it by, handed to the weak labels)."""
    if task is not None:
        tasks.append(task)
        return
    dropped[why or "unknown"] += 1
    if unchecked is not None and (why or "").startswith(NO_CHECK):
        unchecked.append(row)


def _night_miner(
    config: NightConfig,
    models: NightModels,
    mining: MineConfig,
    ledger: UsageLedger,
    evidence: EvidenceLog,
) -> Miner | None:
    """The night's miner, its calls (and the judge's, testing its rubrics) charged to the
    night's ledger and evidence log; None when the night has none."""
    if models.miner is None:
        return None
    config.training.budget.check_priced([models.miner.name])
    judge = None
    if models.judge is not None:
        tracked = TrackedModel(EvidenceModel(models.judge, evidence, "judge"), ledger, "judge")
        judge = LlmJudge(tracked)
    return Miner(
        TrackedModel(EvidenceModel(models.miner, evidence, "miner"), ledger, "miner"),
        models.miner_label() or "miner",
        config.miner,
        judge=judge,
        send_private=config.allow_remote or not is_remote(models.miner_spec),
        mining=mining,
    )


def _recall(
    night: NightDraft,
    tasks: list[MinedTask],
    config: NightConfig,
    models: NightModels,
    adopted: Adopted,
    home: Path,
    mining: MineConfig,
) -> tuple[list[MinedTask], list[recall.Recalled]]:
    """Tonight's tasks and the recalled ones (`recall.combine`), the night's `recall`
    recorded; the pool's records to write back after the night."""
    pool = recall.load(night.project, home) if config.recall_max else []
    combined, recalled, rest = recall.combine(
        tasks,
        pool,
        threshold=mining.near_duplicate,
        private_ok=config.allow_remote or not models.remote(),
        pinned=split_skill(adopted.skill).demos,
    )
    night.recall = dataclasses.replace(recalled, max=config.recall_max)
    return combined, rest


WORKSPACE_LEFT = "a workspace task (the agent's own test run) needs an agent target or its folder"


def _checkable(
    night: NightDraft, combined: list[MinedTask], tonight: list[MinedTask], agent: bool
) -> list[MinedTask]:
    """The tasks the target can be checked on: on an agent, those its run can be checked on
    (`agent_replay.for_agent`); the workspace tasks only on an agent or with their folder
    (`agent_outcome.for_target`). The others are counted among tonight's dropped, or noted
    when recalled."""
    if agent:
        combined, left = for_agent(combined)
        _leave_out(night, left, tonight, NOT_CHECKABLE)
    kept, left = for_target(combined, agent)
    _leave_out(night, left, tonight, WORKSPACE_LEFT)
    return kept


def _leave_out(
    night: NightDraft, left: list[MinedTask], tonight: list[MinedTask], why: str
) -> None:
    tonight_ids = {id(t) for t in tonight}
    mined_left = sum(id(t) in tonight_ids for t in left)
    if mined_left and night.mining is not None:
        dropped = dict(night.mining.dropped)
        dropped[why] = dropped.get(why, 0) + mined_left
        night.mining = dataclasses.replace(night.mining, dropped=dropped)
    if len(left) > mined_left:
        night.note(f"{len(left) - mined_left} recalled tasks were left out: {why}")
