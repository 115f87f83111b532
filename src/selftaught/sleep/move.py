"""`selftaught sleep log migrate --to postgresql://...`: move a SQLite log and its projects'
adopted versions into Postgres (each project's own, and each of its named skills' under the
key `<project>/skills/<name>`, as `paths.Unit.key` names them).

Idempotent and resumable: rows are copied in batches, each batch (its rows and their
feedback) one transaction; a row whose id is already there is skipped, a feedback entry
already there (compared whole) is not copied twice, a version already there is kept. What the
source forgot (`sleep log forget`) is recorded first, so the database never stores it again;
a row the database forgot is not copied back. A run
killed half-way leaves whole batches behind, and the next run copies the rest. After copying
it checks: every source row is read back from Postgres and compared field by field (merged
feedback included), every version's skill, memory and meta too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.runs import read_json
from selftaught.sleep.paths import (
    Adopted,
    Unit,
    adopted_dir,
    local_skill_names,
    version_adapter,
)
from selftaught.sleep.store import LogError, LogUrl, is_url

BATCH = 500  # rows per transaction


@dataclass
class MoveResult:
    rows: int = 0  # in the source
    rows_copied: int = 0
    rows_present: int = 0  # already there (an earlier run)
    feedback_copied: int = 0
    rows_checked: int = 0  # read back equal
    rows_by_dedupe_key: list[str] = field(default_factory=list)
    """Source rows not copied because Postgres holds another row with their dedupe key (the
    same harvested message, logged twice)."""
    rows_forgotten_there: list[str] = field(default_factory=list)
    """Source rows not copied because the database forgot them (`sleep log forget` there)."""
    forgotten_copied: int = 0  # the source's forgotten ids, newly recorded there
    mismatched: list[str] = field(default_factory=list)  # read back different (ids)
    versions_copied: int = 0
    versions_present: int = 0
    versions_checked: int = 0
    pointers_set: list[str] = field(default_factory=list)  # "<unit key>=N"
    events_copied: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatched

    def lines(self) -> list[str]:
        out = [
            f"interactions: {self.rows} in the source, {self.rows_copied} copied, "
            f"{self.rows_present} already there, {self.feedback_copied} feedback entries copied",
            f"checked: {self.rows_checked} of {self.rows} rows read back equal"
            + (f", {len(self.mismatched)} differ" if self.mismatched else ""),
            f"versions: {self.versions_copied} copied, {self.versions_present} already there, "
            f"{self.versions_checked} checked; adopted: "
            + (", ".join(self.pointers_set) or "nothing new")
            + f"; {self.events_copied} events copied",
        ]
        if self.forgotten_copied:
            out.append(f"{self.forgotten_copied} forgotten rows recorded (never stored again)")
        if self.rows_forgotten_there:
            out.append(
                f"{len(self.rows_forgotten_there)} rows were forgotten in the database "
                "(`sleep log forget`): not copied back"
            )
        if self.rows_by_dedupe_key:
            out.append(
                f"{len(self.rows_by_dedupe_key)} rows were already there under another id "
                "(the same dedupe key): not copied"
            )
        out += [f"different in Postgres: {i}" for i in self.mismatched[:10]]
        return out + self.notes


def move_log(
    source: Path,
    to: str,
    home: Path,
    *,
    batch: int = BATCH,
    progress: Callable[[str], None] | None = None,
) -> MoveResult:
    """Copy the SQLite log at `source` and the versions under `home` into the database at
    `to` (see the module docstring)."""
    from selftaught.sleep.intake.log import TaskLog

    if not is_url(to):
        raise LogError(f"--to must be a postgresql:// URL, got {to!r}")
    if is_url(str(source)) or not Path(source).is_file():
        raise LogError(f"no SQLite task log at {source} to copy (give --log PATH)")
    result = MoveResult()
    with TaskLog(source) as src, TaskLog(to) as dst:
        result.forgotten_copied = dst.add_forgotten(src.forgotten_entries())
        _copy_rows(src, dst, batch, result, progress)
        _check_rows(src, dst, batch, result)
    result.rows_present -= len(result.rows_forgotten_there)  # skipped, but not there
    _copy_versions(LogUrl(to).url, home, result)
    return result


def _copy_rows(
    src: Any, dst: Any, batch: int, result: MoveResult, progress: Callable[[str], None] | None
) -> None:
    after = None
    while True:
        rows, feedback, after = src.raw_page(after, batch)
        if not rows:
            return
        copied, fed = dst.add_raw(rows, feedback)
        result.rows += len(rows)
        result.rows_copied += copied
        result.rows_present += len(rows) - copied
        result.feedback_copied += fed
        if progress:
            progress(f"{result.rows} rows read, {result.rows_copied} copied")


def _check_rows(src: Any, dst: Any, batch: int, result: MoveResult) -> None:
    """Every source row read back from Postgres, compared as the export writes it."""
    from selftaught.sleep.intake.log import LogFilter

    rows = src.query(LogFilter(newest_first=False))
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        found = {r.id: r for r in dst.rows_by_id([r.id for r in chunk])}
        for row in chunk:
            there = found.get(row.id)
            if there is None and dst.is_forgotten(row.id, row.dedupe_key):
                result.rows_forgotten_there.append(row.id)
            elif there is None and row.dedupe_key and dst.has_dedupe_key(row.dedupe_key):
                result.rows_by_dedupe_key.append(row.id)
            elif there is not None and there.to_dict() == row.to_dict():
                result.rows_checked += 1
            else:
                result.mismatched.append(row.id)


def _local_versions(project_root: Path) -> list[int]:
    root = project_root / "versions"
    if not root.is_dir():
        return []
    return sorted(
        int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "meta.json").is_file()
    )


def _copy_versions(url: str, home: Path, result: MoveResult) -> None:
    from selftaught.sleep.store.versions import PgVersions

    root = home / "projects"
    projects = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    db = PgVersions(url)
    try:
        for project in projects:
            for unit in _units(project, home):
                _copy_unit(db, unit, home, result)
    finally:
        db.close()


def _units(project: str, home: Path) -> list[Unit]:
    """The project's own unit, then each named skill with a folder in the home."""
    return [Unit(project)] + [Unit(project, name) for name in local_skill_names(project, home)]


