"""Where sleep's shared state lives: one SQLite file (the default) or a PostgreSQL database.

A log location (`paths.log_location`) is a path (SQLite, `intake/log.py` as always) or a
`postgresql://` URL. With a URL the task log, the adopted versions every replica serves
(`versions.py`) and the night's lock (`pg_lock.py`) all live in that database, so proxies and
nights on several hosts share them. The adopted versions and the lock follow `$SELFTAUGHT_LOG`
(`paths.shared_url`; the CLI's `--log URL` sets it for the command it runs), the log follows
`--log` or `$SELFTAUGHT_LOG`.

This package sits below `paths` and the task log (it imports neither): here are the records
and errors they share (`Adopted`, `LogError`, `LogUrl`).

    dialect.py    every SQL difference between the two (placeholders, types, tags, ordering)
    sqlite.py     the SQLite backend of the task log (WAL, PRAGMA user_version migrations)
    postgres.py   the Postgres backend (psycopg 3, a pool, migrations in `selftaught_schema`)
    versions.py   adopted versions, their pointer and events in Postgres (staging/paths call it)
    pg_lock.py    the night's lock as a Postgres advisory lock, and who holds it

`sleep log migrate` (copy a SQLite log and its versions into Postgres) is `sleep/move.py`,
above the log and `paths`, which it reads.

psycopg is an optional extra (`selftaught[postgres]`), imported only when a URL is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from selftaught.errors import InputError, MissingDependency

URL_SCHEMES = ("postgresql://", "postgres://")
ANY_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&\s]*")
_URL_HEAD = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.\-]*://")
ADAPTER_DIR = "adapter"  # a staged night's or a version's LoRA adapter (peft layout)


@dataclass(frozen=True)
class Adopted:
    """What is adopted for a project; `version` is None when nothing is. `adapter` is the
    LoRA adapter folder the version serves (None: the base model)."""

    skill: str = ""
    memory: str = ""
    version: str | None = None
    adapter: Path | None = None

    @property
    def empty(self) -> bool:
        return not self.skill.strip() and not self.memory.strip()

    @property
    def number(self) -> int:
        """The adopted version's number (0: nothing adopted, or a version not written by adopt)."""
        return int(self.version) if self.version and self.version.isdigit() else 0


class LogError(InputError, RuntimeError):
    """The log cannot be opened or written, or a request to it names nothing in it."""


class LogUnavailable(LogError):
    """The log's database cannot be reached now (down, unreachable, out of connections): a
    condition to wait out, not bad input. The proxy spools its rows meanwhile."""

    exit_code = 1


def is_url(value: object) -> bool:
    """A Postgres URL (postgresql:// or postgres://), as a string or a `LogUrl`."""
    if isinstance(value, LogUrl):
        return True
    return isinstance(value, str) and value.strip().lower().startswith(URL_SCHEMES)


def split_credentials(url: str) -> tuple[str, str | None, str]:
    """(`scheme://`, the user-info or None, the rest). The user-info runs to the LAST `@`:
    a password may hold `/`, `?`, `#` or `@` unescaped, and a parser that stops at the first
    `/` shows it as host and path. (An `@` in a path or query is taken for the end of the
    credentials too: showing less is the safe side.)"""
    match = _URL_HEAD.match(url)
    if match is None:
        return "", None, url
    head, rest = url[: match.end()], url[match.end() :]
    userinfo, at, after = rest.rpartition("@")
    return (head, userinfo, after) if at else (head, None, rest)


def url_password(url: str) -> str | None:
    """The password a URL carries (in its user-info or a `password=` option), if any."""
    _, userinfo, rest = split_credentials(url.strip())
    if userinfo and ":" in userinfo:
        return userinfo.split(":", 1)[1] or None
    found = _PASSWORD_PARAM.search(rest)
    if found is None:
        return None
    return found.group(0)[len(found.group(1)) :] or None


def display_url(url: str) -> str:
    """The URL without its password (user, host, port, database and options kept)."""
    head, userinfo, rest = split_credentials(url)
    if userinfo is not None:
        user = userinfo.split(":", 1)[0]
        if any(c in user for c in "/?#@"):  # no telling a user name from a secret
            user = "***"
        url = head + (f"{user}@" if user else "") + rest
    try:
        parts = urlsplit(url)
        query = urlencode(
            [
                (k, "***" if k.lower() == "password" else v)
                for k, v in parse_qsl(parts.query, keep_blank_values=True)
            ]
        )
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    except ValueError:  # a malformed URL: drop anything that may hold a secret
        return _PASSWORD_PARAM.sub(r"\1***", url)


def scrub(text: str, url: str) -> str:
    """A driver's message about `url` with its password removed wherever it appears."""
    password = url_password(url) if "://" in url else None
    text = text.replace(url, display_url(url))
    return text.replace(password, "***") if password else text


class LogUrl:
    """A Postgres log location: `str()` shows it without its password, `.url` is the real
    one (only the driver sees it)."""

    def __init__(self, url: str | LogUrl):
        self.url: str = url.url if isinstance(url, LogUrl) else url.strip()

    def __str__(self) -> str:
        return display_url(self.url)

    def __repr__(self) -> str:
        return f"LogUrl({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogUrl) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)


def psycopg_modules() -> tuple[ModuleType, ModuleType]:
    """(psycopg, psycopg_pool), or a clear error naming the extra."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError:
        raise MissingDependency(
            "a postgresql:// task log needs the postgres extra: "
            "pip install 'selftaught[postgres]' (psycopg 3 and psycopg-pool)"
        ) from None
    return psycopg, psycopg_pool
