"""A night that trains many skills (`NightConfig.many_skills`, `sleep run --skills`).

One skill per kind of request (`kinds.py`): the kind's id is its skill's name, so the skill a
kind learned is the one its next nights start from. After mining and the split, each kind with
tasks tonight is one cluster: its train, val and test tasks (recalled ones too), starting from
the adopted skill of its name. A kind with enough train tasks (`skill_min_tasks`) and traffic
tonight is trained and gated on its own val and on the whole val (`selftaught.skill.skillset`:
no other kind may lose beyond the gate's per-kind rule). A kind with no traffic tonight is
held: its skill is not trained, staged or gated again (its val tasks, recalled, still count as
its own in the other skills' whole-val checks, so a new skill that breaks it is refused); an
adopted skill with no task tonight is held the same way. Then each trained kind's memory and
adapter (`skill_parts.py`: per skill, or one adapter shared by every kind). Each skill whose
text, memory or adapter won is staged on its own under `nights/<night>/skills/<name>/`
(`proposal/`, `adapter/`) with its report entry (`records.SkillRecord`, report.json
`skills[]`), and adopted on its own with `sleep adopt --skill NAME` (`--auto-adopt`: each
accepted one, after a shared adapter). The night's own skill and memory are not trained on
such a night: the skills stand in for them; a shared adapter is staged as its proposal.

With `skills_from` (`--skills-from REPO`) the user's own SKILL.md files in REPO start the skills
of their names too (an adopted skill of the same name wins); each staged proposal of one
records the file as read (`SkillRecord.source`) and adopting it writes it back there
(`adoption/write_back.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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
    adopt_skill,
    adopted_skills,
    router_tasks,
    write_skill_proposal,
)
from selftaught.sleep.adoption.write_back import source_of, written_by
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.kinds import ItemValues, KindSkill, NightKinds, kind_records
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.skill_parts import (
    KindLearned,
    KindsNight,
    KindUnit,
    kind_units,
    learn_kind,
    serving_targets,
    shared_adapter,
    staged_text,
)
from selftaught.sleep.night.weight_night import WeightChoice, discard_adapters, stage_adapter
from selftaught.sleep.paths import SKILLS_DIR, Unit
from selftaught.sleep.records import (
    LateDuplicate,
    PairedRecord,
    ProposalRecord,
    SkillRecord,
    SkillSetRecord,
    ValPairRecord,
)
from selftaught.sleep.result import NightDraft
from selftaught.stops import UNLIMITED, Deadline


def _pair(before: Any, after: Any) -> ValPairRecord | None:
    if before is None or after is None:
        return None
    return ValPairRecord(before=float(before.hard), after=float(after.hard), n=int(after.n))


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
) -> SkillRecord:
    cluster = outcome.cluster
    whole = outcome.whole_val
    return SkillRecord(
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
        source=source_of(file) if file is not None else None,
        dir=f"{SKILLS_DIR}/{cluster.card.name}",
    )


def learn_skills(
    night: NightDraft,
    task: Any,
    config: Any,
    models: Any,
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
    console: Console,
    home: Path,
    kinds: NightKinds,
    splits: Mapping[str, list[MinedTask]],
    deadline: Deadline = UNLIMITED,
) -> None:
    """Train and gate one skill per kind, then each kind's memory and adapter
    (`skill_parts.py`), stage the accepted ones; the night's `skills`, `kinds`, `skill_set`,
    status and reason say what was staged (`config`: the `NightConfig`)."""
    project = night.project
    run = KindsNight(config, models, night_dir, evidence, ledger, console)
    _set_judge(task, run)
    notes: list[str] = []
    start, files = _starting_skills(project, home, config.skills_from, notes)
    clusters = kind_clusters(kinds, task, start, config.max_skills)
    served = serving_targets(project, home, [c.name for c in clusters], models.target, notes)
    night.note(*notes)
    try:
        result = _train_set(task, run, start, clusters, served, kinds)
    except FatalBackendError as err:
        night.usage = ledger.to_dict()
        night.status, night.reason = "backend_failed", f"training the skills: {err}"
        return
    units = kind_units(project, home, result.outcomes, splits, task, served, models.target)
    learned, shared = _beyond_text(night, units, result, task, run, deadline)
    inputs = {ex.id: ex.prompt_text() for ex in task.examples("train")}
    by_name = {u.name: u for u in units}
    trained = [o for o in result.outcomes if _listed(o)]
    entries = [
        _staged(
            night_dir,
            project,
            o,
            inputs,
            home,
            files.get(o.name),
            by_name.get(o.name),
            learned.get(o.name),
            models.target_spec,
        )  # fmt: skip
        for o in trained
    ]
    shared_staged = _stage_shared(night, shared, night_dir, home, models.target_spec)
    staged = [e.name for e in entries if e.status == "staged"]
    night.skills = tuple(entries)
    night.skill_set = SkillSetRecord(
        clusters=len(clusters),
        staged=len(staged),
        unrouted_train=len(result.unrouted_train),
        unrouted_val=len(result.unrouted_val),
    )
    before, after = _val_by_item(result)
    after = _with_weights(after, [*(d.choice for d in learned.values()), shared])
    night.kinds = kind_records(kinds, before, after, _kind_skills(result, entries))
    night.usage = ledger.to_dict()
    shared_why = night.reason if shared_staged else None
    night.status, night.reason = _skills_outcome(project, entries, staged, config.skill_min_tasks,
                                                 shared_why)  # fmt: skip


def _set_judge(task: Any, run: KindsNight) -> None:
    """Tasks without a reference are judged by the night's judge (charged to its ledger)."""
    if run.models.judge is not None:
        from selftaught.tasks.scorers import LlmJudge

        judge = EvidenceModel(run.models.judge, run.evidence, "judge")
        task.judge = LlmJudge(TrackedModel(judge, run.ledger, "judge"))


