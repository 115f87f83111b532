"""Skills written where each agent reads them, and the user's own files as starting documents.

Where a skill goes (`PlacementTarget`, one per agent and repository):

    claude:REPO        REPO/.claude/skills/<name>/SKILL.md    Claude Code lists it (name and
                                                              description) and opens it with
                                                              its Skill tool
    codex:REPO         REPO/.agents/skills/<name>/SKILL.md    Codex lists it with its path
                                                              (0.169.0 reads .agents/skills and
                                                              .codex/skills per repository)
    agents-md:REPO     REPO/AGENTS.md, one marked section     Codex (and any AGENTS.md reader)
                       per skill, the rest byte for byte      has the whole body in every turn
    codex-global       $CODEX_HOME/skills/<name>/SKILL.md     every repository: refused unless
                       (default ~/.codex/skills)              `allow_global` (--allow-global)

A file placed here holds text only: the front matter is `name` and `description` and nothing
else (never `allowed-tools`, hooks or scripts), and a body or description holding a front
matter fence (a `---` line) or a selftaught block marker is refused, file by file.

**A file changed since it was read is never overwritten.** selftaught keeps a ledger of the
sha256 of every file (and AGENTS.md section) it wrote, `<home>/placements/placed.json`; a file
is replaced only when it is still what selftaught wrote, or what the caller read
(`StartingDocument.sha256`), and this is checked again right before the rename. Otherwise that
file is `skipped-user-changed` (the result says so) and the others are written. A file that
exists and that selftaught neither wrote nor read (a user's own skill of the same name) is
never replaced either. Each placement keeps the previous bytes of what it wrote under
`<home>/placements/backups/<time>-<what>/` (as adopt's backups); `restore_placement` puts them
back, again only where the file is still what the placement wrote. Symlinks are refused unless
`follow_symlinks` (then the file they point to is written, as for --target-skill-path).

`read_starting_documents(repo)` reads the user's CLAUDE.md, AGENTS.md and skill folders into
`StartingDocument`s (their text and sha256 as read); `write_documents` writes the caller's
edits of them back under the same rule, with a diff, the front matter and block markers as
they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from selftaught.choices import one_of
from selftaught.demos import demo_section, split_skill
from selftaught.errors import InputError
from selftaught.runs import (
    Inside,
    PathRefused,
    atomic_write_json,
    atomic_write_text,
    private_dirs,
    read_json,
)
from selftaught.skill.routing import SkillCard, check_name, slug_name
from selftaught.skill.skill_md import FENCE, SkillFile, SkillFileError, parse_skill_md
from selftaught.sleep.adoption.inject import (
    BlockMarkerError,
    check_no_markers,
    find_marker,
    live_block_span,
)
from selftaught.sleep.paths import Adopted, sleep_home

TargetKind = Literal["claude", "codex", "agents-md", "codex-global"]
TARGET_KINDS: tuple[TargetKind, ...] = ("claude", "codex", "agents-md", "codex-global")
Action = Literal["written", "unchanged", "removed", "skipped-user-changed", "refused"]
DocumentKind = Literal["claude-skill", "codex-skill", "claude-md", "agents-md", "markdown"]

SKILL_FILE = "SKILL.md"
CLAUDE_SKILLS = Path(".claude") / "skills"
CODEX_SKILLS = Path(".agents") / "skills"  # Codex's repository folder (also .codex/skills)
CODEX_OTHER_SKILLS = Path(".codex") / "skills"
AGENTS_MD = "AGENTS.md"
_SECTION_LIKE = re.compile(r"<!--\s*/?\s*selftaught\s*:\s*agent-skill\b", re.IGNORECASE)
_SECTION = re.compile(r"<!-- (/?)selftaught:agent-skill name=([a-z0-9]+(?:-[a-z0-9]+)*) -->")


class PlacementError(InputError):
    """A placement that cannot be done at all (a global target without the opt-in, two skills
    of one name); nothing was written."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def codex_home() -> Path:
    """$CODEX_HOME, else ~/.codex: where Codex keeps its global skills."""
    env = os.environ.get("CODEX_HOME")
    return Path(env).expanduser() if env else Path.home() / ".codex"


