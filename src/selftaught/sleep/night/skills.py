"""A night that trains many skills (`SleepConfig.many_skills`, `sleep run --skills`).

After mining and the split, the night clusters its train tasks by intent, starting from the
project's adopted skills (a task their router sends to one joins it), and trains one skill per
cluster with enough tasks (`skill_min_tasks`, at most `max_skills`), each gated on its own
cluster's val and on the whole val (`selftaught.skill.skillset`). Each accepted skill is staged
on its own under `nights/<night>/skills/<name>/proposal/` with its report entry
(`skill_units.StagedSkill`, report.json `skills[]`), and adopted on its own with
`sleep adopt --skill NAME` (`--auto-adopt`: each accepted one). The night's own skill and
memory are not trained on such a night: the skills stand in for them.

With `skills_from` (`--skills-from REPO`) the user's own SKILL.md files in REPO start the skills
of their names too (an adopted skill of the same name wins); each staged proposal of one
records the file as read (`StagedSkill.source`) and adopting it writes it back there
(`adoption/write_back.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from selftaught.errors import InputError
from selftaught.models.errors import FatalBackendError
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.skill.skill_md import SkillFile
from selftaught.skill.skillset import SkillSetConfig, cluster_tasks, train_skill_set
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.placement import StartingDocument, read_starting_documents
from selftaught.sleep.adoption.skill_units import (
    StagedSkill,
    ValPair,
    adopt_skill,
    adopted_skills,
    router_tasks,
    write_skill_proposal,
)
from selftaught.sleep.adoption.write_back import SourceFile, written_by
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.records import SkillRecord, SkillSetRecord
from selftaught.sleep.night.result import NightResult
from selftaught.sleep.paths import Unit


def _pair(before: Any, after: Any) -> ValPair | None:
    if before is None or after is None:
        return None
    return ValPair(float(before.hard), float(after.hard), int(after.n))


def _starting_skills(
    project: str, home: Path, repo: Path | None, notes: list[str]
) -> tuple[list[SkillFile], dict[str, StartingDocument]]:
    """The skills the night starts from: the adopted ones, then the user's SKILL.md files in
    `repo` (a name adopted already, or seen twice, is noted and left to the first), and which
    of them came from a user's file (a file adopting wrote back still counts as that
    skill's file)."""
    adopted = {s.name: SkillFile(s.card, s.body) for s in adopted_skills(project, home)}
    start, files = list(adopted.values()), {}
    for doc in read_starting_documents(repo) if repo is not None else []:
        if doc.kind not in ("claude-skill", "codex-skill"):
            continue
        if doc.skill is None or not doc.usable:
            notes.append(f"{doc.path} not used: {doc.problem}")
            continue
        name = doc.skill.card.name
        if name in adopted:
            if _written_by_adopt(project, name, doc, home):
                files[name] = doc  # its adopted version is this file: adopting writes it
                continue
            notes.append(
                f"{doc.path}: skill {name!r} is adopted already; the night starts from its "
                "adopted version (adopting it does not write this file)"
            )
            continue
        try:
            Unit(project, name)
        except InputError as err:
            notes.append(f"{doc.path} not used: {err}")
            continue
        if name in files:
            notes.append(f"{doc.path} not used: {files[name].path} holds skill {name!r} too")
            continue
        start.append(doc.skill)
        files[name] = doc
    return start, files


def _written_by_adopt(project: str, name: str, doc: StartingDocument, home: Path) -> bool:
    """Whether `doc` is what adopting the skill's current version wrote into it."""
    unit = Unit(project, name)
    written = written_by(unit, staging.current_version(unit, home), home)
    return written is not None and (written.path, written.sha256_after) == (
        str(doc.path),
        doc.sha256,
    )


def _entry(
    project: str,
    outcome: Any,
    inputs: dict[str, str],
    home: Path,
    file: StartingDocument | None = None,
) -> StagedSkill:
    cluster = outcome.cluster
    whole = outcome.whole_val
    return StagedSkill(
        name=cluster.card.name,
        description=cluster.card.description,
        status="staged" if outcome.accepted else "rejected",
        reason=outcome.reason,
        base_version=staging.current_version(Unit(project, cluster.card.name), home),
        train_ids=tuple(cluster.train_ids),
        val_ids=tuple(cluster.val_ids),
        tasks=router_tasks([inputs[i] for i in cluster.train_ids if i in inputs]),
        own_val=_pair(outcome.own_before, outcome.own_after),
        whole_val=_pair(whole.before, whole.after) if whole is not None else None,
        source=SourceFile.of(file) if file is not None else None,
    )


