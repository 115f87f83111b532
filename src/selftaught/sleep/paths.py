"""Where sleep keeps its state, and the adopted skill the proxy injects.

    <home>/log.db                                  the task log (SELFTAUGHT_LOG overrides)
    <home>/redact_patterns.txt                     extra redaction regexes, one per line
    <home>/projects/<project>/adopted/skill.md     the adopted skill
    <home>/projects/<project>/adopted/memory.md    the adopted memory
    <home>/projects/<project>/adopted/version      its version (one line)
    <home>/projects/<project>/versions/<N>/adapter the LoRA adapter version N serves, if any
    <home>/projects/<project>/edit_ledger.jsonl    every edit its nights proposed, and its fate
    <home>/projects/<project>/recall.jsonl         past nights' tasks, recalled with their splits
    <home>/projects/<project>/kinds.json           its kinds of request, ids kept across nights
    <home>/projects/<project>/skills/<name>/       one of the project's many skills (a night
                                                   with `many_skills`): the same layout
                                                   (adopted/, versions/<N>/, events.jsonl),
                                                   adopted and rolled back on its own (`Unit`)

`<home>` is $SELFTAUGHT_HOME, else ~/.local/share/selftaught. The home, `projects/` and each
project's folder are 0700 (`private_project_dir` makes them so even where they existed: they
hold every prompt and reply of a night), and what is written under them 0600 / 0700: every
folder by one function, `runs.private_dirs` (its missing parents too, whatever the umask).

Writers (adopt / rollback) replace each adopted file atomically (write a temp file, rename
it into place), skill.md and memory.md first and `version` last. `read_adopted` re-reads the
files whenever one of them changed (inode, size or mtime), so a running proxy picks up a
newly adopted skill on its next request, and it retries a read that raced with a writer. The
adapter that serves is the one of the version named (`versions/<N>/adapter`, written before
`version`), so it switches with the same atomic write as the skill.

With a Postgres log ($SELFTAUGHT_LOG is a postgresql:// URL), the adopted versions live in that
database and `read_adopted` polls it (`store/versions.py`): every replica serves the same one.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from selftaught.errors import InputError

# `X as X`: re-exported on purpose (mypy's strict mode wants it said)
from selftaught.runs import ENV_HOME as ENV_HOME
from selftaught.runs import private_dirs as private_dirs
from selftaught.runs import sleep_home as sleep_home

# the records paths and the stores share live below both; imported from here as always
from selftaught.sleep.store import ADAPTER_DIR as ADAPTER_DIR
from selftaught.sleep.store import ANY_URL, LogError, LogUrl, display_url, is_url
from selftaught.sleep.store import Adopted as Adopted

ENV_LOG = "SELFTAUGHT_LOG"
DEFAULT_PROJECT = "default"
ADOPTED_FILES = ("skill.md", "memory.md", "version")
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_log_path() -> Path | str:
    """$SELFTAUGHT_LOG, else <home>/log.db; a postgresql:// URL stays a string (never a path:
    `Path` would turn it into a folder named 'postgresql:')."""
    env = os.environ.get(ENV_LOG)
    if is_url(env):
        return str(env).strip()
    return Path(env).expanduser() if env else sleep_home() / "log.db"


def log_location(value: str | Path | LogUrl | None = None) -> Path | LogUrl:
    """Where the task log is: `value`, else $SELFTAUGHT_LOG, else <home>/log.db. A
    postgresql:// URL is a `LogUrl`, never a path; another scheme is refused."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = default_log_path()
    if isinstance(value, LogUrl) or (isinstance(value, str) and is_url(value)):
        return LogUrl(value)
    if isinstance(value, str) and ANY_URL.match(value.strip()):
        raise LogError(
            f"the task log {display_url(value)!r} is neither a file path nor a postgresql:// URL"
        )
    return Path(value).expanduser()


def shared_url() -> str | None:
    """The Postgres database holding the adopted versions and the night's lock, when
    $SELFTAUGHT_LOG names one; None: they are files under the sleep home."""
    env = os.environ.get(ENV_LOG)
    return LogUrl(env).url if env and is_url(env) else None


