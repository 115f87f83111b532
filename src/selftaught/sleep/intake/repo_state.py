"""The repository a coding agent's session worked in: its commit and uncommitted changes, at
the session's start and at its end, so a night can rebuild both (`night/agent_outcome.py`).

    <home>/sessions/<session id>/start.json   the first record (never replaced)
    <home>/sessions/<session id>/end.json     the newest record (an older one never wins)

Each is a `RepoState`: the repository's root, the session's folder in it, the HEAD commit,
and `git diff HEAD` of every tracked and untracked file git does not ignore, as a binary
patch, at a time. Left out, by name in `left_out`: ignored files (git's own rules), credential
files (`selftaught.credential_files`: `.env`, `*.pem`, `.aws/credentials`,
`.docker/config.json`, `.vault-token`, `.kube/config`, `*.tfvars`, `.netrc`, `.pgpass`, ... by
name; any file holding a private key, by content), and untracked files over `MAX_FILE_BYTES`.
Changes over `MAX_DIFF_BYTES` in all are not kept (`complete` False, `why` says so). The patch
is redacted like everything stored (`selftaught.redact`); a patch a redaction changed may no
longer apply, and the night then says so.

Written by the session hooks (`hooks.py`): Claude Code's `SessionStart` records the start and
its `SessionEnd` the end; Codex has no session-start hook, so its first `notify` (after the
first turn) records the start and every `notify` the end. Reading the repository writes
nothing to it (no index refresh, no object written: untracked files are diffed with
`git diff --no-index`); git's external diff and textconv drivers are not run.

`materialise` rebuilds a state in an empty folder: the commit's files read from the
repository (`git ls-tree` / `git cat-file`, never checked out there, `.env`-like files left
out) and the patch applied with `git apply`. Every file is created relative to its folder
with no symlink followed, and a tree whose paths collide (a link `d` and a file `d/f`, a path
twice) is refused whole: a hostile commit cannot make the rebuild write outside its folder.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from selftaught.credential_files import PATTERNS, credential_file, holds_private_key
from selftaught.errors import InputError
from selftaught.runs import Inside, PathRefused, atomic_write_json, private_dirs
from selftaught.sleep.intake.sessions import check_session_id

SESSIONS_DIR = "sessions"
MAX_FILE_BYTES = 512 * 1024
MAX_DIFF_BYTES = 4 * 1024 * 1024
MAX_UNTRACKED = 1000
GIT_TIMEOUT_S = 20.0


class RepoStateError(InputError):
    """The folder is not a git repository with a commit, or git failed."""


@dataclass
class RepoState:
    root: str  # the repository's top folder
    cwd: str  # the session's folder, relative to `root` ("." for the top)
    commit: str
    diff: str  # `git diff --binary HEAD` of what git does not ignore, redacted
    at: float
    left_out: list[str] = field(default_factory=list)
    redactions: int = 0
    complete: bool = True
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepoState:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class SessionRecord:
    session_id: str
    start: RepoState | None = None
    end: RepoState | None = None


# ---- git ------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


def _git(root: Path, *args: str, ok: tuple[int, ...] = (0,), text: bool = True) -> Any:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "-c", "core.quotepath=off", *args],
            capture_output=True,
            text=text,
            env=_env(),
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise RepoStateError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise RepoStateError(f"git {args[0]} took over {GIT_TIMEOUT_S:g}s in {root}") from None
    if done.returncode not in ok:
        err = done.stderr if text else done.stderr.decode("utf-8", "replace")
        raise RepoStateError(f"git {args[0]} failed in {root}: {err.strip()[:200]}")
    return done.stdout


def secret_file(path: str) -> bool:
    """A credential file by its name (`credential_files.CREDENTIAL_FILES`)."""
    return credential_file(path)


def _excludes(also: Sequence[str] = ()) -> list[str]:
    return [f":(exclude,glob,icase)**/{pattern}" for pattern in PATTERNS] + [
        f":(exclude,literal){rel}" for rel in also
    ]


def _holds_key(full: Path) -> bool:
    """A regular file (a link is not followed) of at most MAX_FILE_BYTES holding a private
    key."""
    try:
        st = full.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        return False
    try:
        return holds_private_key(full.read_bytes())
    except OSError:
        return False


def _untracked(root: Path) -> list[str]:
    out = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".")
    return [p for p in out.split("\0") if p]


def capture(folder: Path, redactor: Any = None) -> RepoState:
    """The state of the repository holding `folder` (see the module docstring)."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise RepoStateError(f"{folder} is not a folder")
    root = Path(_git(folder, "rev-parse", "--show-toplevel").strip())
    commit = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", ok=(0, 1)).strip()
    if not commit:
        raise RepoStateError(f"the repository {root} has no commit yet")
    flags = ("--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")
    changed = [p for p in _git(root, "diff", "--name-only", "-z", "HEAD").split("\0") if p]
    left = [p for p in changed if secret_file(p)]
    keys = [p for p in changed if p not in left and _holds_key(root / p)]
    tracked = _git(root, "diff", *flags, "HEAD", "--", ".", *_excludes(keys))
    left += keys
    parts, size = [tracked], len(tracked)
    state = RepoState(str(root), os.path.relpath(folder, root), commit, "", time.time())
    untracked = _untracked(root)
    if len(untracked) > MAX_UNTRACKED:
        state.complete, state.why = False, f"more than {MAX_UNTRACKED} untracked files"
        untracked = []
    for rel in untracked:
        full = root / rel
        big = full.is_file() and not full.is_symlink() and full.stat().st_size > MAX_FILE_BYTES
        if secret_file(rel) or big or _holds_key(full):
            left.append(rel)
            continue
        patch = _git(root, "diff", "--no-index", *flags, "--", "/dev/null", rel, ok=(0, 1))
        size += len(patch)
        if size > MAX_DIFF_BYTES:
            break
        parts.append(patch)
    if size > MAX_DIFF_BYTES:
        state.complete = False
        state.why = f"the uncommitted changes are over {MAX_DIFF_BYTES // 2**20} MiB"
        parts = []
    diff = "".join(parts)
    if redactor is None:
        from selftaught.redact import default_redactor

        redactor = default_redactor()
    deadline = redactor.deadline()  # one budget for all the record stores
    state.diff, state.redactions = redactor.redact(diff, deadline)
    state.left_out = sorted({redactor.redact(rel, deadline)[0] for rel in left})
    return state


