"""A project's many skills: each one staged, adopted, rolled back and on probation on its own.

A night with `NightConfig.many_skills` trains one skill per cluster of tasks (`night/skills.py`)
and stages each accepted one beside the night's report:

    nights/<night>/skills/<name>/proposal/   skill.md (the body), SKILL.md (name and
                                             description in its front matter, for agents),
                                             memory.md, and their diffs against the skill's
                                             adopted ones
    nights/<night>/skills/<name>/adapter/    its adapter, when its weight gate chose one
    report.json  skills[]                    one `SkillRecord` per trained skill (staged or
                                             rejected, and why; its own and the whole val)

`sleep adopt --skill NAME` makes the newest staged proposal of that skill its next version, in
its own adoption unit (`paths.Unit`), a folder with the project folder's layout and guarantees:

    <home>/projects/<project>/skills/<name>/
      adopted/        skill.md, memory.md, version: what the proxy injects when a request
                      routes to the skill
      versions/<N>/   skill.md, memory.md, meta.json (night, its card: name, description and
                      the train tasks the router reads, val, the version it replaced), and
                      adapter/ when N serves a LoRA adapter: the proxy answers the requests
                      routed to the skill with it (`adoption/serving.py`)
      backups/, events.jsonl

The same functions of `staging.py` write it (a temp folder renamed into place, `version`
last, `recover_adopted` completing a killed adopt), so adopting or rolling back one skill
never touches another's files or version. With a Postgres log a skill's versions, pointer and
events are rows keyed `<project>/skills/<name>` in the versions store (`Unit.key`).
"""

from __future__ import annotations

import contextlib
import difflib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from selftaught.runs import atomic_write_text
from selftaught.skill.routing import KindIndex, Route, SkillCard, SkillRouter
from selftaught.skill.skill_md import render_skill_md
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.inject import RoutedSkill, check_no_markers, request_text
from selftaught.sleep.adoption.placement import StartingDocument
from selftaught.sleep.adoption.staging import Adoption, LiveFiles, StagingError
from selftaught.sleep.adoption.write_back import (
    WRITTEN_BACK,
    file_text,
    rollback_unit,
    undo,
    write_back,
)
from selftaught.sleep.kinds_file import kind_index
from selftaught.sleep.paths import (
    ADAPTER_DIR,
    SKILLS_DIR,
    Unit,
    local_skill_names,
    read_adopted,
    shared_url,
    valid_skill_names,
)
from selftaught.sleep.records import SkillRecord, given
from selftaught.sleep.result import NightResult

ROUTER_TASKS = 40  # train task inputs a skill's card keeps for the router (the first ones)
TASK_CHARS = 2000  # of each
SKILL_STATUSES = ("staged", "rejected", "adopted")


def router_tasks(texts: list[str]) -> tuple[str, ...]:
    """What a card keeps of its train tasks' inputs: the first ROUTER_TASKS, each cut."""
    return tuple(t[:TASK_CHARS] for t in texts[:ROUTER_TASKS] if t.strip())


# ---- staging ----------------------------------------------------------------------------------


def skill_proposal_dir(night_dir: Path, name: str) -> Path:
    return night_dir / SKILLS_DIR / name / "proposal"


def skill_adapter_dir(night_dir: Path, name: str) -> Path:
    """Where a night stages a skill's adapter (peft's layout), beside its proposal."""
    return night_dir / SKILLS_DIR / name / ADAPTER_DIR


def write_skill_proposal(
    night_dir: Path,
    project: str,
    skill: SkillRecord,
    body: str,
    home: Path,
    source: StartingDocument | None = None,
    memory: str | None = None,
) -> None:
    """proposal/skill.md, SKILL.md, memory.md (`memory`, else the skill's adopted memory) and
    their diffs of one staged skill (text holding a block marker is refused, as for the
    project's proposal); for a skill that started from a user's file (`source`), file.diff:
    that file as read against the file adopting it writes."""
    check_no_markers(body, f"the proposed skill {skill.name!r}")
    folder = skill_proposal_dir(night_dir, skill.name)
    adopted = staging.read_adopted_files(Unit(project, skill.name), home)
    memory = adopted.memory if memory is None else memory
    check_no_markers(memory, f"the proposed memory of skill {skill.name!r}")
    atomic_write_text(folder / "skill.md", body)
    card = SkillCard(skill.name, skill.description, skill.tasks)
    atomic_write_text(folder / "SKILL.md", render_skill_md(card, body))
    atomic_write_text(folder / "skill.diff", staging.unified_diff(adopted.skill, body, "skill.md"))
    atomic_write_text(folder / "memory.md", memory)
    diff = staging.unified_diff(adopted.memory, memory, "memory.md")
    atomic_write_text(folder / "memory.diff", diff)
    if source is not None:
        atomic_write_text(folder / "file.diff", file_diff(source, file_text(source, body)))


