"""Consolidate: the night's tasks → a better skill, then a better memory, with the SkillOpt
trainer (reflect → merge → select → apply → gate), not a second optimizer.

The skill is trained with the memory held fixed, then the memory with the new skill held fixed;
both trainers charge ONE usage ledger, so the night's budget covers both (a budget spent by the
skill phase skips the memory phase, saying so), and every call of the target, the analyst and
the judge goes through the evidence log. `backend_failure` tells a night whose backend failed
from one that had nothing to learn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from rich.console import Console

from selftaught.demos import Demo, LeakCheck, join_skill, split_skill
from selftaught.evaluation import ScoreCache, metric_scores
from selftaught.gate import Paired, paired_comparison
from selftaught.models.base import ChatModel
from selftaught.models.errors import FatalBackendError
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.runs import RunDir, RunError, read_json
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit
from selftaught.skill.reflect import DocumentKind
from selftaught.skill.result import SkillRunResult
from selftaught.skill.trainer import SkillTrainer
from selftaught.sleep.night.demo_modes import DemoModeConfig, choose_demo_mode
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.split import NightTask
from selftaught.sleep.paths import Adopted
from selftaught.sleep.records import (
    AnalystRecord,
    LateDuplicate,
    PhaseRecord,
    SkillTestRecord,
    SlowRecord,
    Summary,
)
from selftaught.stops import UNLIMITED, Deadline, StopReason, StopRecord
from selftaught.tasks.scorers import LlmJudge


@dataclass
class Consolidation:
    """The text phases' outcome: the best skill and memory, each document's phase record
    (report.json `phases`), the night's ledger, a fatal backend error, notes, the adopted
    demos left out, and the val scores each phase kept."""

    skill: str
    memory: str
    phases: dict[str, PhaseRecord]
    ledger: UsageLedger
    fatal: FatalBackendError | None = None
    notes: list[str] = field(default_factory=list)
    duplicates: list[LateDuplicate] = field(default_factory=list)
    """Adopted demos left out: the same item as a val / test task tonight."""
    # each phase's val scores by skill hash, in memory (the night pairs before and after)
    val_scores: dict[str, ScoreCache] = field(default_factory=dict)
    val_final: Summary | None = None  # val of the proofread proposal, when it changed


# what a phase's row keeps of the trainer's result (its readable keys), in report.json's order
RAN_KEYS = ("document", "ran", "run_dir", "changed", "steps", "total_steps", "best_version",
            "val_initial", "val_best", "decisions", "analyst", "stopped_by", "test",
            "slow")  # fmt: skip  # slow: the slow update at the phase's end (issue 51), when due


def _phase(
    document: str,
    training: SkillOptConfig,
    progress: bool,
    task: NightTask,
    target: ChatModel,
    optimizer: ChatModel,
    initial: str,
    other: str,
    run_dir: Path,
    ledger: UsageLedger,
    console: Console,
    proposals: list[Edit],
    scores: dict[str, ScoreCache],
) -> tuple[str, PhaseRecord]:
    """One trainer (skill or memory): its best text and its phase's row, or why it stopped
    early. Its val scores go into `scores[document]`."""
    training = dataclasses.replace(training, evaluate_test=bool(task.examples("test")))
    trainer = SkillTrainer(  # the class build_trainer picks (trainers.py builds nights too)
        training,
        task,
        target,
        optimizer_model=optimizer,
        initial_skill=initial,
        document=cast("DocumentKind", document),  # DOCUMENTS: skill or memory
        other_document=other,
        proposals=proposals,
        output_dir=run_dir,
        ledger=ledger,
        progress=progress,
        console=console,
        say_power=False,  # the night said it before its first phase, in val tasks
    )
    scores[document] = trainer.val_cache
    try:
        result = trainer.train()
    except RunError as err:  # the budget ran out before the baseline was even scored
        return initial, _not_run(document, stopped_by=StopReason.read(str(err)))
    return result.best_skill, _ran(document, result, run_dir, initial)


def _ran(document: str, result: SkillRunResult, run_dir: Path, initial: str) -> PhaseRecord:
    """A phase's row in the night's report.json, from its trainer's result."""
    return PhaseRecord(
        document=document,
        ran=True,
        run_dir=str(run_dir),
        changed=result.best_skill.strip() != initial.strip(),
        steps=result.steps,
        total_steps=result.total_steps,
        best_version=result.best_version,
        val_initial=None if result.val_initial is None else Summary.of(result.val_initial),
        val_best=None if result.val_best is None else Summary.of(result.val_best),
        decisions=dict(result.decisions),
        analyst=AnalystRecord.of(result.analyst),
        stopped_by=None if result.stopped_by is None else StopRecord.of(result.stopped_by),
        test=None if result.test is None else SkillTestRecord.of(result.test),
        slow=None if result.slow is None else SlowRecord.of(result.slow),
    ).only(*RAN_KEYS)