# ---- the records ----------------------------------------------------------------------------


def record_dir(session_id: str, home: Path) -> Path:
    return Path(home) / SESSIONS_DIR / check_session_id(session_id)


def _write_new(path: Path, data: dict[str, Any]) -> bool:
    """Write `path` only when it does not exist yet (the first writer wins)."""
    private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False) + "\n")
    return True


def record_start(session_id: str, folder: Path, home: Path) -> RepoState | None:
    """Record the session's start; None when it was recorded before (a resumed session)."""
    path = record_dir(session_id, home) / "start.json"
    if path.exists():
        return None
    state = capture(folder)
    return state if _write_new(path, state.to_dict()) else None


def record_end(session_id: str, folder: Path, home: Path) -> RepoState:
    """Record the session's state now as its end (an end recorded later is kept)."""
    state = capture(folder)
    path = record_dir(session_id, home) / "end.json"
    before = _read(path)
    if before is None or before.at <= state.at:
        atomic_write_json(path, state.to_dict())
    return state


def _read(path: Path) -> RepoState | None:
    try:
        return RepoState.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def load_record(session_id: str, home: Path) -> SessionRecord | None:
    """The session's records, or None when it has none (or an id that names no file)."""
    try:
        folder = record_dir(session_id, home)
    except InputError:
        return None
    start, end = _read(folder / "start.json"), _read(folder / "end.json")
    if start is None and end is None:
        return None
    return SessionRecord(session_id, start, end)


# ---- rebuilding a state ---------------------------------------------------------------------


def _safe(rel: str) -> bool:
    parts = rel.split("/")
    return not any(p in ("", ".", "..") or p.lower() == ".git" for p in parts)