# ---- targets and results --------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementTarget:
    """One agent's place for skills: `kind` (claude, codex, agents-md, codex-global) and its
    `root` (the repository; Codex's home for codex-global)."""

    kind: TargetKind
    root: Path
    allow_global: bool = False
    follow_symlinks: bool = False

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise PlacementError(
                f"unknown placement {self.kind!r}; one of: {', '.join(TARGET_KINDS)}"
            )
        if self.kind == "codex-global" and not self.allow_global:
            raise PlacementError(
                f"codex-global writes to {self.root / 'skills'}, which every Codex session in "
                "every repository reads; pass --allow-global (allow_global=True) to mean it, "
                "or place per repository with codex:REPO"
            )
        object.__setattr__(self, "root", Path(os.path.abspath(Path(self.root).expanduser())))

    @classmethod
    def parse(
        cls, spec: str, *, allow_global: bool = False, follow_symlinks: bool = False
    ) -> PlacementTarget:
        """`claude:REPO`, `codex:REPO`, `agents-md:REPO`, `codex-global[:CODEX_HOME]`."""
        name, sep, where = spec.partition(":")
        kind = one_of(name, TARGET_KINDS)
        if kind == "codex-global":
            root = Path(where) if where else codex_home()
        elif kind is not None and sep and where:
            root = Path(where)
        else:
            raise PlacementError(
                f"--place {spec!r}: expected claude:REPO, codex:REPO, agents-md:REPO or "
                "codex-global (with --allow-global)"
            )
        return cls(kind, root, allow_global, follow_symlinks)

    def skill_path(self, name: str) -> Path:
        """Where skill `name` is written (AGENTS.md for agents-md)."""
        folder = {
            "claude": CLAUDE_SKILLS,
            "codex": CODEX_SKILLS,
            "codex-global": Path("skills"),
        }.get(self.kind)
        if folder is None:
            return self.root / AGENTS_MD
        return self.root / folder / check_name(name) / SKILL_FILE

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "root": str(self.root),
            "allow_global": self.allow_global,
            "follow_symlinks": self.follow_symlinks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlacementTarget:
        return cls(
            d["kind"],
            Path(d["root"]),
            bool(d.get("allow_global")),
            bool(d.get("follow_symlinks")),
        )


@dataclass(frozen=True)
class PlacedFile:
    """What happened to one file (or one AGENTS.md section: `skill` names it)."""

    path: str
    action: Action
    skill: str | None = None
    diff: str = ""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "action": self.action,
            "skill": self.skill,
            "diff": self.diff,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlacedFile:
        return cls(d["path"], d["action"], d.get("skill"), d.get("diff", ""), d.get("reason", ""))


@dataclass(frozen=True)
class PlacementResult:
    """Every file a placement (or a write-back, or a restore) looked at, and its backup folder
    (None when nothing was written)."""

    target: PlacementTarget | None
    files: tuple[PlacedFile, ...]
    backup: str | None = None

    def with_action(self, *actions: str) -> tuple[PlacedFile, ...]:
        return tuple(f for f in self.files if f.action in actions)

    @property
    def skipped(self) -> tuple[PlacedFile, ...]:
        return self.with_action("skipped-user-changed")

    @property
    def refused(self) -> tuple[PlacedFile, ...]:
        return self.with_action("refused")

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.to_dict() if self.target else None,
            "files": [f.to_dict() for f in self.files],
            "backup": self.backup,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlacementResult:
        target = PlacementTarget.from_dict(d["target"]) if d.get("target") else None
        files = tuple(PlacedFile.from_dict(f) for f in d.get("files") or ())
        return cls(target, files, d.get("backup"))


