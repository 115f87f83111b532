"""Where sleep's shared state lives: one SQLite file (the default) or a PostgreSQL database.

A log location is a path (SQLite, `intake/log.py` as always) or a `postgresql://` URL. With a
URL the task log, the adopted versions every replica serves (`versions.py`) and the night's
lock (`pg_lock.py`) all live in that database, so proxies and nights on several hosts share
them. The adopted versions and the lock follow `$SELFTAUGHT_LOG` (the CLI's `--log URL` sets it
for the command it runs), the log follows `--log` or `$SELFTAUGHT_LOG`.

    dialect.py    every SQL difference between the two (placeholders, types, tags, ordering)
    sqlite.py     the SQLite backend of the task log (WAL, PRAGMA user_version migrations)
    postgres.py   the Postgres backend (psycopg 3, a pool, migrations in `selftaught_schema`)
    versions.py   adopted versions, their pointer and events in Postgres (staging/paths call it)
    pg_lock.py    the night's lock as a Postgres advisory lock, and who holds it
    move.py       `sleep log migrate`: copy a SQLite log and its versions into Postgres

psycopg is an optional extra (`selftaught[postgres]`), imported only when a URL is used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from selftaught.errors import InputError, MissingDependency
from selftaught.sleep.paths import ENV_LOG, sleep_home

URL_SCHEMES = ("postgresql://", "postgres://")
_PASSWORD_PARAM = re.compile(r"(?i)(password=)[^&\s]*")
_ANY_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


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


def display_url(url: str) -> str:
    """The URL without its password (user, host, port, database and options kept)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}@{host}"
        query = urlencode(
            [
                (k, "***" if k.lower() == "password" else v)
                for k, v in parse_qsl(parts.query, keep_blank_values=True)
            ]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # a malformed URL: drop anything that may hold a secret
        return _PASSWORD_PARAM.sub(r"\1***", re.sub(r"//[^/@]*@", "//***@", url))


def scrub(text: str, url: str) -> str:
    """A driver's message about `url` with its password removed wherever it appears."""
    password = urlsplit(url).password if "://" in url else None
    text = text.replace(url, display_url(url))
    return text.replace(password, "***") if password else text


class LogUrl:
    """A Postgres log location: `str()` shows it without its password, `.url` is the real
    one (only the driver sees it)."""

    def __init__(self, url: str | LogUrl):
        self.url = url.url if isinstance(url, LogUrl) else url.strip()

    def __str__(self) -> str:
        return display_url(self.url)

    def __repr__(self) -> str:
        return f"LogUrl({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogUrl) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)


LogLocation = Path | LogUrl


def log_location(value: str | Path | LogUrl | None = None) -> LogLocation:
    """Where the task log is: `value`, else $SELFTAUGHT_LOG, else <home>/log.db. A
    postgresql:// URL is a `LogUrl`, never a path (a path would make a folder named
    'postgresql:')."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = os.environ.get(ENV_LOG) or sleep_home() / "log.db"
    if is_url(value):
        return LogUrl(value)  # type: ignore[arg-type]
    if isinstance(value, str) and _ANY_URL.match(value.strip()):
        raise LogError(
            f"the task log {display_url(value)!r} is neither a file path nor a postgresql:// URL"
        )
    return Path(value).expanduser()


def shared_url() -> str | None:
    """The Postgres database holding the adopted versions and the night's lock, when
    $SELFTAUGHT_LOG names one; None: they are files under the sleep home."""
    env = os.environ.get(ENV_LOG)
    return LogUrl(env).url if env and is_url(env) else None


def psycopg_modules() -> tuple[object, object]:
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