def _collision(paths: list[str]) -> str | None:
    """A path of the listing that is there twice, or that is both a file (or link) and a
    folder of another: git never writes such a tree, a hostile one does (a link `d` to a
    folder outside, then `d/file`)."""
    files: set[str] = set()
    folders: set[str] = set()
    for rel in paths:
        if rel in files or rel in folders:
            return rel
        files.add(rel)
        parts = rel.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return next((f for f in folders if f in files), None)


def _listing(root: Path, commit: str) -> list[tuple[str, str, str]]:
    """(mode, sha, path) of the commit's blobs and links to rebuild: a tree whose paths
    collide is refused whole; `.git`, `..` and credential files (by name) are left out."""
    listing = _git(root, "ls-tree", "-r", "-z", "--full-tree", commit)
    entries = []
    for line in listing.split("\0"):
        if not line:
            continue
        info, rel = line.split("\t", 1)
        mode, kind, sha = info.split()
        if kind == "blob":
            entries.append((mode, sha, rel))
    clash = _collision([rel for _, _, rel in entries])
    if clash is not None:
        raise RepoStateError(
            f"commit {commit[:12]} of {root} refused: {clash!r} is both a file and a folder, "
            "or is there twice (a tree git itself never writes)"
        )
    return [e for e in entries if _safe(e[2]) and not secret_file(e[2])]


def _write_tree(root: Path, commit: str, target: Path, max_bytes: int) -> None:
    """The commit's files into `target`, read from the object store (nothing checked out);
    every file is created relative to its folder with no symlink followed (`runs.Inside`),
    so a link of the commit is written as a link and never written through."""
    entries = _listing(root, commit)
    batch = "".join(f"{sha}\n" for _, sha, _ in entries).encode()
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "cat-file", "--batch"],
            input=batch,
            capture_output=True,
            env=_env(),
            timeout=GIT_TIMEOUT_S * 3,
        )
    except subprocess.TimeoutExpired:
        raise RepoStateError(f"reading commit {commit[:12]} of {root} took too long") from None
    data, pos, total = done.stdout, 0, 0
    with Inside(target) as inside:
        for mode, _sha, rel in entries:
            header_end = data.index(b"\n", pos)
            size = int(data[pos:header_end].split()[2])
            body = data[header_end + 1 : header_end + 1 + size]
            pos = header_end + 1 + size + 1
            total += size
            if total > max_bytes:
                raise RepoStateError(f"commit {commit[:12]} holds over {max_bytes // 2**20} MiB")
            try:
                if mode == "120000":
                    inside.symlink(rel, body.decode("utf-8", "replace"))
                elif not holds_private_key(body):
                    inside.create(rel, body, executable=mode == "100755")
            except PathRefused as err:
                raise RepoStateError(f"commit {commit[:12]} of {root} refused: {err}") from None


def materialise(state: RepoState, target: Path, max_bytes: int) -> None:
    """Rebuild `state` in the empty folder `target` (raises RepoStateError when the commit is
    gone, the patch does not apply, or the files exceed `max_bytes`)."""
    root = Path(state.root)
    if not root.is_dir():
        raise RepoStateError(f"the repository {root} is gone")
    if not state.complete:
        raise RepoStateError(state.why or "the record is incomplete")
    _git(root, "cat-file", "-e", f"{state.commit}^{{commit}}")
    target.mkdir(parents=True, exist_ok=True)  # a temporary folder: outside the home
    _write_tree(root, state.commit, target, max_bytes)
    if not state.diff.strip():
        return
    with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as f:
        f.write(state.diff)
    env = {**_env(), "GIT_CEILING_DIRECTORIES": str(target.parent)}
    try:
        done = subprocess.run(
            ["git", "apply", "--binary", "--whitespace=nowarn", f.name],
            cwd=target,
            capture_output=True,
            text=True,
            env=env,
            timeout=GIT_TIMEOUT_S,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[:1]
        redacted = " (a redaction changed it)" if state.redactions else ""
        raise RepoStateError(f"the recorded changes do not apply{redacted}: {why}")
