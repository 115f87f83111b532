"""The user's own files as a night's starting documents, written back when adopted.

A night can start from files the user wrote (issue 51):

    sleep run --skills --skills-from REPO     each SKILL.md under REPO/.claude/skills,
                                              .agents/skills and .codex/skills starts the skill
                                              of its name (an adopted skill of that name wins)
    sleep run --start-document PATH           the project's skill starts from PATH's text
                                              (CLAUDE.md, AGENTS.md, any Markdown file)

What was read is recorded with the staged proposal (`source_of`: path, kind, sha256 as read).
Adopting it writes the adopted text back into that file through `placement.write_documents`:
only while the file is still what the night read (else the adopt of that file stops, writes
nothing and names it: `WriteBackError`), a SKILL.md's front matter byte for byte, a diff, and
a backup under `<home>/placements/backups/`. The version's meta.json records the write
(`WrittenBack`), so a rollback puts the file's previous bytes back (`restore_written`), again
only while the file is still what the adopt wrote.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.skill.skill_md import FENCE
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.placement import (
    DocumentEdit,
    PlacedFile,
    StartingDocument,
    read_document,
    restore_placement,
    sha256_text,
    start_problem,
    write_documents,
)
from selftaught.sleep.adoption.staging import Adoption, StagingError
from selftaught.sleep.paths import Owner
from selftaught.sleep.records import SourceFileRecord, given

WRITTEN_BACK = "written_back"  # the key in a version's meta.json
START_DOCUMENT = "start_document"  # the key in a night's report.json


class WriteBackError(StagingError):
    """A user's file cannot be written back (changed since the night read it, or the edit is
    out of bounds); nothing was written for it."""


def source_of(doc: StartingDocument) -> SourceFileRecord:
    """What a night records of a user's file it started from: where, its kind and its sha256
    as read, and the repository it was read in (`root`, and that folder resolved then:
    `root_real`), from which every component is checked again before it is written. Recorded
    before round five: no root (the file's own folder is checked)."""
    root = "" if doc.root is None else str(doc.root)
    return SourceFileRecord(path=str(doc.path), kind=doc.kind, sha256=doc.sha256, root=root,
                            root_real=doc.root_real)  # fmt: skip


@dataclass(frozen=True)
class WrittenBack:
    """What an adopt wrote into a user's file: its sha256 before and after, the diff, and the
    placement backup that holds the bytes before."""

    path: str
    sha256_before: str
    sha256_after: str
    backup: str
    diff: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
            "backup": self.backup,
            "diff": self.diff,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> WrittenBack | None:
        if not d:
            return None
        return cls(str(d["path"]), str(d["sha256_before"]), str(d["sha256_after"]),
                   str(d["backup"]), str(d.get("diff") or ""))  # fmt: skip


def with_body(text: str, body: str) -> str:
    """A SKILL.md's `text` with its body replaced by `body`: the front matter (and the blank
    lines around the body) byte for byte."""
    lines = text.split("\n")
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == FENCE)
    head = "\n".join(lines[: end + 1]) + "\n"
    rest = text[len(head) :]
    lead = rest[: len(rest) - len(rest.lstrip("\n"))]
    tail = rest[len(rest.rstrip("\n")) :] or "\n"
    return head + lead + body.strip("\n") + tail


def file_text(doc: StartingDocument, body: str) -> str:
    """What the user's file holds once `body` is adopted: a SKILL.md keeps its front matter
    and takes `body` as its body; any other file is the skill, whole."""
    return with_body(doc.text, body) if doc.skill is not None else body


def reread(source: SourceFileRecord) -> StartingDocument:
    """The file as it is now, refused (`WriteBackError`) unless it is what the night read, in
    the repository it was read in: the root resolving where it did, no symlink from it to the
    file (the write checks both again, with no symlink followed)."""
    root = Path(source.root) if source.root else None
    try:
        doc = read_document(source.path, root=root)
    except Exception as err:  # gone, or no longer a file
        raise WriteBackError(
            f"{source.path} is gone since the night read it ({err}); nothing was written for it"
        ) from None
    if source.root_real:
        doc = dataclasses.replace(doc, root_real=source.root_real)  # checked as it was then
        now = os.path.realpath(source.root)
        if now != source.root_real:
            raise WriteBackError(
                f"the repository {source.root} now resolves to {now}, not {source.root_real} "
                f"as when the night read {source.path}; nothing was written for it"
            )
    problem = start_problem(doc)
    if problem is None and doc.sha256 != source.sha256:
        problem = f"{source.path} changed since the night read it"
    if problem is not None:
        raise WriteBackError(
            f"{problem}; nothing was written for it (run another night to start from it "
            "as it is now)"
        )
    return doc