def file_diff(source: StartingDocument, new: str) -> str:
    """The user's file as the night read it against what adopting writes into it."""
    where = str(source.path)
    return "".join(
        difflib.unified_diff(source.text.splitlines(keepends=True), new.splitlines(keepends=True),
                             fromfile=f"{where} (as read)", tofile=f"{where} (adopted)")
    )  # fmt: skip


def staged_skills(night: NightResult) -> tuple[SkillRecord, ...]:
    """The skills a night trained (report.json `skills[]`), each with a status adopting
    knows."""
    for skill in night.skills:
        if skill.status not in SKILL_STATUSES:
            raise StagingError(f"a staged skill's status is one of {SKILL_STATUSES}")
    return night.skills


def _adopted(record: SkillRecord, version: int) -> SkillRecord:
    """A staged skill's entry once adopted as `version` (keys it lacked added at its end)."""
    return record.but(status="adopted", adopted_version=version)


def _resolve(
    project: str, name: str, night_id: str | None, home: Path | None
) -> tuple[Path, NightResult, int]:
    """(night folder, the night, the index of the skill's entry): the named night, or the
    newest night that staged `name` and is not adopted yet."""
    if night_id is not None:
        night_dir = staging.resolve_night(project, night_id, home)
        found = staging.read_night(night_dir)
        for i, entry in enumerate(staged_skills(found)):
            if entry.name == name:
                return night_dir, found, i
        raise StagingError(f"night {night_dir.name} trained no skill {name!r}")
    for night_dir, staged in reversed(staging.list_nights(project, home)):
        for i, entry in enumerate(staged_skills(staged)):
            if entry.name == name and entry.status == "staged":
                return night_dir, staged, i
    raise StagingError(
        f"project {project!r} has no staged proposal of skill {name!r} waiting "
        "(`selftaught sleep status` lists the skills)"
    )


def adopt_skill(
    project: str,
    name: str,
    night_id: str | None = None,
    *,
    home: Path | None = None,
    force: bool = False,
) -> Adoption:
    """Make a night's proposal of skill `name` that skill's next version (its unit only)."""
    unit = Unit(project, name)
    # the project's lock first: the night's report.json is shared by its skills
    with staging.adopt_lock(project, home), staging.adopt_lock(unit, home):
        note = staging.recover_adopted(unit, home)
        night_dir, staged, index = _resolve(project, name, night_id, home)
        entry = staged_skills(staged)[index]
        if entry.status != "staged":
            raise StagingError(
                f"skill {name!r} of night {night_dir.name} has nothing to adopt ({entry.status}"
                + (f" as version {entry.adopted_version}" if entry.adopted_version else "")
                + f": {entry.reason})"
            )
        previous = staging.current_version(unit, home)
        if previous != entry.base_version and not force:
            raise StagingError(
                f"skill {name!r} changed since night {night_dir.name} ran (it was gated "
                f"against its version {entry.base_version}, version {previous} is adopted "
                "now); run another night, or pass --force to adopt it anyway"
            )
        proposal = skill_proposal_dir(night_dir, name)
        body = staging.read_text(proposal / "skill.md")
        memory = _proposed_memory(proposal)
        record = entry.adapter if given(entry.adapter) else None  # the adapter staged
        folder = skill_adapter_dir(night_dir, name) if record is not None else None
        adapter, adapter_meta = staging.proposed_adapter(unit, night_dir.name, folder,
                                                         record, previous, home)  # fmt: skip
        # a skill read from the user's file goes back into it first (WriteBackError: changed)
        written = write_back(entry.source, body, home) if given(entry.source) else None
        own, whole = (v if given(v) else None for v in (entry.own_val, entry.whole_val))
        meta = {
            "night": night_dir.name,
            "card": {"name": name, "description": entry.description, "tasks": list(entry.tasks)},
            "own_val": own.to_dict() if own else None,
            "whole_val": whole.to_dict() if whole else None,
            "val_before": whole and {"hard": whole.before},
            "val_after": whole and {"hard": whole.after},
            "adapter": adapter_meta,
            WRITTEN_BACK: written.to_dict() if written else None,
        }
        try:
            done = staging.install_version(unit, home, body, memory, meta, adapter, previous,
                                           LiveFiles([]))  # fmt: skip
        except BaseException:
            undo(written, home)
            raise
        done.written_back += [written] if written else []
        skills = list(staged.skills)
        skills[index] = _adopted(skills[index], done.version)
        staging.write_night(replace(staged, skills=tuple(skills)))
        done.note = note
        return done


