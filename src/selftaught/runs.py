"""Run directory: atomic writes, append-only history.jsonl, resume state.

Every file is written to a temp file and renamed into place, so a kill at any moment leaves
either the old or the new version. `history.jsonl` rows carry a `step` number; on resume a
torn last line is dropped and rows past the last completed step are never duplicated.

What this module creates is private whatever the umask: a new file 0600, a new folder 0700
(`private_dirs`), an append-only log 0600 (`open_private_append`); `make_private` takes group
and other bits off a tree that something else wrote (a peft adapter, a folder made earlier).

`Inside` writes below a folder that others may have changed (a user's repository, a tree
rebuilt from a commit): every component under it is opened relative to the one before with
O_NOFOLLOW, so a symlink anywhere below the folder is refused (`PathRefused`), never followed,
even one swapped in between a check and the write."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

from selftaught.errors import ConfigError, InputError, writing_to
from selftaught.errors import RunError as RunError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


ENV_HOME = "SELFTAUGHT_HOME"


def sleep_home() -> Path:
    """$SELFTAUGHT_HOME, else ~/.local/share/selftaught: sleep's state (the log, adopted
    skills) and the redaction patterns; here, below every package, so that anything may ask."""
    env = os.environ.get(ENV_HOME)
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "selftaught"


def slug(text: str) -> str:
    """A file-name-safe form of a task or run name (`gym:basic_arithmetic?max_terms=2` →
    `gym-basic_arithmetic_max_terms_2`), deterministic so that re-running resumes."""
    return _UNSAFE.sub("_", text.replace(":", "-")).strip("_")[:80] or "run"


def private_dirs(path: str | Path) -> Path:
    """Create the folder `path` and its missing parents, each 0700 (folders that exist are
    left as they are); returns it."""
    target = Path(path)
    missing, folder = [], target
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            continue
        os.chmod(folder, 0o700)  # whatever the umask
    if not target.is_dir():  # a file where the folder should be: the OS error mkdir gives
        target.mkdir(mode=0o700)
    return target


def open_private_append(path: str | Path) -> Any:
    """`path` opened to append text, created 0600 (its parents 0700) and made 0600 when it was
    not: for logs that grow line by line (a night's evidence, a project's events)."""
    path = Path(path)
    private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def make_private(root: str | Path) -> None:
    """Take group and other bits off `root` and everything under it (symlinks not followed)."""
    root = Path(root)
    paths = [root]
    for folder, dirs, files in os.walk(root):
        paths += [Path(folder, n) for n in dirs + files]
    for path in paths:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename. A file that exists keeps
    its permission bits (a user's AGENTS.md stays 0644); a new one is private (0600), and so
    are the folders made for it (0700)."""
    path = Path(path)
    private_dirs(path.parent)
    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite(value: Any) -> Any:
    """`value` with every float JSON has no spelling for (NaN, ±Infinity) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **options: Any) -> str:
    """JSON that every parser reads, for what a command prints or exports: a NaN or an
    infinity (a row stored before scores were checked, a number in `meta`) is written null,
    never the `NaN` / `-Infinity` Python's json writes by default."""
    options = {"ensure_ascii": False, "default": str, **options}
    return json.dumps(finite(value), allow_nan=False, **options)


class PathRefused(InputError):
    """A path below a folder runs through a symlink, is one, or collides with what is there
    (a file where a folder should be, a name written twice); nothing was written there."""


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def path_parts(rel: str | PurePosixPath) -> tuple[str, ...]:
    """The components of a relative path; an absolute one, or one holding `..`, `.` or an
    empty component, is refused."""
    text = str(rel)
    parts = tuple(text.split("/"))
    if not text or text.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PathRefused(f"{text!r} is not a plain relative path")
    return parts