def write_back(source: SourceFileRecord, body: str, home: Path | None = None) -> WrittenBack:
    """Write `body` into the user's file `source` (`file_text`), only while it is what the
    night read; raises `WriteBackError` (nothing written) otherwise."""
    doc = reread(source)
    new = file_text(doc, body)
    result = write_documents([DocumentEdit(doc, new)], home=home)
    (done,) = result.files
    if done.action not in ("written", "unchanged"):
        raise WriteBackError(f"{done.path}: {done.reason}; nothing was written for it")
    return WrittenBack(source.path, source.sha256, sha256_text(new), result.backup or "",
                       done.diff)  # fmt: skip


def undo(written: WrittenBack | None, home: Path | None = None) -> list[PlacedFile]:
    """Put back what `written` replaced (an adopt that failed after its write-back)."""
    if written is None or not written.backup:
        return []
    return list(restore_placement(written.backup, home=home).files)


def restore_written(
    unit: Owner, done: Adoption, home: Path | None = None
) -> tuple[list[PlacedFile], list[str]]:
    """After a rollback `done` of `unit`, the user's files the rolled-back versions wrote get
    their previous bytes back (newest first, each only while still what its adopt wrote).
    Returns the files touched and notes (a file left as the user changed it; a roll forward,
    which does not write user files)."""
    files: list[PlacedFile] = []
    notes: list[str] = []
    undone = [v for v in staging.version_numbers(unit, home) if done.version < v <= done.previous]
    if done.version > done.previous:
        later = [v for v in staging.version_numbers(unit, home)
                 if done.previous < v <= done.version]  # fmt: skip
        paths = {w.path for v in later if (w := written_by(unit, v, home)) is not None}
        notes += [f"{p} not rewritten: rolling forward leaves your files" for p in sorted(paths)]
    skipped: set[str] = set()
    for version in sorted(undone, reverse=True):
        written = written_by(unit, version, home)
        if written is None or not written.backup or written.path in skipped:
            continue
        for f in restore_placement(written.backup, home=home).files:
            files.append(f)
            if f.action == "skipped-user-changed":
                skipped.add(f.path)
                notes.append(
                    f"{f.path} changed since version {version} was written into it; left as it "
                    "is (not restored)"
                )
            elif f.action == "refused":
                skipped.add(f.path)
                notes.append(f"{f.path} not restored: {f.reason}")
    return files, notes


def written_by(unit: Owner, version: int, home: Path | None = None) -> WrittenBack | None:
    """The user's file adopting `version` wrote (None: it wrote none)."""
    try:
        meta = staging.version_meta(unit, version, home)
    except StagingError:
        return None
    return WrittenBack.from_dict(meta.get(WRITTEN_BACK))


def adopt_night(
    project: str,
    night_id: str | None = None,
    *,
    home: Path | None = None,
    force: bool = False,
    target_paths: list[Path] | tuple[Path, ...] = (),
    follow_symlinks: bool = False,
) -> Adoption:
    """`staging.adopt`, and for a night that started from a user's file (`--start-document`)
    the adopted skill written back into that file first: if the file changed since the night
    read it nothing is adopted (`WriteBackError` names it); if the adopt fails after the
    write, the file gets its bytes back."""
    night_dir = staging.resolve_night(project, night_id, home)
    staged = staging.read_night(night_dir)
    source = staged.start_document if given(staged.start_document) else None
    args: dict[str, Any] = dict(home=home, force=force, target_paths=target_paths,
                                follow_symlinks=follow_symlinks)  # fmt: skip
    if source is None or staged.status != "staged":
        return staging.adopt(project, night_dir.name, **args)
    skill = staging.read_text(night_dir / "proposal" / "skill.md")
    written = write_back(source, skill, home)
    try:
        meta = {WRITTEN_BACK: written.to_dict()}
        done = staging.adopt(project, night_dir.name, **args, meta=meta)
    except BaseException:
        undo(written, home)
        raise
    done.written_back.append(written)
    return done


def rollback_unit(
    unit: Owner,
    version: int | None = None,
    *,
    home: Path | None = None,
    target_paths: list[Path] | tuple[Path, ...] = (),
    follow_symlinks: bool = False,
) -> Adoption:
    """`staging.rollback`, then the user's files the versions undone wrote get their bytes back
    (`restore_written`: `Adoption.restored`, and `note` says what was left as it is)."""
    done = staging.rollback(unit, version, home=home, target_paths=target_paths,
                            follow_symlinks=follow_symlinks)  # fmt: skip
    files, notes = restore_written(unit, done, home)
    done.restored += files
    done.note = "; ".join(n for n in (done.note, *notes) if n) or None
    return done
