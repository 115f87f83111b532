"""What a project's night does before its first phase and after its last: its draft as it
starts (report.json's first write, as running), the adopted version it starts from and the
target as it serves, the slow update's edit ledger; then what the night keeps for the next
(recall, weak labels, kinds), its patience count, its `NightResult` and the last writes, and
--auto-adopt."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from rich.console import Console

from selftaught.models.usage import UsageLedger
from selftaught.prompts import PromptSet
from selftaught.redact import redact_for_model
from selftaught.runs import (
    atomic_write_json,
    atomic_write_text,
    make_private,
)
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.ledger import EditLedger
from selftaught.sleep import pause
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.write_back import adopt_night
from selftaught.sleep.kinds_file import save_kinds
from selftaught.sleep.night import recall, summary
from selftaught.sleep.night.config import (
    NightConfig,
    NightModels,
)
from selftaught.sleep.night.evidence import EvidenceLog
from selftaught.sleep.night.phases import (
    NightContext,
    NightWindow,
    Splits,
)
from selftaught.sleep.night.slow import night_ledger, sync_rollbacks, with_ledger
from selftaught.sleep.night.start_files import start_from
from selftaught.sleep.night.weak import (
    remember_waiting,
)
from selftaught.sleep.paths import (
    Adopted,
)
from selftaught.sleep.records import (
    AdoptedAdapter,
    BudgetRecord,
    GateMode,
    ModelSpecs,
    TrainingRecord,
    WindowRecord,
)
from selftaught.sleep.result import NightDraft, NightResult


def gate_mode(training: SkillOptConfig, held_out: bool = True) -> GateMode:
    g = training.gate
    return GateMode(
        mode="off" if g.accept_all else "on",
        no_val=not held_out,
        metric=g.metric,
        margin=g.margin,
        confidence=g.confidence,
        tag_alpha=g.tag_alpha,
        tag_margin=g.tag_margin,
    )


def new_night(
    project: str, night: str, night_dir: Path, models: NightModels, config: NightConfig, home: Path
) -> NightDraft:
    """The night as it starts (report.json's first write, as running)."""
    training = config.training
    return NightDraft(
        project=project,
        night_dir=night_dir,
        night=night,
        status="running",
        pid=os.getpid(),
        started_at=time.time(),
        models=models.specs(),
        gate=gate_mode(training, config.split.held_out),
        training=TrainingRecord(
            epochs=training.epochs,
            batch_size=training.batch_size,
            rollouts_k=training.rollouts_k,
            concurrency=training.concurrency,
            documents=tuple(config.documents),
            preferences=bool(training.preferences.strip()),
            prompts=PromptSet.read(training.prompts).digests() or None,
        ),
        budget=BudgetRecord.of(training.budget),
        base_version=staging.current_version(project, home),
    )


def model_change(now: ModelSpecs | None, project: str, home: Path) -> str | None:
    last = staging.last_models(project, home)
    if last is None or now is None:
        return None
    night, before = last
    keys = ("target", "optimizer", "judge", "target_name")
    changed = [k for k in keys if getattr(before, k) != getattr(now, k)]
    if not changed:
        return None
    parts = ", ".join(f"{k} {getattr(before, k)!r} → {getattr(now, k)!r}" for k in changed)
    return (
        f"the models changed since night {night} ({parts}): a skill learned for one model may "
        "not suit another"
    )


def night_context(
    project: str,
    window: NightWindow,
    config: NightConfig,
    models: NightModels,
    home: Path,
    console: Console,
    night_dir: Path,
    dry_run: bool,
    ledger: UsageLedger,
) -> NightContext:
    """The night as it starts: its draft (report.json's first write, as running), the
    adopted version it starts from (a --start-document's text in its skill), the target as
    it serves (with the adopted adapter), a warning when the models changed since the last
    night, and the project's edit ledger for the slow update (issue 51, rollbacks noted)."""
    draft = new_night(project, window.night, night_dir, models, config, home)
    adopted = start_from(draft, staging.read_adopted_files(project, home), config.start_document)
    models = as_served(models, adopted, draft)
    change = model_change(draft.models, project, home)
    if change:
        draft.note(change)
        console.print(f"[bold yellow]warning:[/] {project}: {change}")
    edits = night_ledger(project, home, night_dir, dry_run)
    config = dataclasses.replace(config, training=with_ledger(config.training, edits))
    sync_rollbacks(project, home, EditLedger(config.training.edit_ledger or edits))
    atomic_write_json(night_dir / "report.json", draft.result().report_dict())
    return NightContext(
        night=draft,
        config=config,
        models=models,
        adopted=adopted,
        night_dir=night_dir,
        home=home,
        console=console,
        evidence=EvidenceLog(night_dir / "evidence.jsonl"),
        ledger=ledger,
        rows=list(window.rows),
        since=window.since,
        until=window.until,
        deadline=window.deadline,
        dry_run=dry_run,
    )


def remember(night: NightDraft, mined: Splits, config: NightConfig, home: Path) -> None:
    """Keep tonight's tasks for the nights to come (`recall.py`), the weak labels still
    waiting for a reference (`weak.py`) and the kinds found (`kinds.py`), once the night has
    used its interactions."""
    if config.recall_max and night.recall is not None:
        pool_after = recall.remember(night.project, home, night.night, mined.tonight,
                                     mined.rest, mined.private_ids, config.recall_max)  # fmt: skip
        night.recall = dataclasses.replace(night.recall, pool_after=pool_after)
    if mined.kinds is not None:
        save_kinds(night.project, home, mined.kinds.kinds, mined.kinds.similarity)
    if mined.weak_waiting is not None:
        remember_waiting(night.project, home, mined.weak_waiting)


def count_patience(night: NightDraft, config: NightConfig, home: Path) -> None:
    """Count the night toward `--patience` (`sleep/pause.py`); the stop when it fired."""
    project = night.project
    stop = pause.count_night(project, night.night, night.status, config.stops.patience, home)
    if stop is not None:
        night.stopped_by = stop  # it outranks max-minutes: it pauses the schedule
        night.note(
            f"stopped by {stop}: the schedule of {project} is paused "
            f"(`selftaught sleep resume --project {project}` resumes it)"
        )


def as_served(models: NightModels, adopted: Adopted, night: NightDraft) -> NightModels:
    """The night measures the agent as it serves: with the adopted version's adapter, when it
    has one (a weight night then goes on training that adapter)."""
    if adopted.adapter is None:
        return models
    from selftaught.models.adapters import with_adapter
    from selftaught.models.local import LocalModel

    night.adapter = AdoptedAdapter(version=adopted.version, dir=str(adopted.adapter))
    if not isinstance(models.target, LocalModel):
        night.note(
            f"version {adopted.version} serves an adapter, but the night's target "
            f"{models.target_spec!r} is not a local model: val was measured without it"
        )
        return models
    return dataclasses.replace(models, target=with_adapter(models.target, adopted.adapter))


def auto_adopt(
    outcome: NightResult,
    night_dir: Path,
    night: str,
    config: NightConfig,
    home: Path,
    console: Console,
) -> NightResult:
    project = outcome.project
    if config.many_skills:  # each staged skill in its own unit (nightskills)
        from selftaught.sleep.night.skills import auto_adopt_skills

        auto_adopt_skills(project, night_dir, home, console)
        return staging.read_night(night_dir)
    try:
        adoption = adopt_night(  # staging.adopt, writing back a --start-document
            project,
            night,
            home=home,
            target_paths=config.target_skill_paths,
            follow_symlinks=config.follow_symlinks,
        )
    except staging.StagingError as err:  # e.g. someone adopted another version meanwhile
        console.print(f"[bold yellow]warning:[/] {project}: not adopted: {err}")
        return outcome
    console.print(f"{project}: adopted night {night} as version {adoption.version}")
    return staging.read_night(night_dir)


def finish(night_dir: Path, draft: NightDraft, evidence: EvidenceLog) -> NightResult:
    """The night's end: its `NightResult`, made once, then its last writes from it:
    diagnostics, report.md, then report.json (its status). Its reason and notes are redacted
    first: they quote errors, and a server may quote a key."""
    draft.reason = redact_for_model(draft.reason) if draft.reason else draft.reason
    draft.notes = tuple(redact_for_model(note) for note in draft.notes)
    draft.evidence_calls = evidence.calls
    draft.ended_at = time.time()
    if draft.status not in staging.ADVANCES_CURSOR:
        draft.consumed_until = None  # read again next night
    night = draft.result()
    report = night.report_dict()
    summary.write_diagnostics(night_dir, night, evidence)
    summary.write_markdown(night_dir, night)
    atomic_write_text(night_dir / "README.txt", staging.NIGHT_LAYOUT)
    atomic_write_json(night_dir / "report.json", report)
    make_private(night_dir)  # what the trainers and peft wrote there with the umask's modes
    return night


def empty_night(
    project: str, night: str, since: float, until: float, home: Path, night_dir: Path
) -> NightResult:
    """A named project with no traffic in its window: nothing to load, nothing to learn."""
    outcome = NightResult(
        project=project,
        night_dir=night_dir,
        night=night,
        status="too_few_tasks",
        reason="no interactions since the last night",
        started_at=until,
        ended_at=time.time(),
        base_version=staging.current_version(project, home),
        window=WindowRecord(since=since, until=until, read=0, capped=None),
    )
    report = outcome.report_dict()
    summary.write_markdown(night_dir, outcome)
    atomic_write_json(night_dir / "report.json", report)
    return outcome


# ---- the night ------------------------------------------------------------------------------