def check_project(project: str) -> str:
    """A project name is a path component: letters, digits, '.', '_', '-' (not leading)."""
    if not isinstance(project, str) or not _PROJECT_NAME.match(project):
        raise InputError(
            f"invalid project name {project!r}: use letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return project


def project_dir(project: str, home: Path | None = None) -> Path:
    return (home or sleep_home()) / "projects" / check_project(project)


SKILLS_DIR = "skills"


@dataclass(frozen=True)
class Unit:
    """What is adopted, versioned and rolled back as one: a project's skill and memory
    (`skill` None, the project's folder), or one of its named skills (`skills/<name>/` in it,
    the same layout). Everything in `adoption/staging.py` that takes a project takes a unit."""

    project: str
    skill: str | None = None

    def __post_init__(self) -> None:
        check_project(self.project)
        if self.skill is not None:
            from selftaught.skill.routing import check_name

            check_name(self.skill)

    @property
    def key(self) -> str:
        """The versions store's key (Postgres): the project's name, or `<project>/skills/<name>`
        (a '/' no project name holds, so the two never meet)."""
        return self.project if self.skill is None else f"{self.project}/{SKILLS_DIR}/{self.skill}"

    @property
    def label(self) -> str:
        """How messages name it."""
        if self.skill is None:
            return f"project {self.project!r}"
        return f"skill {self.skill!r} of project {self.project!r}"

    def folder(self, home: Path | None = None) -> Path:
        root = project_dir(self.project, home)
        return root if self.skill is None else root / SKILLS_DIR / self.skill


Owner = str | Unit  # a project's name (its own unit) or a unit


def as_unit(owner: Owner) -> Unit:
    return owner if isinstance(owner, Unit) else Unit(owner)


def unit_dir(owner: Owner, home: Path | None = None) -> Path:
    return as_unit(owner).folder(home)


def valid_skill_names(project: str, names: Iterable[str]) -> list[str]:
    """Those of `names` a skill of `project` can hold, sorted, each once (a stray folder or
    key is no skill)."""
    valid = []
    for name in sorted(set(names)):
        try:
            valid.append(Unit(project, name).skill or "")
        except InputError:
            continue
    return [name for name in valid if name]


def local_skill_names(project: str, home: Path | None = None) -> list[str]:
    """The project's named skills with a folder in its sleep home (`skills/<name>/`)."""
    root = project_dir(project, home) / SKILLS_DIR
    found = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return valid_skill_names(project, found)


def private_home(*folders: Path) -> None:
    """Create `folders` (the home, folders under it) 0700, or make them 0700 where an older
    version, the task log or a umask of 022 left them open."""
    for path in folders:
        private_dirs(path)
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, 0o700)


def private_project_dir(project: str, home: Path | None = None) -> Path:
    """The project's folder, created or made 0700 with the home and `projects/` above it;
    returns it."""
    home = home or sleep_home()
    folder = project_dir(project, home)
    private_home(home, home / "projects", folder)
    return folder


def private_unit_dir(owner: Owner, home: Path | None = None) -> Path:
    """`private_project_dir` for a unit: its folder too is 0700."""
    unit = as_unit(owner)
    folder = private_project_dir(unit.project, home)
    if unit.skill is not None:
        folder = unit.folder(home)
        private_home(folder.parent, folder)
    return folder


def adopted_dir(project: Owner, home: Path | None = None) -> Path:
    return unit_dir(project, home) / "adopted"


def edit_ledger_path(project: str, home: Path | None = None) -> Path:
    """The project's edit ledger across nights (`skill.ledger`)."""
    return project_dir(project, home) / "edit_ledger.jsonl"


def version_adapter(project: Owner, version: str | None, home: Path | None = None) -> Path | None:
    """The LoRA adapter folder of an adopted version (None: the version serves the base)."""
    if not version or not version.isdigit() or version == "0":
        return None
    folder = unit_dir(project, home) / "versions" / version / ADAPTER_DIR
    return folder if (folder / "adapter_config.json").is_file() else None


_Stamp = tuple[tuple[int, int, int] | None, ...]
_cache: dict[Path, tuple[_Stamp, Adopted]] = {}
_cache_lock = threading.Lock()


def _stamp(folder: Path) -> _Stamp:
    stamps: list[tuple[int, int, int] | None] = []
    for name in ADOPTED_FILES:
        try:
            st = os.stat(folder / name)
        except FileNotFoundError:
            stamps.append(None)
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def read_adopted(project: Owner = DEFAULT_PROJECT, home: Path | None = None) -> Adopted:
    """The project's (or a skill unit's) adopted skill and memory; cheap when nothing changed
    (three stat calls, or with a Postgres log one query per `versions.POLL_S`)."""
    from selftaught.sleep.store import versions

    if (db := versions.store(shared_url())) is not None:
        return db.poll(as_unit(project).key, unit_dir(project, home) / "versions")
    folder = adopted_dir(project, home)
    stamp = _stamp(folder)
    with _cache_lock:
        hit = _cache.get(folder)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    for _ in range(5):  # a writer replaced a file while we read: read again
        version = _read(folder / "version").strip() or None
        adopted = Adopted(_read(folder / "skill.md"), _read(folder / "memory.md"), version)
        after = _stamp(folder)
        if after == stamp:
            break
        stamp = after
    if adopted.version is None and not adopted.empty:
        adopted = Adopted(adopted.skill, adopted.memory, "unversioned")
    elif adapter := version_adapter(project, adopted.version, home):
        adopted = Adopted(adopted.skill, adopted.memory, adopted.version, adapter)
    with _cache_lock:
        _cache[folder] = (stamp, adopted)
    return adopted
