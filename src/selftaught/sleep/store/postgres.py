"""The Postgres backend: the task log (and the shared tables of `versions.py` and `pg_lock.py`)
in one database, through psycopg 3 and a connection pool.

The schema is the SQLite one (the same migrations, rendered by `dialect.POSTGRES`) plus the
shared tables below, each versioned in `selftaught_schema` (component, version); migrations run
in one transaction under an advisory lock, so processes opening a new database at once never
race, and a database written by a newer selftaught is refused. Errors reach the user as one
sentence without the password: `LogUnavailable` (exit 1) when the server cannot be reached,
`LogError` (exit 2) for a wrong URL, user, password or database.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from selftaught.sleep.store import (
    LogError,
    LogUnavailable,
    LogUrl,
    display_url,
    psycopg_modules,
    scrub,
)
from selftaught.sleep.store.dialect import POSTGRES

SCHEMA_TABLE = "selftaught_schema"
MIGRATION_LOCK = 0x5E1F_7A06  # pg_advisory_xact_lock key while a schema is migrated
CONNECT_TIMEOUT_S = 5  # libpq waits forever by default: an unreachable host hangs the caller
POOL_TIMEOUT_S = 5.0  # waiting for a pooled connection (the database is down: fail, spool)
POOL_MAX = 8
RECONNECT_S = 10.0  # the pool gives up a series of reconnects (backoff 1, 2, 4 s) after this;
# the next request starts a fresh one, so a database back after a long outage is used within
# seconds, not after a backoff grown to minutes

# What only the Postgres store has: the versions every replica serves (one row per version,
# written once; its adapter's files beside it), one pointer row per project (what is adopted
# now), adopt / rollback events, and who holds a night's lock. Index i takes the component from
# version i to i + 1; never edit a shipped one.
SHARED_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE versions (
        project TEXT NOT NULL,
        version INTEGER NOT NULL,
        skill TEXT NOT NULL,
        memory TEXT NOT NULL,
        meta TEXT NOT NULL,
        adapter_files INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (project, version)
    );
    CREATE TABLE version_files (
        project TEXT NOT NULL,
        version INTEGER NOT NULL,
        name TEXT NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (project, version, name),
        FOREIGN KEY (project, version) REFERENCES versions (project, version)
    );
    CREATE TABLE adopted (
        project TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        changed_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE version_events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        project TEXT NOT NULL,
        time DOUBLE PRECISION NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX version_events_project ON version_events (project, id);
    CREATE TABLE night_holders (
        lock_key TEXT PRIMARY KEY,
        backend_pid INTEGER NOT NULL,
        holder TEXT NOT NULL
    );
    """,
)


def connect_kwargs(url: str, role: str) -> dict[str, Any]:
    """Connection settings added to the URL's: a connect timeout, TCP keepalives (a dead
    host's session, and its advisory locks, go within ~30 s) and an application_name that
    says who this is. Settings the URL gives win. A URL libpq cannot parse is a LogError."""
    psycopg, _ = psycopg_modules()
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as err:
        raise LogError(
            f"{display_url(url)} is not a usable Postgres URL: {_sentence(scrub(str(err), url))}"
        ) from None
    wanted = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "application_name": f"selftaught {role} {socket.gethostname()}:{os.getpid()}"[:63],
    }
    return {k: v for k, v in wanted.items() if k not in given}


def _sentence(message: str) -> str:
    """A driver's message as one sentence: its first line (libpq adds hints below)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return " ".join(first.split()).rstrip(".")


_BAD_INPUT = (  # what the user can fix in the URL or on the server: exit 2, not 1
    "authentication failed",
    "no password supplied",
    "does not exist",
    "permission denied",
    "invalid integer value",
    "invalid connection option",
    "invalid uri",
    "invalid value",
    "not allowed to log in",
)


def translate(err: BaseException, url: str, doing: str = "open") -> LogError:
    """A psycopg / pool error as one sentence without the password: LogUnavailable when the
    server cannot be reached or is going away, LogError for what the user can fix."""
    psycopg, pool = psycopg_modules()
    where = display_url(url)
    text = _sentence(scrub(str(err), url)) or type(err).__name__
    if isinstance(err, pool.PoolTimeout):
        return LogUnavailable(f"cannot {doing} the task log {where}: no connection ({text})")
    if isinstance(err, psycopg.OperationalError):
        if any(s in text.lower() for s in _BAD_INPUT):
            return LogError(f"cannot {doing} the task log {where}: {text}")
        return LogUnavailable(f"cannot {doing} the task log {where}: {text}")
    return LogError(f"cannot {doing} the task log {where}: {text}")


def migrate(
    conn: Any, component: str, migrations: Sequence[str], *, dialect_render: bool = True
) -> int:
    """Bring `component`'s tables up to date in one transaction; returns the version found."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = conn.execute(
            f"SELECT version FROM {SCHEMA_TABLE} WHERE component = %s", (component,)
        ).fetchone()
        found = row[0] if row else 0
        if found > len(migrations):
            raise LogError(
                f"the log has {component} schema version {found}, newer than this selftaught "
                f"knows ({len(migrations)}); upgrade selftaught to read it"
            )
        for version in range(found, len(migrations)):
            script = migrations[version]
            statements = (
                POSTGRES.migration(version, script)
                if dialect_render
                else [s.strip() for s in script.split(";") if s.strip()]
            )
            for statement in statements:
                conn.execute(statement)
        if found < len(migrations):
            conn.execute(
                f"INSERT INTO {SCHEMA_TABLE} (component, version) VALUES (%s, %s) "
                "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
                (component, len(migrations)),
            )
    return found