def _proposed_memory(proposal: Path) -> str:
    """A staged skill's memory (a night from before skills had memories staged none: "")."""
    path = proposal / "memory.md"
    return staging.read_text(path) if path.is_file() else ""


def rollback_skill(
    project: str, name: str, version: int | None = None, *, home: Path | None = None
) -> Adoption:
    """Return skill `name` to an earlier version of its own (0: the skill is not served); a
    user's file the versions undone wrote gets its bytes back (`write_back.restore_written`;
    `Adoption.note` says what was left)."""
    return rollback_unit(Unit(project, name), version, home=home)


# ---- what a project has adopted ----------------------------------------------------------------


def skill_names(project: str, home: Path | None = None) -> list[str]:
    """Every skill of the project that has an adoption unit (adopted now or once)."""
    found = local_skill_names(project, home)
    if (db := staging.versions_store()) is not None:
        prefix = f"{project}/{SKILLS_DIR}/"
        found += [k[len(prefix) :] for k in db.projects() if k.startswith(prefix)]
    return valid_skill_names(project, found)


@dataclass(frozen=True)
class AdoptedSkill:
    """One skill as the proxy serves it: its card (for the router), body and version, its
    memory and adapter (None: the version serves none)."""

    card: SkillCard
    body: str
    version: int
    memory: str = ""
    adapter: Path | None = None

    @property
    def name(self) -> str:
        return self.card.name


