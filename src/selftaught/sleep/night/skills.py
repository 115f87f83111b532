"""A night that trains many skills (`SleepConfig.many_skills`, `sleep run --skills`).

One skill per kind of request (`kinds.py`): the kind's id is its skill's name, so the skill a
kind learned is the one its next nights start from. After mining and the split, each kind with
tasks tonight is one cluster: its train, val and test tasks (recalled ones too), starting from
the adopted skill of its name. A kind with enough train tasks (`skill_min_tasks`) and traffic
tonight is trained and gated on its own val and on the whole val (`selftaught.skill.skillset`:
no other kind may lose beyond the gate's per-kind rule). A kind with no traffic tonight is
held: its skill is not trained, staged or gated again (its val tasks, recalled, still count as
its own in the other skills' whole-val checks, so a new skill that breaks it is refused); an
adopted skill with no task tonight is held the same way. Each accepted skill is staged
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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from selftaught.errors import InputError
from selftaught.models.errors import FatalBackendError
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.skill.routing import SkillCard
from selftaught.skill.skill_md import SkillFile
from selftaught.skill.skillset import (
    SkillOutcome,
    SkillSetConfig,
    SkillSetResult,
    TaskCluster,
    fallback_name,
    train_skill_set,
)
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
from selftaught.sleep.night.kinds import ItemValues, KindSkill, NightKinds, kind_records
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


def starting_cards(project: str, home: Path, repo: Path | None) -> list[SkillCard]:
    """The cards of the skills a many-skills night starts from (`_starting_skills`), for the
    kinds to take the tasks they route (`kinds.find_kinds`' seeds)."""
    start, _ = _starting_skills(project, home, repo, [])
    return [s.card for s in start]


QUIET = "no traffic of its kind tonight: kept as it is, not trained or gated again"


def kind_clusters(
    kinds: NightKinds, task: Any, start: Sequence[SkillFile], max_skills: int
) -> list[TaskCluster]:
    """One cluster per kind with tasks tonight and per starting skill (module docstring): the
    starting skills first, in their order, then the other kinds, most train tasks first. Past
    `max_skills` kinds with traffic, those with the fewest train tasks are held too."""
    by_kind: dict[str, dict[str, list[Any]]] = {}
    kind_of = {t.id: t.kind for t in kinds.tasks}
    for split in ("train", "val", "test"):
        for ex in task.examples(split):
            if kind_of.get(ex.id) is not None:
                by_kind.setdefault(str(kind_of[ex.id]), {}).setdefault(split, []).append(ex)
    terms = {k.id: k.terms for k in kinds.kinds}
    starts = {s.card.name: s for s in start}
    names = [*starts, *sorted((k for k in by_kind if k not in starts),
                              key=lambda k: (-len(by_kind[k].get("train", ())), k))]  # fmt: skip
    busy = [n for n in names if not kinds.quiet(n)]
    busy.sort(key=lambda n: -len(by_kind.get(n, {}).get("train", ())))
    over = set(busy[max_skills:])
    out = []
    for name in names:
        hold = QUIET if kinds.quiet(name) else None
        if name in over:
            hold = f"over --max-skills {max_skills}: the kinds with more train tasks went first"
        parts = by_kind.get(name, {})
        train = parts.get("train", [])
        first = starts.get(name)
        tasks = tuple(ex.prompt_text() for ex in train) or (first.card.tasks if first else ())
        description = first.card.description if first else fallback_name(terms[name])[1]
        out.append(
            TaskCluster(
                SkillCard(name, description, tasks),
                tuple(ex.id for ex in train),
                tuple(ex.id for ex in parts.get("val", ())),
                tuple(ex.id for ex in parts.get("test", ())),
                start=first,
                terms=terms.get(name, ()),
                hold=hold,
            )
        )
    return out


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
    kinds: NightKinds,
) -> None:
    """Train and gate one skill per kind, stage the accepted ones; the night's `skills`,
    `kinds`, `skill_set`, status and reason say what was staged (`config`: the
    `SleepConfig`)."""
    project = night.project
    if models.judge is not None:
        from selftaught.tasks.scorers import LlmJudge

        judge = EvidenceModel(models.judge, evidence, "judge")
        task.judge = LlmJudge(TrackedModel(judge, ledger, "judge"))
    notes: list[str] = []
    start, files = _starting_skills(project, home, config.skills_from, notes)
    night.note(*notes)
    set_config = SkillSetConfig(min_tasks=config.skill_min_tasks, max_skills=config.max_skills)
    clusters = kind_clusters(kinds, task, start, config.max_skills)
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
    inputs = {ex.id: ex.prompt_text() for ex in task.examples("train")}
    trained = [o for o in result.outcomes if _listed(o)]
    entries = [_entry(project, o, inputs, home, files.get(o.name)) for o in trained]
    for entry, outcome in zip(entries, trained, strict=True):
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
    night.kinds = kind_records(kinds, *_val_by_item(result), _kind_skills(result))
    night.usage = ledger.to_dict()
    night.status, night.reason = _skills_outcome(project, entries, staged, config.skill_min_tasks)


def _listed(outcome: SkillOutcome) -> bool:
    """Whether report.json `skills[]` lists the outcome: a skill trained tonight, or an
    existing one that was not (why); a held skill and a kind too small for one are in
    `kinds[]` only."""
    cluster = outcome.cluster
    return outcome.trained or (cluster.start is not None and cluster.hold is None)


def _kind_skills(result: SkillSetResult) -> dict[str, KindSkill]:
    """What became of each kind's skill tonight (report.json `kinds[].skill_status`)."""
    out = {}
    for o in result.outcomes:
        if o.accepted:
            status = "staged"
        elif o.trained:
            status = "rejected"
        else:
            status = "kept" if o.cluster.start is not None else "none"
        out[o.name] = KindSkill(o.name if status != "none" else None, status, o.reason)
    return out


def _val_by_item(result: SkillSetResult) -> tuple[ItemValues | None, ItemValues | None]:
    """Each val task's hard score served the starting skills and the accepted ones."""

    def hard(items: dict[str, list[float] | None]) -> ItemValues | None:
        return {i: None if v is None else float(v[0]) for i, v in items.items()} or None

    return hard(result.base_items), hard(result.shipped_items)


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
        f"no kind with traffic tonight has {min_tasks} train tasks"
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