@dataclass(frozen=True)
class StartingDocument:
    """A user's file as read: its text and sha256 then (what a later write compares with), the
    parsed SKILL.md for a skill, or why it cannot be used (`problem`: not UTF-8, a symlink
    not followed, a SKILL.md without its front matter)."""

    path: Path
    kind: DocumentKind
    text: str
    sha256: str
    skill: SkillFile | None = None
    problem: str | None = None
    root: Path | None = None  # the repository it was read in: no symlink below it on the way
    root_real: str = ""  # that folder resolved when the file was read

    @property
    def usable(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "text": self.text,
            "sha256": self.sha256,
            "problem": self.problem,
            "root": None if self.root is None else str(self.root),
            "root_real": self.root_real,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StartingDocument:
        path, kind, text = Path(d["path"]), d["kind"], str(d["text"])
        skill = None
        if kind in ("claude-skill", "codex-skill") and d.get("problem") is None:
            skill = parse_skill_md(text, str(path))
        root = Path(d["root"]) if d.get("root") else None
        return cls(path, kind, text, str(d["sha256"]), skill, d.get("problem"), root,
                   str(d.get("root_real") or ""))  # fmt: skip


@dataclass(frozen=True)
class DocumentEdit:
    """The caller's new text for a starting document."""

    document: StartingDocument
    text: str


# ---- text only --------------------------------------------------------------------------------


def _fence_line(text: str) -> int | None:
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip() == FENCE:
            return number
    return None


def text_only_problem(skill: SkillFile) -> str | None:
    """Why `skill` may not be written by selftaught (None: it may): front matter beyond name
    and description, or a fence / block marker in its description or body."""
    name = skill.card.name
    if skill.extra:
        keys = ", ".join(sorted({e.partition(":")[0].strip() for e in skill.extra if e.strip()}))
        return (
            f"skill {name!r} has front matter beyond name and description ({keys or 'lines'}); "
            "a skill selftaught writes holds text only"
        )
    for part, text in (("description", skill.card.description), ("body", skill.body)):
        line = _fence_line(text)
        if line is not None:
            return (
                f"the {part} of skill {name!r} holds a front-matter fence ('---' on line "
                f"{line}), which could open front matter an agent reads; rewrite it"
            )
        try:
            check_no_markers(text, f"the {part} of skill {name!r}")
        except BlockMarkerError as err:
            return str(err)
        section = _SECTION_LIKE.search(text)
        if section is not None:
            return f"the {part} of skill {name!r} holds a selftaught section marker; remove it"
    return None


# ---- AGENTS.md sections -----------------------------------------------------------------------


def section_text(skill: SkillFile) -> str:
    """Skill `skill` as one marked AGENTS.md section (no trailing newline)."""
    name = skill.card.name
    return (
        f"<!-- selftaught:agent-skill name={name} -->\n## Skill: {name}\n\n"
        f"{skill.card.description}\n\n{skill.body.strip()}\n"
        f"<!-- /selftaught:agent-skill name={name} -->"
    )


def section_spans(text: str, where: str) -> dict[str, tuple[int, int]]:
    """{name: [start, end)} of every selftaught skill section in `text` (the end marker's
    newline included). Raises `BlockMarkerError` unless every section marker is a line of its
    own, each start is closed by the end of the same name before the next start, no name is
    used twice, and no section lies inside the adopted block of --target-skill-path."""
    spans: dict[str, tuple[int, int]] = {}
    open_at: tuple[str, int] | None = None
    pos = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\r\n")
        if _SECTION_LIKE.search(body):
            m = _SECTION.fullmatch(body)
            closing, name = (m.group(1) == "/", m.group(2)) if m else (False, "")
            bad = m is None or (closing != (open_at is not None))
            bad = bad or (closing and open_at is not None and open_at[0] != name)
            if bad or (not closing and name in spans):
                raise BlockMarkerError(
                    f"{where}: line {number} is a selftaught skill-section marker out of place "
                    f"({body.strip()[:60]!r}); fix the file by hand, it was not changed"
                )
            if closing and open_at is not None:
                spans[name] = (open_at[1], pos + len(line))
                open_at = None
            else:
                open_at = (name, pos)
        pos += len(line)
    if open_at is not None:
        raise BlockMarkerError(f"{where}: skill section {open_at[0]!r} is never closed")
    block = live_block_span(text, where)
    if block is not None and any(s < block[1] and block[0] < e for s, e in spans.values()):
        raise BlockMarkerError(f"{where}: a skill section lies inside the adopted block")
    return spans


def with_section(text: str, name: str, section: str, where: str) -> str:
    """`text` with section `name` replaced by `section` (or added at the end after a blank
    line); every byte outside it as it was."""
    span = section_spans(text, where).get(name)
    if span is not None:
        start, end = span
        return text[:start] + section + "\n" + text[end:]
    if not text:
        return section + "\n"
    return text + ("\n" if text.endswith("\n") else "\n\n") + section + "\n"


# ---- the ledger, backups and the write --------------------------------------------------------


def placements_dir(home: Path | None = None) -> Path:
    return (home or sleep_home()) / "placements"


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[dict[str, str]]:
    """The ledger (path or path#section -> sha256 written), under the placements lock; saved
    when the block ends without an error."""
    private_dirs(state)
    fd = os.open(state / "placements.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = state / "placed.json"
        ledger: dict[str, str] = read_json(path) if path.is_file() else {}
        try:
            yield ledger
        finally:  # entries are added only once their file is written: keep them on an error
            atomic_write_json(path, ledger)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _new_backup(state: Path, what: str) -> Path:
    """A fresh backups/<time>-<what>[-n]/ folder, as staging's adopt backups are named."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = private_dirs(state / "backups")
    dest, n = root / f"{stamp}-{what}", 1
    while dest.exists():
        n += 1
        dest = root / f"{stamp}-{what}-{n}"
    dest.mkdir(mode=0o700)
    return dest


@dataclass
class _Write:
    """One file to write below `root`: its bytes as planned on (None: absent) and its new text
    (None: the file is removed), with the ledger entries (key -> sha256, None: forgotten) it
    records."""

    path: Path
    root: Path  # written below it, no symlink followed on the way (`runs.Inside`)
    old: str | None
    new: str | None
    records: dict[str, str | None] = field(default_factory=dict)
    files: list[PlacedFile] = field(default_factory=list)

    @property
    def rel(self) -> str:
        return self.path.relative_to(self.root).as_posix()


def _read_now(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None


def _diff(old: str | None, new: str | None, path: Path) -> str:
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile=f"a/{path.name}" if old is not None else "/dev/null",
            tofile=f"b/{path.name}" if new is not None else "/dev/null",
        )
    )


def _commit(
    writes: list[_Write], ledger: dict[str, str], state: Path, what: str
) -> tuple[list[PlacedFile], str | None]:
    """Back up, then write each file atomically, each only if it still holds what was planned
    on (else `skipped-user-changed`); records the ledger entries of what was written."""
    todo = [w for w in writes if any(f.action in ("written", "removed") for f in w.files)]
    out = [f for w in writes if w not in todo for f in w.files]
    if not todo:
        return out, None
    backup = _new_backup(state, what)
    manifest = []
    for i, w in enumerate(todo):
        if w.old is not None:
            atomic_write_text(backup / "files" / str(i), w.old)
        keys = {k: ledger.get(k) for k in w.records}
        manifest.append(
            {"path": str(w.path), "existed": w.old is not None, "file": str(i),
             "sha256_after": None if w.new is None else sha256_text(w.new),
             "ledger_before": keys, "root": str(w.root),
             "root_real": os.path.realpath(w.root)}
        )  # fmt: skip
    atomic_write_json(backup / "manifest.json", manifest)
    for w in todo:
        why = _write_below(w)
        if why:
            action: Action = "refused" if why.startswith("refused") else "skipped-user-changed"
            out += [_skip(f, why, action) for f in w.files]
            continue
        for key, sha in w.records.items():
            if sha is None:
                ledger.pop(key, None)
            else:
                ledger[key] = sha
        out += w.files
    return out, str(backup)


def _write_below(w: _Write) -> str:
    """Write (or remove) `w`'s file below its root with no symlink followed, only while it
    still holds what was planned on; "" when done, else why not."""
    if w.new is not None and not os.path.lexists(w.root):  # codex-global's home, a followed
        private_dirs(w.root)  # link's folder: made as `atomic_write_text` made them
    try:
        with Inside(w.root) as inside:
            now = inside.read(w.rel)
            if (None if now is None else now.decode("utf-8", "replace")) != w.old:
                return "changed while selftaught was writing it; left as it is"
            if w.new is None:
                inside.remove(w.rel, empty_folder=w.path.name == SKILL_FILE)
            else:
                inside.replace(w.rel, w.new.encode("utf-8"))
    except PathRefused as err:
        return f"refused: {err}; nothing was written there"
    return ""


def _skip(f: PlacedFile, why: str, action: Action = "skipped-user-changed") -> PlacedFile:
    if f.action not in ("written", "removed"):
        return f
    return PlacedFile(f.path, action, f.skill, "", why)


def _checked_path(path: Path, root: Path, follow: bool) -> tuple[Path | None, str]:
    """(the file to write, "") or (None, why it is refused): a symlink on the way from `root`
    to `path` without `follow`, or a folder where the file should be."""
    here = root
    for part in path.relative_to(root).parts:
        here = here / part
        if here.is_symlink() and not follow:
            return None, (
                f"{here} is a symlink (to {os.readlink(here)}); nothing was written there: "
                "pass --follow-symlinks to write where it points"
            )
    real = Path(os.path.realpath(path)) if follow else path
    if real.is_dir():
        return None, f"{real} is a directory"
    return real, ""


def _below(path: Path, root: Path) -> Path:
    """The folder `path` is written below: `root`, or, for a file a followed symlink led out
    of it (`follow_symlinks`), that file's own folder."""
    return root if path.is_relative_to(root) else path.parent


def _user_changed(path: Path, now: str | None, ledger: Mapping[str, str], read: set[str]) -> str:
    """Why the file at `path` (holding `now`) is the user's and must not be replaced ("" when
    selftaught may replace it)."""
    known = set(read)
    if str(path) in ledger:
        known.add(ledger[str(path)])
    if now is None:
        return "" if not known else "deleted since selftaught wrote or read it; not written again"
    if sha256_text(now) in known:
        return ""
    if not known:
        return "exists and was neither written by selftaught nor read as a starting document"
    return "changed since selftaught wrote or read it; left as it is"


# ---- placing skills ---------------------------------------------------------------------------


def _read_shas(read: Sequence[StartingDocument]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for doc in read:
        if doc.usable:
            out.setdefault(str(Path(os.path.abspath(doc.path))), set()).add(doc.sha256)
    return out


def _plan_skill_file(
    skill: SkillFile,
    target: PlacementTarget,
    ledger: Mapping[str, str],
    shas: Mapping[str, set[str]],
) -> _Write | PlacedFile:
    """One SKILL.md: the write to do, or the file's final status."""
    name = skill.card.name
    shown = target.skill_path(name)
    path, why = _checked_path(shown, target.root, target.follow_symlinks)
    if path is None:
        return PlacedFile(str(shown), "refused", name, reason=why)
    read = shas.get(str(path), set()) | shas.get(str(shown), set())
    try:
        now = _read_now(path)
    except UnicodeDecodeError:
        return PlacedFile(str(path), "refused", name, reason=f"{path} is not UTF-8 text")
    new = skill.render()
    if now == new:
        return PlacedFile(str(path), "unchanged", name)
    why = _user_changed(path, now, ledger, read)
    if why:
        return PlacedFile(str(path), "skipped-user-changed", name, reason=why)
    done = PlacedFile(str(path), "written", name, diff=_diff(now, new, path))
    return _Write(path, _below(path, target.root), now, new, {str(path): sha256_text(new)},
                  [done])  # fmt: skip


def _open_agents_md(
    target: PlacementTarget, names: Sequence[str]
) -> tuple[_Write, dict[str, tuple[int, int]]] | list[PlacedFile]:
    """AGENTS.md as it is now, ready to edit (a `_Write` whose new text starts as the old) with
    its sections' spans; or every name refused, saying why (a path not allowed, not UTF-8, a
    broken section marker)."""
    shown = target.skill_path("")
    path, why = _checked_path(shown, target.root, target.follow_symlinks)
    if path is None:
        return [PlacedFile(str(shown), "refused", n, reason=why) for n in names]
    try:
        old = _read_now(path)
        spans = section_spans(old or "", str(path))
    except (UnicodeDecodeError, BlockMarkerError) as err:
        why = str(err) if isinstance(err, BlockMarkerError) else f"{path} is not UTF-8 text"
        return [PlacedFile(str(path), "refused", n, reason=why) for n in names]
    return _Write(path, _below(path, target.root), old, old or ""), spans


def _plan_agents_md(
    skills: Sequence[SkillFile], target: PlacementTarget, ledger: Mapping[str, str]
) -> _Write | list[PlacedFile]:
    """AGENTS.md with one section per skill: a section selftaught did not write as it is now
    is left alone (skipped), the rest of the file byte for byte."""
    opened = _open_agents_md(target, [s.card.name for s in skills])
    if isinstance(opened, list):
        return opened
    write, spans = opened
    path, text = write.path, write.new or ""
    for skill in skills:
        name, key = skill.card.name, f"{path}#{skill.card.name}"
        section = section_text(skill)
        span = spans.get(name)
        current = text[span[0] : span[1]] if span else None
        if current is not None and current.rstrip("\n") == section:
            write.files.append(PlacedFile(str(path), "unchanged", name))
            continue
        if current is None and key in ledger:
            why = f"section {name!r} was removed since selftaught wrote it; not written again"
            write.files.append(PlacedFile(str(path), "skipped-user-changed", name, reason=why))
            continue
        if current is not None and sha256_text(current) != ledger.get(key):
            why = f"section {name!r} changed since selftaught wrote it; left as it is"
            write.files.append(PlacedFile(str(path), "skipped-user-changed", name, reason=why))
            continue
        new = with_section(text, name, section, str(path))
        write.files.append(PlacedFile(str(path), "written", name, diff=_diff(text, new, path)))
        text = new
        spans = section_spans(text, str(path))
        start, end = spans[name]
        write.records[key] = sha256_text(text[start:end])
    write.new = text
    return write


def place_skills(
    skills: Sequence[SkillFile],
    target: PlacementTarget,
    *,
    read: Sequence[StartingDocument] = (),
    home: Path | None = None,
) -> PlacementResult:
    """Write `skills` where `target`'s agent reads them (see the module doc). A skill that is
    not text only, a symlink (without `follow_symlinks`) or a file whose markers are not well
    formed is `refused`; a file changed since selftaught wrote it or the caller read it
    (`read`: the starting documents it read) is `skipped-user-changed`; the others are
    written atomically, after a backup (`PlacementResult.backup`, for `restore_placement`)."""
    if target.kind != "codex-global" and not target.root.is_dir():
        raise PlacementError(f"{target.root} is not a folder (give the repository's folder)")
    names = [s.card.name for s in skills]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise PlacementError(f"two skills share a name: {', '.join(dup)}; nothing was written")
    files: list[PlacedFile] = []
    ok: list[SkillFile] = []
    for skill in skills:
        problem = text_only_problem(skill)
        if problem is None:
            ok.append(skill)
        else:
            files.append(PlacedFile(str(target.skill_path(skill.card.name)), "refused",
                                    skill.card.name, reason=problem))  # fmt: skip
    state = placements_dir(home)
    shas = _read_shas(read)
    with _locked(state) as ledger:
        writes: list[_Write] = []
        if target.kind == "agents-md":
            planned = _plan_agents_md(ok, target, ledger)
            plans: list[_Write | PlacedFile] = (
                [planned] if isinstance(planned, _Write) else list(planned)
            )
        else:
            plans = [_plan_skill_file(skill, target, ledger, shas) for skill in ok]
        for plan in plans:
            if isinstance(plan, _Write):
                writes.append(plan)
            else:
                files.append(plan)
        done, backup = _commit(writes, ledger, state, f"place-{target.kind}")
    return PlacementResult(target, tuple(files + done), backup)


def _plan_unplace_file(
    name: str, target: PlacementTarget, ledger: Mapping[str, str]
) -> _Write | PlacedFile:
    """Removing one SKILL.md: only while it is still what selftaught wrote."""
    shown = target.skill_path(name)
    path, why = _checked_path(shown, target.root, target.follow_symlinks)
    if path is None:
        return PlacedFile(str(shown), "refused", name, reason=why)
    try:
        now = _read_now(path)
    except UnicodeDecodeError:
        return PlacedFile(str(path), "refused", name, reason=f"{path} is not UTF-8 text")
    if now is None:
        return PlacedFile(str(path), "unchanged", name)
    why = _user_changed(path, now, ledger, set())
    if why or str(path) not in ledger:
        why = why or "was not written by selftaught; left as it is"
        return PlacedFile(str(path), "skipped-user-changed", name, reason=why)
    done = PlacedFile(str(path), "removed", name, diff=_diff(now, None, path))
    return _Write(path, _below(path, target.root), now, None, {str(path): None}, [done])


def _plan_unplace_sections(
    names: Sequence[str], target: PlacementTarget, ledger: Mapping[str, str]
) -> _Write | list[PlacedFile]:
    """AGENTS.md without the sections `names`, each only while still what selftaught wrote."""
    opened = _open_agents_md(target, names)
    if isinstance(opened, list):
        return opened
    write, spans = opened
    path, text = write.path, write.new or ""
    for name in names:
        span, key = spans.get(name), f"{path}#{name}"
        if span is None:
            write.files.append(PlacedFile(str(path), "unchanged", name))
            continue
        if sha256_text(text[span[0] : span[1]]) != ledger.get(key):
            why = f"section {name!r} changed since selftaught wrote it; left as it is"
            write.files.append(PlacedFile(str(path), "skipped-user-changed", name, reason=why))
            continue
        head, tail = text[: span[0]], text[span[1] :]
        if not tail and head.endswith("\n\n"):  # the blank line `with_section` added
            head = head[:-1]
        new = head + tail
        write.files.append(PlacedFile(str(path), "removed", name, diff=_diff(text, new, path)))
        text, spans = new, section_spans(new, str(path))
        write.records[key] = None
    write.new = text if text or write.old is None else None  # a file that held only them: removed
    return write


def unplace_skills(
    names: Sequence[str], target: PlacementTarget, *, home: Path | None = None
) -> PlacementResult:
    """Take skills `names` away from where `target`'s agent reads them (a rollback to version
    0): each SKILL.md (or AGENTS.md section) is `removed` only while it is still what
    selftaught wrote, else `skipped-user-changed`; a backup as for `place_skills`."""
    if target.kind != "codex-global" and not target.root.is_dir():
        raise PlacementError(f"{target.root} is not a folder (give the repository's folder)")
    state = placements_dir(home)
    with _locked(state) as ledger:
        if target.kind == "agents-md":
            planned = _plan_unplace_sections(names, target, ledger)
            plans: list[_Write | PlacedFile] = (
                [planned] if isinstance(planned, _Write) else list(planned)
            )
        else:
            plans = [_plan_unplace_file(name, target, ledger) for name in names]
        files = [p for p in plans if isinstance(p, PlacedFile)]
        done, backup = _commit([p for p in plans if isinstance(p, _Write)], ledger, state,
                               f"unplace-{target.kind}")  # fmt: skip
    return PlacementResult(target, tuple(files + done), backup)


def adopted_skill_file(project: str, adopted: Adopted) -> SkillFile | None:
    """A project's one adopted skill as a SKILL.md to place (None when nothing is adopted):
    named after the project, its rules, worked examples and memory as the body."""
    skill = split_skill(adopted.skill)
    parts = [skill.rules.strip(), demo_section(skill.demos)]
    if adopted.memory.strip():
        parts.append(f"## Memory\n{adopted.memory.strip()}")
    body = "\n\n".join(p for p in parts if p)
    if not body:
        return None
    card = SkillCard(
        slug_name(project),
        f"Rules selftaught learned from the {project} project's own traffic: follow them for "
        "this project's tasks.",
    )
    return SkillFile(card, body)


# ---- undoing a placement ----------------------------------------------------------------------


def restore_placement(backup: str | Path, *, home: Path | None = None) -> PlacementResult:
    """Put back what a placement (or a write-back) replaced, from its backup folder: each file
    to its previous bytes (removed when it did not exist), only where it is still what that
    placement wrote; a file changed since is `skipped-user-changed`."""
    folder = Path(backup)
    try:
        manifest = read_json(folder / "manifest.json")
    except FileNotFoundError:
        raise PlacementError(f"{folder} is not a placement backup (no manifest.json)") from None
    files: list[PlacedFile] = []
    with _locked(placements_dir(home)) as ledger:
        for row in manifest:
            done = _restore_row(row, folder)
            files.append(done)
            if done.action not in ("written", "removed"):
                continue
            for key, sha in row["ledger_before"].items():
                if sha is None:
                    ledger.pop(key, None)
                else:
                    ledger[key] = sha
    return PlacementResult(None, tuple(files), str(folder))


def _restore_row(row: Mapping[str, Any], folder: Path) -> PlacedFile:
    """One file of a backup put back, below the root it was written in (recorded since round
    five; else its own folder), every component checked again: a symlink on the way or at the
    file is refused and left as it is, as is a root that resolves elsewhere now."""
    path = Path(row["path"])
    root = Path(row.get("root") or path.parent)
    moved = _root_moved(root, str(row.get("root_real") or ""))
    if moved:
        return PlacedFile(str(path), "refused", reason=moved)
    rel = path.relative_to(root).as_posix()
    try:
        with Inside(root) as inside:
            raw = inside.read(rel)
            now = None if raw is None else raw.decode("utf-8", "replace")
            if (None if now is None else sha256_text(now)) != row["sha256_after"]:
                why = "changed since that placement wrote it; left as it is"
                return PlacedFile(str(path), "skipped-user-changed", reason=why)
            old = _read_now(folder / "files" / row["file"]) if row["existed"] else None
            if old is None:
                if now is not None:
                    inside.remove(rel, empty_folder=path.name == SKILL_FILE)
                return PlacedFile(str(path), "removed", diff=_diff(now, None, path))
            inside.replace(rel, old.encode("utf-8"))  # a removed skill's folder made again
            return PlacedFile(str(path), "written", diff=_diff(now, old, path))
    except (PathRefused, FileNotFoundError) as err:
        why = str(err) if isinstance(err, PathRefused) else f"{root} is gone"
        return PlacedFile(str(path), "refused", reason=f"{why}; left as it is")


def _root_moved(root: Path, real: str) -> str:
    """Why `root` is no longer the folder that was read or written ("" when it is): it
    resolves elsewhere now (the folder, or a link above it, was replaced)."""
    now = os.path.realpath(root)
    if not real or now == real:
        return ""
    return f"refused: {root} now resolves to {now}, not {real} as when it was read"


# ---- the user's own files -----------------------------------------------------------------------

_DOCUMENTS: tuple[tuple[str, DocumentKind], ...] = (
    ("CLAUDE.md", "claude-md"),
    (".claude/CLAUDE.md", "claude-md"),
    (AGENTS_MD, "agents-md"),
    (f"{CLAUDE_SKILLS}/*/{SKILL_FILE}", "claude-skill"),
    (f"{CODEX_SKILLS}/*/{SKILL_FILE}", "codex-skill"),
    (f"{CODEX_OTHER_SKILLS}/*/{SKILL_FILE}", "codex-skill"),
)


def _read_document(path: Path, kind: DocumentKind, root: Path, follow: bool) -> StartingDocument:
    real, why = _checked_path(path, root, follow)
    if real is None:
        return StartingDocument(path, kind, "", "", problem=why, root=root)
    root = _below(real, root)
    doc = StartingDocument(real, kind, "", "", root=root, root_real=os.path.realpath(root))
    try:
        text = real.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        return dataclasses.replace(doc, problem=f"not UTF-8 text ({err.reason})")
    except OSError as err:  # a dangling symlink, a file that went away
        return dataclasses.replace(doc, problem=f"cannot be read ({err.strerror})")
    skill, problem = None, None
    if kind in ("claude-skill", "codex-skill"):
        try:
            skill = parse_skill_md(text, str(real))
        except SkillFileError as err:
            problem = str(err)
    return dataclasses.replace(
        doc, text=text, sha256=sha256_text(text), skill=skill, problem=problem
    )


def read_starting_documents(
    repo: str | Path, *, follow_symlinks: bool = False
) -> list[StartingDocument]:
    """The user's own instruction files in `repo`: CLAUDE.md (and .claude/CLAUDE.md), AGENTS.md,
    and every SKILL.md under .claude/skills, .agents/skills and .codex/skills, each with its
    text and sha256 as read. A file that cannot be used is there with its `problem` (a symlink
    without `follow_symlinks`, not UTF-8, a SKILL.md without name or description)."""
    root = Path(os.path.abspath(Path(repo).expanduser()))
    if not root.is_dir():
        raise PlacementError(f"{root} is not a folder")
    out: list[StartingDocument] = []
    for pattern, kind in _DOCUMENTS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() or path.is_symlink():
                out.append(_read_document(path, kind, root, follow_symlinks))
    return out


def document_kind(path: Path) -> DocumentKind:
    """A file's kind by its name (and, for a SKILL.md, its folder)."""
    if path.name == SKILL_FILE:
        codex = path.parent.parent.parent.name in (".agents", ".codex")
        return "codex-skill" if codex else "claude-skill"
    kinds: dict[str, DocumentKind] = {"CLAUDE.md": "claude-md", AGENTS_MD: "agents-md"}
    return kinds.get(path.name, "markdown")


def document_root(path: Path) -> Path:
    """The repository a user's file is in: the nearest folder above it holding `.git`, else
    the folder holding the agent folder it is in (`.claude`, `.agents`, `.codex`), else its
    own folder. Every component from there to the file is checked for symlinks when it is
    read and again when it is written."""
    for folder in path.parents:
        if os.path.lexists(folder / ".git"):
            return folder
    for folder in path.parents:
        if folder.name in (".claude", ".agents", ".codex"):
            return folder.parent
    return path.parent


def read_document(
    path: str | Path, *, follow_symlinks: bool = False, root: Path | None = None
) -> StartingDocument:
    """One file of the user's as a starting document (`sleep run --start-document`,
    `optimize --write-back`): its text and sha256 as read, or its `problem`; read below
    `root` (default: `document_root`), no symlink on the way unless `follow_symlinks`."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    if not path.is_file() and not path.is_symlink():
        raise PlacementError(f"{path} is not a file")
    root = Path(os.path.abspath(root)) if root is not None else document_root(path)
    return _read_document(path, document_kind(path), root, follow_symlinks)


def start_problem(doc: StartingDocument) -> str | None:
    """Why `doc` cannot be the whole starting text of a skill (None: it can): it was not read,
    or it holds selftaught's marked block or sections (a --target-skill-path or agents-md
    file), which a skill may not hold."""
    if not doc.usable:
        return f"{doc.path} cannot be used: {doc.problem}"
    if _marker_lines(doc.text):
        return (
            f"{doc.path} holds selftaught's marked block or skill sections (it is a "
            "--target-skill-path or --place agents-md file); start from a file without them"
        )
    return None


def _marker_lines(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if find_marker(line) is not None or _SECTION_LIKE.search(line)
    ]


def edit_problem(doc: StartingDocument, text: str) -> str | None:
    """Why `text` may not replace `doc` (None: it may): an edit keeps a SKILL.md's name and its
    other front matter as the user wrote them, adds no front-matter fence to its body, and
    leaves every selftaught marker line of a file as it was."""
    if not doc.usable:
        return f"{doc.path} was not read ({doc.problem})"
    if _marker_lines(text) != _marker_lines(doc.text):
        return f"the edit of {doc.path} adds, removes or changes selftaught marker lines"
    if doc.skill is None:
        return None
    try:
        new = parse_skill_md(text, str(doc.path))
    except SkillFileError as err:
        return str(err)
    if new.card.name != doc.skill.card.name or new.extra != doc.skill.extra:
        return f"the edit of {doc.path} changes its front matter beyond the description"
    fences = [ln for ln in new.body.split("\n") if ln.strip() == FENCE]
    if len(fences) > len([ln for ln in doc.skill.body.split("\n") if ln.strip() == FENCE]):
        return f"the edit of {doc.path} adds a front-matter fence ('---') to its body"
    return None


def _plan_edit(edit: DocumentEdit, follow: bool) -> _Write | PlacedFile:
    doc = edit.document
    path = Path(os.path.abspath(doc.path))
    root = Path(os.path.abspath(doc.root)) if doc.root is not None else document_root(path)
    moved = _root_moved(root, doc.root_real)
    if moved:
        return PlacedFile(str(path), "refused", reason=moved)
    real, why = _checked_path(path, root, follow)
    if real is None:
        return PlacedFile(str(path), "refused", reason=why)
    problem = edit_problem(doc, edit.text)
    if problem is not None:
        return PlacedFile(str(path), "refused", reason=problem)
    try:
        now = _read_now(real)
    except UnicodeDecodeError:
        now = "\udcff"  # not what was read
    if now is None or sha256_text(now) != doc.sha256:
        why = "changed since it was read; left as it is (read it again to edit it)"
        return PlacedFile(str(real), "skipped-user-changed", reason=why)
    if edit.text == now:
        return PlacedFile(str(real), "unchanged")
    done = PlacedFile(str(real), "written", diff=_diff(now, edit.text, real))
    return _Write(real, _below(real, root), now, edit.text, {str(real): sha256_text(edit.text)},
                  [done])  # fmt: skip


def write_documents(
    edits: Sequence[DocumentEdit], *, home: Path | None = None, follow_symlinks: bool = False
) -> PlacementResult:
    """Write the caller's edits of starting documents back: each file only when it is still
    what was read (else `skipped-user-changed`, the others written), each edit within its
    bounds (`edit_problem`, else `refused`), atomically after a backup, with its diff."""
    paths = [str(Path(os.path.abspath(e.document.path))) for e in edits]
    if len(set(paths)) != len(paths):
        raise PlacementError("two edits of one file; nothing was written")
    state = placements_dir(home)
    with _locked(state) as ledger:
        plans = [_plan_edit(e, follow_symlinks) for e in edits]
        files = [p for p in plans if isinstance(p, PlacedFile)]
        writes = [p for p in plans if isinstance(p, _Write)]
        done, backup = _commit(writes, ledger, state, "edit")
    return PlacementResult(None, tuple(files + done), backup)