@dataclass
class _Shelf:
    """The proxy's cache of a project's adopted skills: the names are listed per request (a
    directory listing), or with a Postgres log re-read every `LIST_S` seconds in a thread of
    its own (a request never waits on the database; an outage keeps the last list); each
    unit's adopted text is `read_adopted`'s own cache, a version's card is read once."""

    names: tuple[float, list[str]] | None = None
    cards: dict[tuple[str, int], SkillCard | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    refreshing: bool = False


LIST_S = 1.0


def _list_now(project: str, home: Path | None, shelf: _Shelf) -> list[str]:
    from selftaught.sleep.store import LogError

    try:
        names = skill_names(project, home)
    except LogError:  # the database is away: the last list stands, tried again in LIST_S
        with shelf.lock:
            names = shelf.names[1] if shelf.names else []
    with shelf.lock:
        shelf.names = (time.monotonic(), names)
        shelf.refreshing = False
    return names


def _names(project: str, home: Path | None, shelf: _Shelf) -> list[str]:
    if shared_url() is None:  # files: a listing per request, so an adopt applies at once
        return skill_names(project, home)
    with shelf.lock:
        listed = shelf.names
        due = listed is None or time.monotonic() - listed[0] > LIST_S
        background = due and listed is not None and shared_url() is not None
        if background and not shelf.refreshing:
            shelf.refreshing = True
            threading.Thread(target=_list_now, args=(project, home, shelf), daemon=True).start()
    if listed is not None and (background or not due):
        return listed[1]
    return _list_now(project, home, shelf)


_shelves: dict[tuple[str, Path | None, str | None], _Shelf] = {}


def _card(unit: Unit, version: int, home: Path | None, shelf: _Shelf) -> SkillCard | None:
    key = (str(unit.skill), version)
    with shelf.lock:
        if key in shelf.cards:
            return shelf.cards[key]
    card = None
    with contextlib.suppress(Exception):  # a version without a card is not routed to
        raw = staging.version_meta(unit, version, home).get("card") or {}
        card = SkillCard(str(unit.skill), str(raw["description"]), tuple(raw.get("tasks") or ()))
    with shelf.lock:
        shelf.cards[key] = card
    return card


def adopted_skills(project: str, home: Path | None = None) -> list[AdoptedSkill]:
    """The project's skills adopted now (version >= 1), cheap enough to call per request."""
    shelf = _shelves.setdefault((project, home, shared_url()), _Shelf())
    out = []
    for name in _names(project, home, shelf):
        unit = Unit(project, name)
        adopted = read_adopted(unit, home)
        version = adopted.number
        if version < 1 or not (adopted.skill.strip() or adopted.memory.strip() or adopted.adapter):
            continue  # nothing to serve (an adapter alone is served: a weights-only skill)
        card = _card(unit, version, home, shelf)
        if card is not None:
            out.append(AdoptedSkill(card, adopted.skill, version, adopted.memory, adopted.adapter))
    return out


_routers: dict[tuple[tuple[str, int], ...], SkillRouter] = {}
_routers_lock = threading.Lock()


def _router_for(skills: list[AdoptedSkill], kinds: KindIndex | None = None) -> SkillRouter:
    """The router over these skills and the project's kinds (`kinds_file.kind_index`), built
    once per set of skill versions and kinds (the same `kinds` object until kinds.json changes)."""
    key = tuple((s.name, s.version) for s in skills)
    with _routers_lock:
        found = _routers.get(key)
    if found is None or found.kinds is not kinds:
        found = SkillRouter([s.card for s in skills], kinds)
        with _routers_lock:
            if len(_routers) > 64:  # old sets of versions
                _routers.clear()
            _routers[key] = found
    return found


def project_router(project: str, home: Path | None, skills: list[AdoptedSkill]) -> SkillRouter:
    """How the proxy routes a request among the project's adopted `skills`: kinds first, by
    the kinds its nights found, then the cards of the skills that are no kind."""
    return _router_for(skills, kind_index(project, home))


@dataclass(frozen=True)
class SkillRoute:
    """A request's routing decision as its row logs it (`Interaction.meta["skill_route"]`):
    `Route.to_dict()` plus the version of the skill that served it (0: none)."""

    route: Route
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.route.to_dict(), "version": self.version}

    @classmethod
    def from_dict(cls, d: Any) -> SkillRoute | None:
        """The logged decision, or None when the row holds none (or not in this shape)."""
        if not isinstance(d, dict) or not (d.get("skill") is None or isinstance(d["skill"], str)):
            return None
        try:
            version = int(d.get("version") or 0)
            route = Route(d.get("skill"), float(d.get("score") or 0.0), d.get("runner_up"),
                          float(d.get("runner_up_score") or 0.0),
                          d["kind"] if isinstance(d.get("kind"), str) else None)  # fmt: skip
        except (TypeError, ValueError):
            return None
        return cls(route, version)


def route_request(
    project: str, home: Path | None, messages: list[Any]
) -> tuple[RoutedSkill | None, SkillRoute | None]:
    """The skill (if any) a request's user text routes to among the project's adopted skills,
    and the decision to log; (None, None) when the project has none adopted."""
    skills = adopted_skills(project, home)
    if not skills:
        return None, None
    route = project_router(project, home, skills).route(request_text(messages))
    chosen = next((s for s in skills if s.name == route.skill), None)
    if chosen is None:
        return None, SkillRoute(route, 0)
    routed = RoutedSkill(chosen.name, chosen.body, chosen.version, chosen.memory, chosen.adapter)
    return routed, SkillRoute(route, chosen.version)


def skill_status_lines(
    project: str, home: Path | None = None, probation: Sequence[str] = ()
) -> list[str]:
    """`sleep status`: each skill's adopted version, `probation` (each skill's probation
    lines), and the skills staged and waiting."""
    lines = []
    for name in skill_names(project, home):
        unit = Unit(project, name)
        version = staging.current_version(unit, home)
        known = staging.version_numbers(unit, home)
        serves = ", serving its adapter" if read_adopted(unit, home).adapter else ""
        lines.append(
            f"  skill {name}: version {version} adopted"
            + (f" (versions: {', '.join(map(str, known))})" if known else "")
            + serves
        )
    lines += list(probation)
    waiting = []
    for night_dir, night in staging.list_nights(project, home):
        for entry in staged_skills(night):
            if entry.status == "staged":
                waiting.append(f"{entry.name} (night {night_dir.name})")
    if waiting:
        lines.append(
            f"  skills staged: {', '.join(waiting)}: `selftaught sleep adopt --skill NAME "
            f"--project {project}`"
        )
    return lines