def _train_set(
    task: Any,
    run: KindsNight,
    start: list[SkillFile],
    clusters: list[TaskCluster],
    served: Mapping[str, Any],
    kinds: NightKinds,
) -> SkillSetResult:
    """The skills' text, each kind's trained and measured on the model serving it; the whole
    val routed by tonight's kinds, as the proxy will route once they are saved."""

    config = run.config

    def tracked(model: Any) -> TrackedModel:
        return TrackedModel(EvidenceModel(model, run.evidence, "target"), run.ledger, "target")

    analyst = EvidenceModel(run.models.optimizer, run.evidence, "optimizer")
    return train_skill_set(
        task,
        tracked(run.models.target),
        TrackedModel(analyst, run.ledger, "optimizer"),
        output_dir=run.night_dir / "skillset",
        config=config.training,
        set_config=SkillSetConfig(min_tasks=config.skill_min_tasks, max_skills=config.max_skills),
        start=start,
        clusters=clusters,
        progress=config.progress,
        console=run.console,
        targets={name: tracked(model) for name, model in served.items()},
        kinds=kinds.index(),
    )


def _beyond_text(
    night: NightDraft,
    units: list[KindUnit],
    result: SkillSetResult,
    task: Any,
    run: KindsNight,
    deadline: Deadline,
) -> tuple[dict[str, KindLearned], WeightChoice | None]:
    """Each trained kind's memory and own adapter, then the shared adapter (`skill_parts`);
    past the night's --max-minutes the kinds left keep their text as the skill set left it."""
    config = run.config
    trained = {o.name for o in result.outcomes if o.trained}
    if config.weights != "off" and night.training is not None:
        night.training = dataclasses.replace(night.training, weights=config.weights)
    learned: dict[str, KindLearned] = {}
    for unit in units:
        if unit.name not in trained:
            continue
        if deadline.passed():
            night.note(f"skill {unit.name}: memory and weights not trained: --max-minutes")
            continue
        done = learn_kind(unit, run)
        night.note(*done.notes)
        night.drop_duplicates(*done.dropped)
        learned[unit.name] = done
    if config.weights == "off" or config.skill_adapters != "shared":
        return learned, None
    if deadline.passed():
        night.note("the shared adapter was not trained: the night's --max-minutes had passed")
        return learned, None
    dropped: list[LateDuplicate] = []
    choice, notes = shared_adapter(units, learned, task, run, dropped)
    night.note(*notes)
    night.drop_duplicates(*dropped)
    return learned, choice


def _staged(
    night_dir: Path,
    project: str,
    outcome: SkillOutcome,
    inputs: dict[str, str],
    home: Path,
    file: StartingDocument | None,
    unit: KindUnit | None,
    learned: KindLearned | None,
    base_spec: str,
) -> SkillRecord:
    """A trained kind's entry, its proposal (skill, memory) and adapter staged when the
    gates accepted something for it; a losing adapter is deleted."""
    entry = _entry(project, outcome, inputs, home, file)
    if unit is not None and learned is not None:
        entry = _with_learned(entry, outcome, unit, learned)
    choice = learned.choice if learned is not None else None
    here = night_dir / SKILLS_DIR / entry.name
    if entry.status != "staged":
        if choice is not None:
            discard_adapters(here)
        return entry
    skill, memory = (outcome.trained_body, None)
    if unit is not None and learned is not None:
        skill, memory = staged_text(unit, learned)
    write_skill_proposal(night_dir, project, entry, skill, home, file, memory)
    if choice is not None and choice.adapter is not None:
        return dataclasses.replace(entry, adapter=stage_adapter(choice, here, base_spec))
    if choice is not None:
        discard_adapters(here)
    return entry


def _with_learned(
    entry: SkillRecord, outcome: SkillOutcome, unit: KindUnit, learned: KindLearned
) -> SkillRecord:
    """The entry once the kind's memory and weight gates spoke: staged when its text (skill
    or memory) or its adapter won, its own val that gate's."""
    memory_changed = learned.memory_changed(unit.adopted)
    choice = learned.choice
    if choice is None:
        said = "; its memory passed its gate on its own val" if memory_changed else ""
        status = "staged" if outcome.accepted or memory_changed else "rejected"
        return dataclasses.replace(entry, status=status, reason=entry.reason + said,
                                   memory_changed=memory_changed)  # fmt: skip
    before, after = choice.candidates["current"].score, choice.candidates[choice.winner].score
    own = ValPairRecord(before=before.hard, after=after.hard, n=after.n)
    return dataclasses.replace(
        entry,
        status="rejected" if choice.winner == "current" else "staged",
        reason=f"{entry.reason}; weights: {choice.why}",
        own_val=own,
        memory_changed=memory_changed and choice.with_text,
        candidate=choice.winner,
        weights=choice.record(),
    )