def learn_skills(
    night: NightResult,
    task: Any,
    config: Any,
    models: Any,
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
    console: Console,
    home: Path,
) -> None:
    """Cluster, train and gate one skill per cluster, stage the accepted ones; the night's
    `skills`, `skill_set`, status and reason say what was staged (`config`: the
    `SleepConfig`)."""
    project = night.project
    if models.judge is not None:
        from selftaught.tasks.scorers import LlmJudge

        judge = EvidenceModel(models.judge, evidence, "judge")
        task.judge = LlmJudge(TrackedModel(judge, ledger, "judge"))
    notes: list[str] = []
    start, files = _starting_skills(project, home, config.skills_from, notes)
    night.note(*notes)
    train, val = task.examples("train"), task.examples("val")
    set_config = SkillSetConfig(min_tasks=config.skill_min_tasks, max_skills=config.max_skills)
    clusters = cluster_tasks(train, val, set_config, start)
    target = TrackedModel(EvidenceModel(models.target, evidence, "target"), ledger, "target")
    analyst = EvidenceModel(models.optimizer, evidence, "optimizer")
    try:
        result = train_skill_set(
            task,
            target,
            TrackedModel(analyst, ledger, "optimizer"),
            output_dir=night_dir / "skillset",
            config=config.training,
            set_config=set_config,
            start=start,
            clusters=clusters,
            progress=config.progress,
            console=console,
        )
    except FatalBackendError as err:
        night.usage = ledger.to_dict()
        night.status, night.reason = "backend_failed", f"training the skills: {err}"
        return
    inputs = {ex.id: ex.prompt_text() for ex in train}
    entries = [_entry(project, o, inputs, home, files.get(o.name)) for o in result.outcomes]
    for entry, outcome in zip(entries, result.outcomes, strict=True):
        if entry.status == "staged":
            write_skill_proposal(night_dir, project, entry, outcome.trained_body, home,
                                 files.get(entry.name))  # fmt: skip
    staged = [e.name for e in entries if e.status == "staged"]
    night.skills = tuple(SkillRecord.from_dict(e.to_dict()) for e in entries)
    night.skill_set = SkillSetRecord(
        clusters=len(clusters),
        staged=len(staged),
        unrouted_train=len(result.unrouted_train),
        unrouted_val=len(result.unrouted_val),
    )
    night.usage = ledger.to_dict()
    night.status, night.reason = _skills_outcome(project, entries, staged, config.skill_min_tasks)


def _skills_outcome(
    project: str, entries: list[StagedSkill], staged: list[str], min_tasks: int
) -> tuple[str, str]:
    """The night's status and reason: which skills it staged, or why none."""
    if staged:
        return (
            "staged",
            f"{len(staged)} of {len(entries)} skills staged ({', '.join(staged)}): "
            f"`selftaught sleep adopt --skill NAME --project {project}` adopts each",
        )
    why = "; ".join(f"{e.name}: {e.reason}" for e in entries) or (
        f"no cluster of at least {min_tasks} train tasks"
    )
    return "no_proposal", f"no skill was staged ({why})"


def auto_adopt_skills(
    project: str, night_dir: Path, home: Path, console: Console
) -> list[tuple[str, int]]:
    """Adopt each skill the night staged (`--auto-adopt`); the night is `adopted` once none
    waits. Returns (skill, version) of each adopted."""
    done = []
    for entry in staging.read_night(night_dir).skills:
        if entry.status != "staged":
            continue
        try:
            adoption = adopt_skill(project, entry.name, night_dir.name, home=home)
        except staging.StagingError as err:  # e.g. that skill changed meanwhile
            console.print(f"[bold yellow]warning:[/] {project}: skill not adopted: {err}")
            continue
        done.append((entry.name, adoption.version))
        console.print(f"{project}: adopted skill {entry.name} as its version {adoption.version}")
    night = staging.read_night(night_dir)  # as adopting each skill left it
    if done and not any(e.status == "staged" for e in night.skills):
        night.status = "adopted"
        staging.write_night(night)
    return done
