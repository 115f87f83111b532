"""A folder of skills, one `<name>/SKILL.md` each (`optimize --skills DIR`): read as starting
skills, written back when a trained skill is accepted.

A file is written atomically, holds only what `skill_md` renders (name and description front
matter, the user's other front-matter lines kept verbatim, the body), and is never written over
when it changed on disk since it was read: that skill is not written and the reason names it.
A new skill is never written over a file that was not read as a starting skill either.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.errors import InputError
from selftaught.runs import atomic_write_json, atomic_write_text, private_dirs, read_json
from selftaught.skill.skill_md import SkillFile, parse_skill_md
from selftaught.skill.skillset import (
    RefusedWrite,
    SkillOutcome,
    skill_file_dict,
    skill_file_from,
)


def _sha_of(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class SkillOnDisk:
    """One starting skill as read: where, its text's sha256 (what "changed since read" is
    measured against) and the parsed file."""

    path: Path
    sha256: str
    file: SkillFile

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "file": skill_file_dict(self.file)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SkillOnDisk:
        return cls(Path(d["path"]), str(d["sha256"]), skill_file_from(d["file"]))


def read_skills_dir(folder: str | Path) -> list[SkillOnDisk]:
    """Every `folder/*/SKILL.md`, by folder name; none when the folder does not exist yet."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise InputError(f"--skills {root}: not a folder")
    found = []
    for path in sorted(root.glob("*/SKILL.md")):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text") from None
        file = parse_skill_md(text, str(path))
        found.append(SkillOnDisk(path, hashlib.sha256(raw).hexdigest(), file))
    names = [s.file.card.name for s in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{root}: two SKILL.md files share the name {', '.join(dup)}")
    return found


def write_skill_files(
    outcomes: Sequence[SkillOutcome], folder: str | Path, as_read: Sequence[SkillOnDisk]
) -> tuple[list[str], list[RefusedWrite]]:
    """Write each accepted outcome's SKILL.md: an existing skill back to the file it was read
    from (only when that file is unchanged since `as_read`), a new one to
    `folder/<name>/SKILL.md` (only when nothing is there). Returns (written, refused)."""
    read = {s.file.card.name: s for s in as_read}
    written: list[str] = []
    refused: list[RefusedWrite] = []
    for o in outcomes:
        if not o.accepted:
            continue
        before = read.get(o.name)
        path = before.path if before is not None else Path(folder) / o.name / "SKILL.md"
        now = _sha_of(path)
        if before is not None and now != before.sha256:
            why = "deleted" if now is None else "changed"
            refused.append(RefusedWrite(str(path), f"{why} on disk since it was read"))
            continue
        if before is None and now is not None:
            refused.append(RefusedWrite(str(path), "exists but was not read as a starting skill"))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, o.skill_file().render())
        written.append(str(path))
    return written, refused


def starting_skills(folder: str | Path, run_dir: str | Path) -> list[SkillOnDisk]:
    """The starting skills of a set run: read from `folder` the first time and recorded in
    `run_dir/start_files.json`; a resumed run takes the record, so "changed since read" still
    means since the first run read it."""
    record = Path(run_dir) / "start_files.json"
    if record.exists():
        return [SkillOnDisk.from_dict(d) for d in read_json(record)]
    found = read_skills_dir(folder)
    private_dirs(Path(run_dir))
    atomic_write_json(record, [s.to_dict() for s in found])
    return found