def _not_started(document: str, ledger: UsageLedger, deadline: Deadline) -> StopReason | None:
    """Why a phase does not start: the budget spent by the skill phase, or the night's
    --max-minutes passed; None: it starts."""
    if document == "memory" and ledger.budget.limited and ledger.exhausted():
        return StopReason("budget", str(ledger.exhausted()), "spent before the memory phase")
    if deadline.passed():
        assert deadline.minutes is not None
        return StopReason.max_minutes(deadline.minutes, f"before the {document} phase")
    return None


def _with_time_left(training: SkillOptConfig, deadline: Deadline) -> SkillOptConfig:
    """The phase's trainer stops after the step that crosses the night's deadline."""
    if not deadline.limited:
        return training
    stops = dataclasses.replace(training.stops, max_minutes=deadline.remaining_minutes())
    return dataclasses.replace(training, stops=stops)


MAX_STATEMENTS = 4  # the operator's comments proposed to the memory in one night


def user_statements(task: NightTask) -> list[Edit]:
    """What the operator told the agent in feedback comments on train tasks, as memory edits
    (newest tasks first, deduplicated). Only trusted comments are here (`state["comment"]`;
    an end user's is evidence, `mine.py`); the gate still has to see one help on val before
    it is kept, and val / test comments are never used."""
    seen: dict[str, Edit] = {}
    for ex in task.examples("train"):
        said = str(ex.state.get("comment") or "").strip()
        if said and said.lower() not in seen:
            seen[said.lower()] = Edit("append", content=f"- The user said: {said}", support=2)
    return list(seen.values())[:MAX_STATEMENTS]


def _skill_start(
    adopted_skill: str, task: NightTask, dropped: list[LateDuplicate]
) -> tuple[str, list[str]]:
    """The skill phase's first skill: the adopted one, less a retrieval pool (the phase
    searches static demo sets; the pool comes back as a demo-mode candidate) and less any
    demo that is now the same item as a val / test task (it could never be gated: appended
    to `dropped`); with notes."""
    parts = split_skill(adopted_skill)
    notes = []
    demos: Sequence[Demo] = parts.demos
    if parts.retrieve:
        demos = ()
        notes.append(
            f"the adopted skill retrieves from a pool of {len(parts.demos)} demos; the skill "
            "phase started from its rules, and the pool was tried again as a demo mode"
        )
    held_out = LeakCheck.of_task(task)
    demos, leaks = held_out.filter(demos)
    dropped += [
        LateDuplicate(item=x.demo_id, held_out=x.held_out_id, split=x.split, phase="demos")
        for x in leaks
    ]
    if leaks:
        notes.append(
            f"{len(leaks)} adopted demos were left out of the skill phase: "
            + "; ".join(x.why() for x in leaks[:3])
        )
    if not notes:
        return adopted_skill, []
    return join_skill(parts.rules, demos, parts.placement), notes


def _demo_modes(
    phase: PhaseRecord,
    best: str,
    training: SkillOptConfig,
    modes: DemoModeConfig,
    task: NightTask,
    target: ChatModel,
    adopted: Adopted,
    night_dir: Path,
    started_from_adopted: bool,
    cache: ScoreCache,
) -> tuple[str, PhaseRecord]:
    """Run the three-way demo-mode gate after the skill phase: the skill to go on with, and
    the phase's row saying what was chosen."""
    chosen = choose_demo_mode(
        training,
        modes,
        task,
        target,
        night_dir,
        best,
        adopted.skill,
        adopted.memory,
        started_from_adopted,
        cache,
    )
    record = chosen.record
    changes: dict[str, object] = {"demo_modes": record}
    if "adopted" in record.candidates and not started_from_adopted:
        changes["val_initial"] = record.candidates["adopted"]
    winner = record.winner or ""
    if winner in record.candidates and chosen.skill.strip() != best.strip():
        changes["val_best"] = record.candidates[winner]
    changes["changed"] = chosen.skill.strip() != adopted.skill.strip()
    return chosen.skill, phase.but(**changes)


def _slow_note(document: str, phase: PhaseRecord) -> list[str]:
    """A line for the report when the phase ran the slow update (issue 51)."""
    slow = phase.slow
    if slow is None or not slow.due:
        return []
    done = "shipped" if slow.shipped else slow.decision or "no rewrite"
    return [f"{document}: slow update ({slow.runs} nights): {done}, {slow.reason}"]