def _stage_shared(
    night: NightDraft, choice: WeightChoice | None, night_dir: Path, home: Path, base_spec: str
) -> bool:
    """The shared adapter, when its gate chose it, staged as the project's own proposal (its
    skill and memory as adopted); the night's `weights` say why either way."""
    if choice is None:
        return False
    night.weights = choice.record()
    if choice.winner == "current":
        discard_adapters(night_dir)
        night.note(f"shared adapter not staged: {choice.why}")
        return False
    adopted = staging.read_adopted_files(night.project, home)
    staging.write_proposal(night_dir, adopted, adopted.skill, adopted.memory)
    night.proposal = ProposalRecord(
        val_before=choice.candidates["current"],
        val_after=choice.candidates[choice.winner],
        paired=PairedRecord.of(choice.paired()),
        candidate=choice.winner,
        adapter=stage_adapter(choice, night_dir, base_spec),
    )
    night.reason = f"a shared adapter was staged for the project ({choice.why})"
    return True


def _with_weights(
    after: ItemValues | None, choices: Sequence[WeightChoice | None]
) -> ItemValues | None:
    """Each val task's hard score after the night where a weight gate measured what it chose
    (a kind's own gate, the shared one), else the skill set's."""
    out = dict(after or {})
    for choice in choices:
        if choice is None or choice.winner == "current":
            continue
        for item, value in choice.scores.get(choice.winner, {}).items():
            out[item] = None if value is None else float(value[0])
    return out or None


def _listed(outcome: SkillOutcome) -> bool:
    """Whether report.json `skills[]` lists the outcome: a skill trained tonight, or an
    existing one that was not (why); a held skill and a kind too small for one are in
    `kinds[]` only."""
    cluster = outcome.cluster
    return outcome.trained or (cluster.start is not None and cluster.hold is None)


def _kind_skills(result: SkillSetResult, entries: Sequence[SkillRecord]) -> dict[str, KindSkill]:
    """What became of each kind's skill tonight (report.json `kinds[].skill_status`): its
    entry's status once its memory and weight gates spoke, else the skill set's."""
    listed = {e.name: e for e in entries}
    out = {}
    for o in result.outcomes:
        if o.name in listed:
            status, reason = listed[o.name].status, listed[o.name].reason
        elif o.accepted:
            status, reason = "staged", o.reason
        elif o.trained:
            status, reason = "rejected", o.reason
        else:
            status = "kept" if o.cluster.start is not None else "none"
            reason = o.reason
        out[o.name] = KindSkill(o.name if status != "none" else None, status, reason)
    return out


def _val_by_item(result: SkillSetResult) -> tuple[ItemValues | None, ItemValues | None]:
    """Each val task's hard score served the starting skills and the accepted ones."""

    def hard(items: dict[str, list[float] | None]) -> ItemValues | None:
        return {i: None if v is None else float(v[0]) for i, v in items.items()} or None

    return hard(result.base_items), hard(result.shipped_items)


def _skills_outcome(
    project: str,
    entries: list[SkillRecord],
    staged: list[str],
    min_tasks: int,
    shared: str | None = None,
) -> tuple[str, str]:
    """The night's status and reason: which skills it staged (and the shared adapter, `shared`
    its reason), or why none."""
    if staged:
        also = f"; {shared}: `selftaught sleep adopt --project {project}`" if shared else ""
        return (
            "staged",
            f"{len(staged)} of {len(entries)} skills staged ({', '.join(staged)}): "
            f"`selftaught sleep adopt --skill NAME --project {project}` adopts each{also}",
        )
    if shared:
        return "staged", f"{shared}: `selftaught sleep adopt --project {project}` adopts it"
    why = "; ".join(f"{e.name}: {e.reason}" for e in entries) or (
        f"no kind with traffic tonight has {min_tasks} train tasks"
    )
    return "no_proposal", f"no skill was staged ({why})"


def auto_adopt_skills(
    project: str, night_dir: Path, home: Path, console: Console
) -> list[tuple[str, int]]:
    """Adopt the shared adapter the night staged for the project, if any, then each skill it
    staged (`--auto-adopt`); the night is `adopted` once none waits. Returns (skill, version)
    of each skill adopted."""
    done = []
    if staging.read_night(night_dir).proposal is not None:  # the shared adapter
        try:
            adoption = staging.adopt(project, night_dir.name, home=home)
            console.print(f"{project}: adopted the shared adapter as version {adoption.version}")
        except staging.StagingError as err:
            console.print(f"[bold yellow]warning:[/] {project}: adapter not adopted: {err}")
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
        staging.write_night(dataclasses.replace(night, status="adopted"))
    return done
