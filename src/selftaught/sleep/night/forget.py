"""What the sleep home still holds of forgotten rows, and taking it out.

`TaskLog.forget` deletes rows from the log (securely, its WAL truncated). What was learned from
them lives on in the home; it is found by provenance, never by searching for the words (they
are gone from the log): every store names the rows (or the tasks, which name the rows) its
entries came from, and the log says which of those it forgot (`TaskLog.forgotten_among`).

Always, after every `sleep log forget` and before every night reads them (`drop_forgotten`; a
store written before this version is cleaned the same way):

    recall.jsonl        a recalled task that came from a forgotten row (`MinedTask.sources`)
    kinds.json          every kind's words, rebuilt from the recalled tasks left when a recalled
                        task went; a kind whose last one went is deleted (`kinds.forget_words`)
    weak_labels.jsonl   a waiting weak label from one; a label that names no rows (written
                        before labels did) cannot say whose it is, and goes too
    edit_ledger.jsonl   an event of an edit proposed on a task of a forgotten row (a later
                        night's analyst is shown the ledger's failed edits)
    workspaces/<key>/   the repository files a recalled workspace task of a forgotten row runs

With `--everywhere` (`rewrite_home`), in every project (and each of its named skills):

    nights/<night>/     a night that read a forgotten row (`rows_read.txt`, else its tasks'
                        and proposal lines' sources) loses its traffic files (evidence.jsonl,
                        diagnostics, the phase runs: what nothing reads after the night);
                        tasks.jsonl loses those tasks, report.json the text of every line
                        taken out, report.md is written again, its proposal loses the lines
    versions/, adopted/, backups/, <home>/placements/backups/, the Postgres versions, and the
                        live files an adopt writes: every line learned from forgotten rows
                        goes, i.e. a demonstration of a task of one (it quotes the request),
                        and a rule or memory line learned from them alone

What stays is said by the command (`Rewritten.lines`) and docs/sleep.md: a rule or memory line
also learned from rows that remain; a line whose night folder was removed (its provenance went
with it); what a LoRA adapter learned (weights cannot be edited: roll back); a night folder
from before `rows_read.txt`, checked by its tasks and lines only; a skill placed in a
repository (`placements/placed.json`); on Postgres the server's dead tuples, WAL and backups.
The caller holds the night lock (`forget_in_home` takes it), so no night writes meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selftaught.errors import Busy, InputError
from selftaught.runs import atomic_write_json, atomic_write_text, write_jsonl
from selftaught.sleep.paths import (
    ADAPTER_DIR,
    SKILLS_DIR,
    Unit,
    adopted_dir,
    edit_ledger_path,
    local_skill_names,
    project_dir,
    valid_skill_names,
)

if TYPE_CHECKING:
    from selftaught.sleep.intake.log import TaskLog

FORGOTTEN = "[forgotten]"  # what report.json says in place of a line taken out
# what a night folder keeps once it read a forgotten row: what adopt, probation, history and
# a forget read after the night (the rest is the night's traffic: evidence, diagnostics, runs)
_KEPT = frozenset({"report.json", "report.md", "README.txt", "tasks.jsonl", "rows_read.txt",
                   "proposal", ADAPTER_DIR})  # fmt: skip
_EMPTY_DEMOS = re.compile(r"\n*<!-- selftaught:demos[^\n]*-->\n<!-- /selftaught:demos -->\n?")


# ---- where things came from -------------------------------------------------------------------


@dataclass(frozen=True)
class Provenance:
    """What a project's home says of where its things came from: each task's rows (recall,
    every night's tasks.jsonl), each learned rule or memory line's rows (every night's
    report.json, all records of one text together), each night's rows read."""

    tasks: dict[str, frozenset[str]] = field(default_factory=dict)
    lines: dict[str, frozenset[str]] = field(default_factory=dict)
    read: dict[str, frozenset[str]] = field(default_factory=dict)  # night folder -> rows

    def ids(self) -> set[str]:
        found: set[str] = set()
        for rows in (*self.tasks.values(), *self.lines.values(), *self.read.values()):
            found |= rows
        return found

    def doomed(self, forgotten: Iterable[str]) -> Doomed:
        gone = frozenset(forgotten)
        hit = {text: rows for text, rows in self.lines.items() if rows & gone}
        return Doomed(
            gone,
            frozenset(t for t, rows in self.tasks.items() if rows & gone),
            frozenset(text for text, rows in hit.items() if rows <= gone),
            frozenset(text for text, rows in hit.items() if not rows <= gone),
        )


def provenance(project: str, home: Path, *, read_ids: bool = True) -> Provenance:
    """The project's provenance; `read_ids` False leaves out the rows each night read (what
    only the night folders' rewrite needs: a night's start reads no more than it must)."""
    tasks: dict[str, set[str]] = defaultdict(set)
    lines: dict[str, set[str]] = defaultdict(set)
    read: dict[str, frozenset[str]] = {}
    for row in _jsonl(project_dir(project, home) / "recall.jsonl"):
        task = row.get("task")
        if isinstance(task, dict):
            tasks[str(task.get("id"))] |= _strings(task.get("sources"))
    for night in _nights(project, home):
        for row in _jsonl(night / "tasks.jsonl"):
            tasks[str(row.get("id"))] |= _strings(row.get("sources"))
        for line in _sourced_lines(_report(night)):
            if line.get("kind") in ("rule", "memory"):
                lines[str(line["text"]).strip()] |= _strings(line["sources"])
        if read_ids and (night / "rows_read.txt").is_file():
            read[night.name] = _read_ids(night)
    return Provenance(
        {t: frozenset(r) for t, r in tasks.items()},
        {t: frozenset(r) for t, r in lines.items()},
        read,
    )


@dataclass(frozen=True)
class Doomed:
    """What goes, given the forgotten rows: the tasks of one, the rule and memory lines
    learned from them alone (`shared`: learned from rows that remain too, kept)."""

    forgotten: frozenset[str] = frozenset()
    tasks: frozenset[str] = frozenset()
    lines: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()

    def hits(self, rows: Iterable[str]) -> bool:
        return not self.forgotten.isdisjoint(rows)

    def drops(self, line: str, diff: bool = False) -> bool:
        """Whether a document's line goes: a doomed rule or memory line, or a demonstration
        (a JSON line of the demos block) of a doomed task; in a diff, behind its +/-/space."""
        cores = [line.strip()]
        if diff and line[:1] in "+- " and not line.startswith(("+++", "---")):
            cores.append(line[1:].strip())
        return any(core in self.lines or _demo_id(core) in self.tasks for core in cores)

    def scrub(self, text: str, diff: bool = False) -> tuple[str, int]:
        """`text` without the lines that go (a demos block left empty goes too); how many."""
        lines = text.splitlines(keepends=True)
        kept = [x for x in lines if not self.drops(x, diff)]
        if len(kept) == len(lines):
            return text, 0
        out = "".join(kept)
        if not diff:
            out = _EMPTY_DEMOS.sub("\n", out)
            out = out.rstrip("\n") + "\n" if out.strip() else ""
        return out, len(lines) - len(kept)


def _demo_id(line: str) -> str | None:
    if not line.startswith("{"):
        return None
    try:
        demo = json.loads(line)
    except ValueError:
        return None
    is_demo = isinstance(demo, dict) and "input" in demo and isinstance(demo.get("id"), str)
    return demo["id"] if is_demo else None


# ---- the stores a night reads: always ---------------------------------------------------------


@dataclass(frozen=True)
class Dropped:
    """What `drop_forgotten` took out of one project's stores."""

    recall: int = 0
    weak: int = 0
    ledger: int = 0
    workspaces: int = 0
    kinds: int = 0  # kinds whose words were rebuilt without the recalled tasks that went

    def total(self) -> int:
        return self.recall + self.weak + self.ledger + self.workspaces


def drop_forgotten(project: str, home: Path, log: TaskLog) -> Dropped:
    """Take what came from the log's forgotten rows out of the project's stores that a later
    night reads (module doc); what was taken out."""
    prov = provenance(project, home, read_ids=False)
    doomed = _doomed(prov, project, home, log)
    return _drop_stores(project, home, doomed)


def _doomed(prov: Provenance, project: str, home: Path, log: TaskLog) -> Doomed:
    weak = _jsonl(project_dir(project, home) / "weak_labels.jsonl")
    candidates = prov.ids() | {s for r in weak for s in _strings(r.get("sources"))}
    return prov.doomed(log.forgotten_among(candidates))


def _drop_stores(project: str, home: Path, doomed: Doomed) -> Dropped:
    folder = project_dir(project, home)
    recall = _jsonl(folder / "recall.jsonl")
    kept_tasks: list[dict[str, Any]] = []
    gone: list[dict[str, Any]] = []
    for row in recall:
        (gone if _recalled_doomed(row, doomed) else kept_tasks).append(row)
    workspaces = sum(_remove_workspace(r, folder) for r in gone)
    kinds = 0
    if gone:
        write_jsonl(folder / "recall.jsonl", kept_tasks)
        kinds = _forget_kind_words(project, home, kept_tasks, gone)
    weak = _jsonl(folder / "weak_labels.jsonl")
    kept = [r for r in weak if isinstance(r.get("sources"), list) and not doomed.hits(r["sources"])]
    if len(kept) < len(weak):
        write_jsonl(folder / "weak_labels.jsonl", kept)
    return Dropped(len(gone), len(weak) - len(kept), _drop_ledger(project, home, doomed),
                   workspaces, kinds)  # fmt: skip


def _forget_kind_words(
    project: str, home: Path, kept: list[dict[str, Any]], gone: list[dict[str, Any]]
) -> int:
    from selftaught.sleep.night.kinds import forget_words
    from selftaught.sleep.night.recall import Recalled

    kinds = {str(r["task"].get("kind")) for r in gone if r["task"].get("kind")}
    return forget_words(project, home, [Recalled.from_dict(r).task for r in kept], kinds)


def _recalled_doomed(row: dict[str, Any], doomed: Doomed) -> bool:
    task = row.get("task")
    return isinstance(task, dict) and doomed.hits(_strings(task.get("sources")))


def _remove_workspace(row: dict[str, Any], folder: Path) -> bool:
    """Remove the workspace (repository files) of a recalled task, when it is the project's."""
    state = row["task"].get("state")
    ws = state.get("workspace") if isinstance(state, dict) else None
    path = Path(str(ws.get("path"))) if isinstance(ws, dict) else None
    root = (folder / "workspaces").resolve()
    if path is None or root not in path.resolve().parents:
        return False
    home = path.resolve().parent  # <key>/files: the key's folder holds its proof too
    shutil.rmtree(home if home.parent == root else path, ignore_errors=True)
    return True


def _drop_ledger(project: str, home: Path, doomed: Doomed) -> int:
    """Ledger events of an edit proposed on a doomed task, or holding a doomed line."""
    path = edit_ledger_path(project, home)
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = [x for x in lines if not _ledger_doomed(x, doomed)]
    if len(kept) < len(lines):
        atomic_write_text(path, "".join(kept))
    return len(lines) - len(kept)


def _ledger_doomed(line: str, doomed: Doomed) -> bool:
    try:
        event = json.loads(line)
    except ValueError:
        return False  # a torn last line: the ledger skips it
    if not isinstance(event, dict):
        return False
    content = str(event.get("content") or "").strip()
    return bool(_strings(event.get("tasks")) & doomed.tasks) or content in doomed.lines


# ---- night folders and learned documents: --everywhere ----------------------------------------


@dataclass(frozen=True)
class Rewritten:
    """What `rewrite_home` changed in the home, and what it left (and why)."""

    nights: tuple[str, ...] = ()  # night folders that read a forgotten row: pruned
    old_nights: int = 0  # night folders without rows_read.txt: checked by tasks and lines only
    documents: int = 0  # files and stored versions rewritten
    lines: int = 0  # lines taken out of them
    shared: tuple[str, ...] = ()  # lines kept: learned from rows that remain too
    adapters: tuple[str, ...] = ()  # LoRA adapters a night that read a forgotten row trained
    live: tuple[str, ...] = ()  # live files rewritten with the adopted skill
    left: tuple[str, ...] = ()  # files outside the home still holding adopted text, and why

    def __add__(self, other: Rewritten) -> Rewritten:
        return Rewritten(
            self.nights + other.nights,
            self.old_nights + other.old_nights,
            self.documents + other.documents,
            self.lines + other.lines,
            self.shared + other.shared,
            self.adapters + other.adapters,
            self.live + other.live,
            self.left + other.left,
        )


def rewrite_home(project: str, home: Path, log: TaskLog) -> tuple[Dropped, Rewritten]:
    """The stores (`drop_forgotten`), then the night folders and learned documents of the
    project, for every row the log forgot (module doc). Provenance is read once, first: the
    rewrite takes out of the nights' files what it is read from."""
    prov = provenance(project, home)
    doomed = _doomed(prov, project, home, log)
    if not doomed.forgotten:
        return Dropped(), _old_nights(project, home, prov)
    dropped = _drop_stores(project, home, doomed)
    done = Rewritten(shared=tuple(sorted(doomed.shared)))
    for unit in _units(project, home):
        done += _rewrite_unit(unit, home, doomed)
    for night in _nights(project, home):
        done += _rewrite_night(night, home, doomed, prov)
    documents, lines = _rewrite_placement_backups(home, doomed)
    done += Rewritten(documents=documents, lines=lines)
    return dropped, done + _old_nights(project, home, prov)


def _old_nights(project: str, home: Path, prov: Provenance) -> Rewritten:
    return Rewritten(old_nights=sum(n.name not in prov.read for n in _nights(project, home)))


def _units(project: str, home: Path) -> list[Unit]:
    from selftaught.sleep.adoption import staging

    names = set(local_skill_names(project, home))
    if (db := staging.versions_store()) is not None:
        prefix = f"{project}/{SKILLS_DIR}/"
        names |= {k[len(prefix) :] for k in db.projects() if k.startswith(prefix)}
    return [Unit(project), *(Unit(project, n) for n in valid_skill_names(project, names))]


def _rewrite_unit(unit: Unit, home: Path, doomed: Doomed) -> Rewritten:
    """Every version of the unit, its adopted files and backups; then its live files, when
    what is adopted changed."""
    from selftaught.sleep.adoption import staging

    before = staging.read_adopted_files(unit, home)
    versions, lines = _rewrite_versions(unit, home, doomed)
    documents = len(versions)
    if versions:  # what a version holds changed: its history says so
        staging.record_event(unit, {"event": "forget", "versions": versions, "lines": lines},
                             home)  # fmt: skip
    folder = unit.folder(home)
    for path in [*_files(adopted_dir(unit, home)), *_files(folder / "backups")]:
        removed = _scrub_file(path, doomed)
        documents, lines = documents + bool(removed), lines + removed
    after = staging.read_adopted_files(unit, home)
    live, left = [], []
    if (after.skill, after.memory) != (before.skill, before.memory):
        for path in staging.live_targets(unit, home):
            try:
                staging.write_live_file(path, after)
                live.append(str(path))
            except (OSError, InputError) as err:  # not well formed, a symlink, not UTF-8
                left.append(f"{path} (not rewritten: {err})")
    return Rewritten(documents=documents, lines=lines, adapters=_adapters(unit, home, doomed),
                     live=tuple(live), left=tuple(left))  # fmt: skip


def _adapters(unit: Unit, home: Path, doomed: Doomed) -> tuple[str, ...]:
    """The unit's versions serving an adapter trained by a night that read a forgotten row."""
    from selftaught.sleep.adoption import staging

    found = []
    for version in staging.version_numbers(unit, home):
        meta = staging.version_meta(unit, version, home)
        night = project_dir(unit.project, home) / "nights" / str(meta.get("night"))
        tasks = _jsonl(night / "tasks.jsonl")
        read = _read_ids(night) | {s for r in tasks for s in _strings(r.get("sources"))}
        if meta.get("adapter") and doomed.hits(read):
            found.append(f"{unit.label} version {version}")
    return tuple(found)


def _rewrite_versions(unit: Unit, home: Path, doomed: Doomed) -> tuple[list[int], int]:
    """(the versions rewritten, lines taken out): files under versions/, or Postgres rows."""
    from selftaught.sleep.adoption import staging

    versions: list[int] = []
    lines = 0
    if (db := staging.versions_store()) is not None:
        for version, skill, memory in db.documents(unit.key):
            new_skill, n1 = doomed.scrub(skill)
            new_memory, n2 = doomed.scrub(memory)
            if n1 + n2:
                db.rewrite(unit.key, version, new_skill, new_memory)
                versions, lines = [*versions, version], lines + n1 + n2
        return versions, lines
    for version in staging.version_numbers(unit, home):
        folder = staging.versions_dir(unit, home) / str(version)
        removed = sum(_scrub_file(folder / name, doomed) for name in ("skill.md", "memory.md"))
        if removed:
            versions, lines = [*versions, version], lines + removed
    return versions, lines


def _rewrite_night(night_dir: Path, home: Path, doomed: Doomed, prov: Provenance) -> Rewritten:
    """A night that read a forgotten row: its proposal's documents, report.json and
    report.md without the lines taken out, tasks.jsonl without those tasks, no traffic."""
    tasks = _jsonl(night_dir / "tasks.jsonl")
    report = _report(night_dir)
    read = prov.read.get(night_dir.name, frozenset())
    hit = doomed.hits(read) or any(doomed.hits(_strings(r.get("sources"))) for r in tasks)
    if not (hit or any(doomed.hits(x["sources"]) for x in _sourced_lines(report))):
        return Rewritten()
    documents = lines = 0
    for path in _proposal_files(night_dir):
        diff = path.suffix == ".diff"  # rewritten too, not counted: it shows the same lines
        removed = _scrub_file(path, doomed, diff)
        documents, lines = documents + bool(removed and not diff), lines + removed * (not diff)
    if documents and report is not None:
        _rediff(night_dir, home, str(report.get("project")), report.get("base_version"))
    _prune(night_dir)
    kept = [r for r in tasks if not doomed.hits(_strings(r.get("sources")))]
    if len(kept) < len(tasks):
        write_jsonl(night_dir / "tasks.jsonl", kept)
    if report is not None:
        for line in _sourced_lines(report):
            if _line_doomed(line, doomed):
                line["text"] = FORGOTTEN
        notes = report.get("notes")
        note = _NOTE.format(n=lines, when=time.strftime("%Y-%m-%d %H:%M"))
        report["notes"] = [*(notes if isinstance(notes, list) else []), note]
        atomic_write_json(night_dir / "report.json", report)
        _write_markdown(night_dir)
    adapters = [f"night {night_dir.name}"] if (night_dir / ADAPTER_DIR).is_dir() else []
    adapters += [f"night {night_dir.name} skill {p.parent.name}"
                 for p in sorted((night_dir / SKILLS_DIR).glob(f"*/{ADAPTER_DIR}"))]  # fmt: skip
    name = f"{night_dir.parent.parent.name}/{night_dir.name}"
    return Rewritten(nights=(name,), documents=documents, lines=lines, adapters=tuple(adapters))


_NOTE = (
    "sleep log forget --everywhere ({when}): this night read a forgotten row; {n} proposal "
    "lines learned from forgotten rows were taken out, its tasks of them dropped, its "
    "evidence, diagnostics and phase runs removed"
)


def _rediff(night_dir: Path, home: Path, project: str, base: Any) -> None:
    """proposal/skill.diff and memory.diff again, against the version the night was gated
    against (`base`, rewritten first)."""
    from selftaught.sleep.adoption import staging

    try:
        gated = staging.read_version(project, int(base or 0), home)
    except (InputError, ValueError):  # a version gone: the diffs keep their lines filtered
        return
    folder = night_dir / "proposal"
    for name, old in (("skill", gated.skill), ("memory", gated.memory)):
        if (folder / f"{name}.md").is_file():
            new = (folder / f"{name}.md").read_text(encoding="utf-8")
            atomic_write_text(folder / f"{name}.diff", staging.unified_diff(old, new, f"{name}.md"))


def _line_doomed(line: dict[str, Any], doomed: Doomed) -> bool:
    if line.get("kind") == "demo":
        return bool(_strings(line.get("tasks")) & doomed.tasks)
    return str(line.get("text")).strip() in doomed.lines


def _write_markdown(night_dir: Path) -> None:
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.night.summary import render_markdown

    try:
        result = staging.read_night(night_dir)
    except staging.StagingError:  # a report this version cannot read: no words of it kept
        (night_dir / "report.md").unlink(missing_ok=True)
        return
    atomic_write_text(night_dir / "report.md", render_markdown(night_dir, result))


def _prune(night_dir: Path) -> None:
    """Remove what only the night itself used: everything but `_KEPT` and the named
    skills' proposals and staged adapters (`skills/<name>/proposal/`, `.../adapter/`, beside
    the phases' runs)."""
    for entry in night_dir.iterdir():
        if entry.name == SKILLS_DIR and entry.is_dir():
            for skill in entry.iterdir():
                if skill.is_dir() and (skill / "proposal").is_dir():
                    for part in skill.iterdir():
                        if part.name not in ("proposal", ADAPTER_DIR):
                            _remove(part)
                else:
                    _remove(skill)
            if not any(entry.iterdir()):
                entry.rmdir()
        elif entry.name not in _KEPT:
            _remove(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _proposal_files(night_dir: Path) -> list[Path]:
    folders = [night_dir / "proposal", *(night_dir / SKILLS_DIR).glob("*/proposal")]
    return [p for folder in folders for p in _files(folder)]


def _rewrite_placement_backups(home: Path, doomed: Doomed) -> tuple[int, int]:
    """The copies `sleep adopt --place` and a write-back keep of the user's files (they may
    hold an adopted skill): (files rewritten, lines taken out)."""
    documents = lines = 0
    for path in _files(home / "placements" / "backups"):
        removed = _scrub_file(path, doomed)
        documents, lines = documents + bool(removed), lines + removed
    return documents, lines


# ---- files ----------------------------------------------------------------------------------


def _scrub_file(path: Path, doomed: Doomed, diff: bool = False) -> int:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):  # an adapter's weights, a lock: no lines
        return 0
    new, removed = doomed.scrub(text, diff)
    if removed:
        atomic_write_text(path, new)
    return removed


def _files(root: Path) -> Iterator[Path]:
    if root.is_dir():
        yield from (p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


def _nights(project: str, home: Path) -> list[Path]:
    root = project_dir(project, home) / "nights"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _read_ids(night_dir: Path) -> frozenset[str]:
    try:
        return frozenset((night_dir / "rows_read.txt").read_text().split())
    except FileNotFoundError:
        return frozenset()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSONL file ([] when there is none); a line that is not one is kept
    out (a torn tail)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _report(night_dir: Path) -> dict[str, Any] | None:
    """report.json as raw JSON: the rewrite keeps every key, those this version does not know
    included (an older or newer night's), so it does not go through `NightResult`."""
    try:
        report = json.loads((night_dir / "report.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _sourced_lines(value: Any) -> Iterator[dict[str, Any]]:
    """Every learned line report.json records with its provenance (`records.SourcedLine`:
    the proposal's lines, proofread's kept and dropped, a named skill's), wherever it is."""
    if isinstance(value, dict):
        if isinstance(value.get("text"), str) and isinstance(value.get("sources"), list):
            yield value
        for item in value.values():
            yield from _sourced_lines(item)
    elif isinstance(value, list):
        for item in value:
            yield from _sourced_lines(item)


def _strings(value: Any) -> set[str]:
    return {str(v) for v in value} if isinstance(value, (list, tuple)) else set()


# ---- the whole home -------------------------------------------------------------------------


@dataclass(frozen=True)
class HomeForget:
    """What a forget did in the sleep home: each project's stores, and with `--everywhere`
    what was rewritten (None: not asked)."""

    dropped: dict[str, Dropped]
    rewritten: Rewritten | None
    placed: bool = False  # skills were placed in repositories (outside the home)

    def lines(self) -> list[str]:
        """What was done and what is left, one sentence each, for the user."""
        n = Dropped(*(sum(getattr(d, f) for d in self.dropped.values())
                      for f in ("recall", "weak", "ledger", "workspaces", "kinds")))  # fmt: skip
        out = [
            f"dropped from the stores a night reads: {n.recall} recalled tasks, {n.weak} weak "
            f"labels, {n.ledger} edit ledger events, {n.workspaces} workspaces"
            + (f"; the words of {n.kinds} kinds of request rebuilt" if n.kinds else "")
        ]
        done = self.rewritten
        if done is None:
            return out + [
                "night folders and adopted skills keep what they learned from those rows: "
                "`sleep log forget --everywhere --yes` rewrites them"
            ]
        out.append(
            f"rewrote {done.documents} documents (versions, adopted, backups, proposals): "
            f"{done.lines} lines learned from forgotten rows taken out"
        )
        if done.nights:
            out.append(
                f"{len(done.nights)} night folders read a forgotten row ({', '.join(done.nights)}):"
                " their evidence, diagnostics and phase runs are removed, their tasks, reports "
                "and proposals rewritten"
            )
        if done.live:
            out.append(f"live files rewritten with the adopted skill: {', '.join(done.live)}")
        out += [f"left: {x}" for x in done.left]
        if done.shared:
            shown = "; ".join(_short(x) for x in done.shared)
            out.append(
                f"kept {len(done.shared)} rule or memory lines also learned from rows that "
                f"remain (a rule holds no example's words): {shown}"
            )
        if done.adapters:
            out.append(
                "what these LoRA adapters learned from a forgotten row stays in their weights "
                f"(roll back to a version trained without it): {', '.join(done.adapters)}"
            )
        if done.old_nights:
            out.append(
                f"{done.old_nights} night folders from before nights recorded the rows they "
                "read were checked by their tasks and proposal lines only: their evidence may "
                "still hold a forgotten row that became no task (remove them by hand)"
            )
        if self.placed:
            out.append(
                "skills placed in repositories (<home>/placements/placed.json) keep their text "
                "until the next adopt or placement writes them"
            )
        return out


def _short(text: str, chars: int = 60) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def forget_in_home(home: Path, log: TaskLog, *, everywhere: bool) -> HomeForget:
    """After `TaskLog.forget`: the stores of every project (`drop_forgotten`), and with
    `everywhere` the night folders and learned documents too (`rewrite_home`), under the
    night lock. `Busy` when a night holds it: the rows are forgotten in the log all the same,
    and the next night drops them from its stores before it reads them."""
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.lock import NightRunning, night_lock

    dropped: dict[str, Dropped] = {}
    rewritten = Rewritten() if everywhere else None
    try:
        with night_lock(home, "forget", "forget"):
            for project in staging.projects(home):
                if everywhere:
                    dropped[project], done = rewrite_home(project, home, log)
                    rewritten = (rewritten or Rewritten()) + done
                else:
                    dropped[project] = drop_forgotten(project, home, log)
    except NightRunning as err:
        raise Busy(
            "the rows are forgotten in the log, but the sleep home was not cleaned: night "
            f"{err.holder.get('night', '?')} is running (the next night drops them from what "
            "it reads; run `sleep log forget --everywhere --yes` once it ends)"
        ) from None
    placed = (home / "placements" / "placed.json").is_file()
    return HomeForget(dropped, rewritten, placed)