def consolidate(
    training: SkillOptConfig,
    documents: tuple[str, ...],
    progress: bool,
    task: NightTask,
    target_model: ChatModel,
    optimizer_model: ChatModel,
    judge_model: ChatModel | None,
    adopted: Adopted,
    night_dir: Path,
    evidence: EvidenceLog,
    console: Console,
    modes: DemoModeConfig | None = None,
    ledger: UsageLedger | None = None,
    deadline: Deadline = UNLIMITED,
) -> Consolidation:
    """Train the night's documents in order on `task`; the best of each and what happened.
    After the skill phase, `modes` (default: `DemoModeConfig()`) compares how the skill
    shows its demos (none / static / retrieved) on the same gate. `ledger`: the night's, when
    it already charged calls (the miner's, weak labels, dreams); else a new one. `deadline`:
    the night's --max-minutes; each phase's trainer stops after its step when it passes, and
    a phase not started by then is skipped."""
    modes = modes or DemoModeConfig()
    ledger = ledger if ledger is not None else UsageLedger()
    target = EvidenceModel(target_model, evidence, "target")
    optimizer = EvidenceModel(optimizer_model, evidence, "optimizer")
    if judge_model is not None:
        judge = EvidenceModel(judge_model, evidence, "judge")
        task.judge = LlmJudge(TrackedModel(judge, ledger, "judge"))
    result = Consolidation(adopted.skill, adopted.memory, {}, ledger)
    skill_start, start_notes = _skill_start(adopted.skill, task, result.duplicates)
    result.notes += start_notes
    for document in documents:
        why = _not_started(document, ledger, deadline)
        if why is not None:
            result.phases[document] = _not_run(document, stopped_by=why)
            continue
        skill_doc = document == "skill"
        t0 = time.perf_counter()
        try:
            best, phase = _phase(
                document,
                _with_time_left(training, deadline),
                progress,
                task,
                target,
                optimizer,
                skill_start if skill_doc else result.memory,
                result.memory if skill_doc else result.skill,
                night_dir if skill_doc else night_dir / "memory",
                ledger,
                console,
                [] if skill_doc else user_statements(task),
                result.val_scores,
            )
        except FatalBackendError as err:
            result.fatal = err
            result.phases[document] = _not_run(document, error=str(err))
            return result
        result.notes += _slow_note(document, phase)
        phase = phase.but(seconds=round(time.perf_counter() - t0, 2))  # demo modes not included
        if skill_doc and phase.ran and training.demos_max:
            try:
                tracked = TrackedModel(target, ledger, "target")
                cache, from_adopted = result.val_scores["skill"], not start_notes
                best, phase = _demo_modes(phase, best, training, modes, task, tracked, adopted,
                                          night_dir, from_adopted, cache)  # fmt: skip
            except FatalBackendError as err:
                result.fatal = err
                result.phases[document] = phase
                return result
        elif skill_doc and phase.ran and start_notes:
            best = adopted.skill  # nothing gated the phase's start against it
        result.phases[document] = phase
        if skill_doc:
            result.skill = best
        else:
            result.memory = best
    return result


def _not_run(
    document: str, *, stopped_by: StopReason | None = None, error: str | None = None
) -> PhaseRecord:
    """A document phase that did not run, and why (`stopped_by` or `error`)."""
    if error is not None:
        return PhaseRecord(document=document, error=error).only("document", "ran", "error")
    stop = None if stopped_by is None else StopRecord.of(stopped_by)
    return PhaseRecord(document=document, stopped_by=stop).only("document", "ran", "stopped_by")


def backend_failure(result: Consolidation, evidence: EvidenceLog, max_missing: float) -> str | None:
    """Why the backend failed this night (None when it did not)."""
    if result.fatal is not None:
        return f"a backend call failed fatally: {result.fatal}"
    first_error = evidence.errors[0]["error"] if evidence.errors else "no error message"
    analyst = result.ledger.to_dict().get("optimizer", {})
    if analyst.get("errors") and not analyst.get("calls"):
        why = next((e["error"] for e in evidence.errors if e["role"] == "optimizer"), first_error)
        return f"every analyst call failed ({analyst['errors']} calls; first: {why})"
    for document, phase in result.phases.items():
        if not phase.ran or phase.run_dir is None:
            continue
        run_dir = Path(phase.run_dir)
        rows = read_json(run_dir / "diagnostics" / "step_0000.json").get("val", [])
        failed = [r for r in rows if r.get("error")]
        if rows and len(failed) > max_missing * len(rows):
            return (
                f"the {document} phase's baseline could not be scored: {len(failed)} of "
                f"{len(rows)} val replays failed (first: {failed[0]['error']})"
            )
        for row in RunDir(run_dir).history()[1:]:
            gate = row.get("gate") or {}
            if gate.get("decision") == "reject" and "backend errors" in str(gate.get("reason")):
                return (
                    f"the {document} phase could not evaluate a candidate at step "
                    f"{row.get('step')}: {gate['reason']} (first error: {first_error})"
                )
    return None


def paired_val(result: Consolidation, adopted: Adopted, skill: str, memory: str) -> Paired:
    """Val before (the adopted documents) and after (the proposal), paired per task, from the
    scores the phases kept in memory (the hard metric)."""
    caches = list(result.val_scores.values())
    scores = caches[0].merged(*caches[1:]) if caches else ScoreCache()
    before = scores.get(Policy(adopted.skill, adopted.memory).skill_hash())
    after = scores.get(Policy(skill, memory).skill_hash())
    return paired_comparison(metric_scores(after), metric_scores(before))