def _copy_unit(db: Any, unit: Unit, home: Path, result: MoveResult) -> None:
    folder, key = unit.folder(home), unit.key
    present = set(db.numbers(key))
    for n in _local_versions(folder):
        version_dir = folder / "versions" / str(n)
        on_disk = Adopted(
            (version_dir / "skill.md").read_text(encoding="utf-8"),
            (version_dir / "memory.md").read_text(encoding="utf-8"),
            str(n),
        )
        meta = read_json(version_dir / "meta.json")
        if n in present:
            result.versions_present += 1
        else:
            db.write_version(key, on_disk, meta, version_adapter(unit, str(n), home))
            result.versions_copied += 1
        there = db.read(key, n, folder / "versions")
        if there and (there.skill, there.memory) == (on_disk.skill, on_disk.memory):
            result.versions_checked += int(db.meta(key, n) == json.loads(json.dumps(meta)))
    _copy_pointer(db, unit, home, result)
    _copy_events(db, key, folder, result)


def _copy_pointer(db: Any, unit: Unit, home: Path, result: MoveResult) -> None:
    """The adopted version, unless Postgres already names one (it may have moved on)."""
    path = adopted_dir(unit, home) / "version"
    named = path.read_text(encoding="utf-8").strip() if path.is_file() else ""
    if db.pointer(unit.key) is not None or not named:
        return
    if not named.isdigit() or (named != "0" and int(named) not in db.numbers(unit.key)):
        result.notes.append(
            f"{unit.label}: the adopted files name version {named!r}, which adopt did not "
            "write; not adopted in Postgres (adopt a night there)"
        )
        return
    db.point(unit.key, int(named))
    result.pointers_set.append(f"{unit.key}={named}")


def _copy_events(db: Any, key: str, folder: Path, result: MoveResult) -> None:
    path = folder / "events.jsonl"
    if not path.is_file():
        return
    have = db.events(key)
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row in have:
            have.remove(row)
            continue
        db.record_event(key, row)
        result.events_copied += 1
