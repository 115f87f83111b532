"""The folder a coding agent works in for one rollout, and what changed in it.

A `Workspace` is a fresh temporary folder: empty, or a copy of a source folder (a task line's
`workspace`, or `SELFTAUGHT_AGENT_WORKSPACE`). The rollout makes one per attempt when the task
needs the files afterwards (a line with a `check` scores the folder, not the reply) and hands
it to the model through `using_workspace`; a CLI agent (`selftaught.models.agents`) works in
the one it is handed, or makes its own. Chat models ignore it, so a check then runs on the
untouched copy.

Symlinks are copied as links, never followed: a link in the source that points outside it
does not bring the outside in."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

_CURRENT: ContextVar[Workspace | None] = ContextVar("selftaught_workspace", default=None)

TEXT_BYTES = 256 * 1024  # files up to this size keep their text in a snapshot (line counts)
SNAPSHOT_TEXT_BYTES = 16 * 1024 * 1024  # all kept text of one snapshot, at most
MAX_CHANGE_LINES = 100  # lines of a diff summary, then "... and N more"


@dataclass(frozen=True)
class WorkspaceSpec:
    """What a task asks for one example: a folder to work in, a copy of `source` (None:
    empty)."""

    source: Path | None = None


@dataclass
class Workspace:
    """A temporary folder for one attempt: `path`, filled from `source` (None: empty)."""

    path: Path
    source: Path | None = None

    @classmethod
    def create(cls, source: Path | None = None) -> Workspace:
        workspace = cls(Path(tempfile.mkdtemp(prefix="selftaught-ws-")), source)
        workspace._fill()
        return workspace

    def _fill(self) -> None:
        if self.source is not None:
            shutil.copytree(self.source, self.path, symlinks=True, dirs_exist_ok=True)

    def reset(self) -> None:
        """Back to the state it was created in (a retried attempt starts clean)."""
        for child in self.path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        self._fill()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def current_workspace() -> Workspace | None:
    """The workspace the running rollout handed to the model (None: none)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using_workspace(workspace: Workspace) -> Iterator[Workspace]:
    """Hand `workspace` to the model calls made inside the block (and the tasks they start)."""
    token = _CURRENT.set(workspace)
    try:
        yield workspace
    finally:
        _CURRENT.reset(token)


def folder_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if not os.path.islink(path):
                    total += os.lstat(path).st_size
    return total


# ---- what changed -----------------------------------------------------------------------


@dataclass(frozen=True)
class FileState:
    digest: str
    text: str | None = None  # kept for small text files, to count changed lines


Snapshot = dict[str, FileState]


def entries(root: Path) -> Iterator[tuple[str, str]]:
    """(full path, path relative to `root`) of every file and link under `root`, in order;
    links to folders are listed, not followed."""
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        links = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
        for name in sorted(files + links):
            full = os.path.join(dirpath, name)
            yield full, os.path.relpath(full, root)


def snapshot(root: Path) -> Snapshot:
    """Every file under `root` (relative path -> its state); a link is its target."""
    out: Snapshot = {}
    kept = 0
    for full, rel in entries(root):
        if os.path.islink(full):
            out[rel] = FileState("link:" + os.readlink(full))
            continue
        try:
            data = Path(full).read_bytes()
        except OSError:
            continue
        text = None
        if len(data) <= TEXT_BYTES and kept + len(data) <= SNAPSHOT_TEXT_BYTES:
            with contextlib.suppress(UnicodeDecodeError):
                text = data.decode("utf-8")
                kept += len(data)
        out[rel] = FileState(hashlib.sha256(data).hexdigest(), text)
    return out


def _lines(text: str | None) -> list[str]:
    return [] if not text else text.splitlines()


def _counts(before: FileState | None, after: FileState | None) -> str:
    """' (+a -d)' in changed lines, or ' (binary)' when either side has no text."""
    texts = [s.text for s in (before, after) if s is not None]
    if any(t is None for t in texts):
        return " (binary)"
    added = deleted = 0
    for line in difflib.unified_diff(
        _lines(before.text if before else None), _lines(after.text if after else None)
    ):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            deleted += 1
    parts = ([f"+{added}"] if added or after else []) + ([f"-{deleted}"] if deleted else [])
    return f" ({' '.join(parts)})" if parts else ""


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed from `before` to `after`, one line a file: 'A path (+n)', 'M path (+a -d)',
    'D path (-n)', cut after MAX_CHANGE_LINES."""
    out = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old is not None and new is not None and old.digest == new.digest:
            continue
        kind = "A" if old is None else "D" if new is None else "M"
        out.append(f"{kind} {rel}{_counts(old, new)}")
    if len(out) > MAX_CHANGE_LINES:
        out = out[:MAX_CHANGE_LINES] + [f"... and {len(out) - MAX_CHANGE_LINES} more"]
    return out