class Inside:
    """A folder to read and write below without following any symlink (see the module doc).
    `root` itself is the caller's and may be a link; each folder opened below it is kept open
    until the block ends. Paths are relative, '/'-separated (`path_parts`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._fds: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> Inside:
        self._fds[()] = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _shown(self, parts: tuple[str, ...]) -> str:
        return str(self.root.joinpath(*parts))

    def _refuse(self, parts: tuple[str, ...], fd: int, name: str) -> PathRefused:
        """Why `name` in the folder `fd` cannot be opened as a folder."""
        shown = self._shown(parts)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return PathRefused(f"{shown} cannot be opened")
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=fd)
            return PathRefused(f"{shown} is a symlink (to {target}); refused, not followed")
        return PathRefused(f"{shown} is a file where a folder should be; refused")

    def folder(
        self, parts: tuple[str, ...], *, create: bool = False, mode: int | None = None
    ) -> int:
        """The fd of folder `parts`, each component opened with O_NOFOLLOW (`create`: made when
        missing, `mode` then set whatever the umask); FileNotFoundError when one is missing."""
        if parts in self._fds:
            return self._fds[parts]
        parent, name = self.folder(parts[:-1], create=create, mode=mode), parts[-1]
        if create:
            try:
                os.mkdir(name, 0o777 if mode is None else mode, dir_fd=parent)
                if mode is not None:
                    os.chmod(name, mode, dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _FOLDER, dir_fd=parent)
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise
            raise self._refuse(parts, parent, name) from None
        self._fds[parts] = fd
        return fd

    def lstat(self, rel: str) -> os.stat_result | None:
        """What is at `rel` (a symlink as itself), None when nothing is; a symlink or a file
        on the way there is refused."""
        parts = path_parts(rel)
        try:
            return os.stat(parts[-1], dir_fd=self.folder(parts[:-1]), follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _file(self, rel: str) -> tuple[int, str, os.stat_result | None]:
        """(its folder's fd, its name, what is there now); a symlink there is refused."""
        parts = path_parts(rel)
        fd = self.folder(parts[:-1])
        try:
            st: os.stat_result | None = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            target = os.readlink(parts[-1], dir_fd=fd)
            raise PathRefused(f"{self._shown(parts)} is a symlink (to {target}); refused")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{self._shown(parts)} is not a file; refused")
        return fd, parts[-1], st

    def read(self, rel: str) -> bytes | None:
        """The bytes of file `rel` (None: it or a folder on the way is missing); a symlink, at
        it or on the way, is refused."""
        try:
            fd, name, st = self._file(rel)
            if st is None:
                return None
            file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise PathRefused(f"{self.root / rel} is a symlink; refused") from None
        with os.fdopen(file, "rb") as f:
            return f.read()

    def create(self, rel: str, data: bytes, *, executable: bool = False) -> None:
        """A new file `rel`, its missing folders made (the umask applies, as for a checkout);
        a name that is there already is refused (two paths of one tree meeting)."""
        parts = path_parts(rel)
        fd = self.folder(parts[:-1], create=True)
        try:
            file = os.open(parts[-1], _NEW_FILE, 0o666, dir_fd=fd)
        except FileExistsError:
            raise PathRefused(f"{self._shown(parts)} is written twice; refused") from None
        with os.fdopen(file, "wb") as f:
            f.write(data)
            if executable:
                os.fchmod(f.fileno(), stat.S_IMODE(os.fstat(f.fileno()).st_mode) | 0o111)

    def symlink(self, rel: str, target: str) -> None:
        """A new symlink `rel` -> `target` (never followed here); a name there already is
        refused."""
        parts = path_parts(rel)
        fd = self.folder(parts[:-1], create=True)
        try:
            os.symlink(target, parts[-1], dir_fd=fd)
        except FileExistsError:
            raise PathRefused(f"{self._shown(parts)} is written twice; refused") from None

    def replace(self, rel: str, data: bytes) -> None:
        """`rel` atomically replaced by `data` (a temp file in its folder, then a rename): an
        existing file keeps its mode, a new one is 0600 and its new folders 0700 (as
        `atomic_write_text`); a symlink at `rel` is refused, not replaced."""
        parts = path_parts(rel)
        self.folder(parts[:-1], create=True, mode=0o700)
        fd, name, st = self._file(rel)
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o600
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        file = os.open(tmp, _NEW_FILE, 0o600, dir_fd=fd)
        try:
            with os.fdopen(file, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise

    def remove(self, rel: str, *, empty_folder: bool = False) -> None:
        """Delete file `rel` (a symlink there is refused); `empty_folder`: its folder too, when
        that leaves it empty."""
        fd, name, st = self._file(rel)
        if st is not None:
            os.unlink(name, dir_fd=fd)
        parts = path_parts(rel)
        if empty_folder and len(parts) > 1:
            with contextlib.suppress(OSError):
                os.rmdir(parts[-2], dir_fd=self.folder(parts[:-2]))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(
        path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    )


def read_json(path: str | Path) -> Any:
    """A JSON file's value; a file that is not JSON (torn, edited by hand) is a `RunError`
    naming it. A missing file stays `FileNotFoundError`: callers check for it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunError(f"{path} is not valid JSON ({err})") from None


def jsonl_rows(
    lines: Iterable[bytes | str], where: str | Path, error: type[Exception] = RunError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL text. A line that is not
    UTF-8, not JSON or not a JSON object raises `error`, naming `where` and the line: the one
    rule for every JSONL the project reads (tasks, imports, runs, reports)."""
    for lineno, raw in enumerate(lines, 1):
        at = f"{where}:{lineno}"
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as err:
            raise error(f"{at}: not UTF-8 text ({err.reason})") from err
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{at}: malformed JSON ({err.msg}, column {err.colno})") from err
        if not isinstance(row, dict):
            raise error(f"{at}: expected a JSON object, got {type(row).__name__}")
        yield lineno, row


def iter_jsonl(
    path: str | Path, error: type[Exception] = RunError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each row of a JSONL file (see `jsonl_rows`); a file that
    cannot be opened is an `error` naming it."""
    try:
        f = open(path, "rb")  # noqa: SIM115  (closed below; the open alone is guarded)
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from None
    with f:
        yield from jsonl_rows(f, path, error)


def _canonical(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def with_missing(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`saved` with the keys it lacks (at any depth) taken from `defaults`."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = with_missing(out[key], value)
    return out


class RunDir:
    """A directory holding everything a run produced and everything needed to resume it."""

    def __init__(self, root: str | Path, *, make: bool = True):
        self.root = Path(root)
        if make:  # else its owner makes it (a night: under its lock, and only once)
            with writing_to(self.root, "the run directory"):
                private_dirs(self.root)
        self.history_path = self.root / "history.jsonl"
        self.state_path = self.root / "state.json"
        self.config_path = self.root / "config.json"

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    # config -------------------------------------------------------------
    def check_or_write_config(
        self,
        config: dict[str, Any],
        *,
        ignore: Collection[str] = frozenset(),
        defaults: dict[str, Any] | None = None,
    ) -> bool:
        """Write config on a new run; on resume refuse a config that changed (except `ignore`).
        A setting the saved config lacks (it was added since) reads as its value in
        `defaults`, so a run saved by an older version resumes when the new setting is at
        its default. Returns True when resuming."""
        if not self.config_path.exists():
            atomic_write_json(self.config_path, config)
            return False
        old = with_missing(read_json(self.config_path), defaults or {})
        changed = sorted(
            k
            for k in set(old) | set(config)
            if k not in ignore and _canonical(old.get(k)) != _canonical(config.get(k))
        )
        if changed:
            raise ConfigError(
                f"{self.root} holds a run with a different config ({', '.join(changed)}); "
                "use another --output directory or the same settings to resume"
            )
        return True

    # state ----------------------------------------------------------------
    def load_state(self) -> dict[str, Any] | None:
        return read_json(self.state_path) if self.state_path.exists() else None

    def save_state(self, state: dict[str, Any]) -> None:
        atomic_write_json(self.state_path, state)

    # history --------------------------------------------------------------
    def history(self) -> list[dict[str, Any]]:
        if not self.history_path.exists():
            return []
        rows = []
        with open(self.history_path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # torn last line from a kill: dropped on the next append
        return rows

    def append_history(self, row: dict[str, Any], *, key: str = "step") -> None:
        """Append one row; a row whose `key` is already recorded replaces nothing and is skipped,
        so a step finished twice (kill between history and state) is never duplicated."""
        rows = self.history()
        if key in row and any(r.get(key) == row[key] for r in rows):
            return
        rows.append(row)
        write_jsonl(self.history_path, rows)