def connect(url: str, role: str, *, autocommit: bool = False) -> Any:
    """One connection of its own (not pooled): migrations, a night's lock session."""
    psycopg, _ = psycopg_modules()
    kwargs = connect_kwargs(url, role)
    try:
        return psycopg.connect(url, autocommit=autocommit, **kwargs)
    except psycopg.Error as err:
        raise translate(err, url) from None


def _text(value: Any) -> Any:
    # Postgres text cannot hold NUL (SQLite can): keep the row, mark the character
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class _Pools:
    """One pool per database per process, shared by every TaskLog and the versions store
    there (a proxy's log, its probation watch and its adopted-version polls share at most
    POOL_MAX connections), closed when its last user closes it or at exit. Held here, never
    dropped by the garbage collector in one of its own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Any, int]] = {}
        atexit.register(self.close_all)

    def acquire(self, url: str, component: str, migrations: Sequence[str]) -> Any:
        """The pool of `url`, once `component`'s tables are brought up to date (or refused:
        a newer schema) on every open; the first time on a connection of its own, so a wrong
        URL or password is its own error, not a pool's timeout."""
        with self._lock:
            found = self._open.get(url)
            if found is None:
                with contextlib.closing(connect(url, "log")) as conn:
                    _migrate(conn, url, component, migrations)
                found = (_new_pool(url), 0)
            else:
                try:
                    with found[0].connection() as conn:
                        _migrate(conn, url, component, migrations)
                except LogError:
                    raise
                except Exception as err:  # noqa: BLE001 - no connection: the pool's timeout
                    raise translate(err, url) from None
            self._open[url] = (found[0], found[1] + 1)
            return found[0]

    def release(self, url: str) -> None:
        with self._lock:
            pool, users = self._open.get(url, (None, 0))
            if pool is None:
                return
            if users > 1:
                self._open[url] = (pool, users - 1)
                return
            del self._open[url]
        pool.close()

    def forget(self, url: str) -> None:
        """Close the pool of `url` whoever uses it (its database is being dropped)."""
        with self._lock:
            pool, _ = self._open.pop(url, (None, 0))
        if pool is not None:
            pool.close()

    def close_all(self) -> None:
        for url in list(self._open):
            self.forget(url)


def _migrate(conn: Any, url: str, component: str, migrations: Sequence[str]) -> None:
    try:
        migrate(conn, component, migrations, dialect_render=component == "log")
    except LogError:
        raise
    except Exception as err:  # noqa: BLE001 - psycopg's errors (and the pool's), one sentence
        raise translate(err, url, "migrate") from None


def _new_pool(url: str) -> Any:
    _, pool_mod = psycopg_modules()
    return pool_mod.ConnectionPool(
        url,
        kwargs=connect_kwargs(url, "log"),
        min_size=1,
        max_size=POOL_MAX,
        timeout=POOL_TIMEOUT_S,
        reconnect_timeout=RECONNECT_S,
        check=pool_mod.ConnectionPool.check_connection,
        name="selftaught-log",
        open=True,
    )


POOLS = _Pools()


class PostgresBackend:
    """Postgres for one schema component (`log`: the task log; `shared`: the versions and the
    lock): the process's pool of connections to it, one per thread at a time (no lock in this
    process; the database orders concurrent writers)."""

    dialect = POSTGRES

    def __init__(self, url: LogUrl, component: str, migrations: Sequence[str]):
        self.location = url
        self._url = url.url
        self._component = component
        self._pool = POOLS.acquire(self._url, component, migrations)
        self._closed = False

    @staticmethod
    def params(args: Sequence[Any]) -> Sequence[Any]:
        return [_text(a) for a in args]

    @contextlib.contextmanager
    def _connection(self, doing: str) -> Iterator[Any]:
        psycopg, pool = psycopg_modules()
        failures = (psycopg.OperationalError, pool.PoolTimeout)
        try:
            with self._pool.connection() as conn:  # commits at the end, rolls back on error
                yield conn
        except failures as err:
            raise translate(err, self._url, doing) from None
        except psycopg.Error as err:
            raise translate(err, self._url, doing) from None

    def read(self) -> contextlib.AbstractContextManager[Any]:
        return self._connection("read")

    def write(self) -> contextlib.AbstractContextManager[Any]:
        return self._connection("write")

    def schema_version(self) -> int:
        with self.read() as conn:
            row = conn.execute(
                f"SELECT version FROM {SCHEMA_TABLE} WHERE component = %s", (self._component,)
            ).fetchone()
            return row[0] if row else 0

    def integrity_check(self) -> str:
        """'ok' when every feedback row points at an interaction and ids are unique."""
        with self.read() as conn:
            orphans = conn.execute(
                "SELECT COUNT(*) FROM feedback f LEFT JOIN interactions i "
                "ON i.id = f.interaction_id WHERE i.id IS NULL"
            ).fetchone()[0]
        return "ok" if orphans == 0 else f"{orphans} feedback rows without their interaction"

    def checkpoint(self) -> bool:
        """Nothing to do here: the server's WAL and dead tuples are its own (docs/postgres.md
        says what VACUUM does to a deleted row's bytes)."""
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            POOLS.release(self._url)
