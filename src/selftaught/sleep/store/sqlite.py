"""The SQLite backend of the task log: one file in WAL mode, mode 0600.

Safe for many processes writing at once (a busy timeout, short `BEGIN IMMEDIATE`
transactions). Every connection deletes securely (`PRAGMA secure_delete`: a deleted row's
bytes are overwritten with zeros, whatever SQLite was built with), and `checkpoint` copies the
WAL into the database and truncates it, so that what a `forget` deleted is left in no file.
The schema is versioned with `PRAGMA user_version` and the ordered migrations of
`intake/log.py`, applied on open; a log written by a newer selftaught is refused.

A file that cannot be written now (locked past the busy timeout, read-only, its disk full or
failing) raises `LogUnavailable`, as a Postgres server that does not answer does: a condition
to wait out, so the proxy spools its rows meanwhile (`intake/writer.py`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from selftaught.runs import private_dirs
from selftaught.sleep.store import LogError, LogUnavailable
from selftaught.sleep.store.dialect import SQLITE


def migrate(conn: sqlite3.Connection, migrations: Sequence[str], target: int | None = None) -> int:
    """Bring the schema up to `target` (default: every migration) in one transaction; returns
    the version found. Safe when several processes open a new log at once (the check runs
    inside the lock)."""
    target = len(migrations) if target is None else target
    conn.execute("BEGIN IMMEDIATE")
    try:
        found: int = conn.execute("PRAGMA user_version").fetchone()[0]
        if found > len(migrations):
            raise LogError(
                f"the log has schema version {found}, newer than this selftaught knows "
                f"({len(migrations)}); upgrade selftaught to read it"
            )
        for version in range(found, target):
            for statement in SQLITE.migration(version, migrations[version]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found


# SQLite's primary result codes of a file that cannot be written now, not of a bad statement
# or row: BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN (extended codes carry them in the low
# byte). Python 3.10 has no `sqlite_errorcode`: its messages are read instead.
_UNAVAILABLE_CODES = {5, 6, 8, 10, 13, 14}
_UNAVAILABLE_WORDS = ("locked", "busy", "readonly", "disk i/o", "disk is full", "unable to open")


def unavailable(err: sqlite3.Error) -> bool:
    """The file cannot be written now (wait it out), rather than this statement is wrong."""
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _UNAVAILABLE_CODES
    return isinstance(err, sqlite3.OperationalError) and any(
        word in str(err).lower() for word in _UNAVAILABLE_WORDS
    )


class SqliteBackend:
    """One connection guarded by a lock, so a TaskLog can be shared by threads."""

    dialect = SQLITE

    def __init__(
        self,
        path: Path,
        migrations: Sequence[str],
        *,
        busy_timeout_s: float = 30.0,
        write_timeout_s: float | None = None,
    ):
        """`busy_timeout_s`: how long opening (and its migration) waits for another writer's
        lock; `write_timeout_s`: how long each later statement waits (default the same)."""
        self.location = path
        self._lock = threading.Lock()
        self._conn = self._open(migrations, busy_timeout_s)
        if write_timeout_s is not None:
            self._conn.execute(f"PRAGMA busy_timeout = {int(write_timeout_s * 1000)}")

    def _open(self, migrations: Sequence[str], busy_timeout_s: float) -> sqlite3.Connection:
        path = self.location
        try:
            private_dirs(path.parent)
            conn = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            # Never open or close a descriptor of the database beside SQLite: closing one drops
            # every POSIX lock this process holds on the file, and another process may then
            # delete the WAL under a live connection (answered requests silently lost). The mode
            # is set by path, before the first write and before SQLite creates -wal/-shm, which
            # take the database's mode.
            with contextlib.suppress(PermissionError):  # another owner's file keeps its mode
                os.chmod(path, 0o600)
        except (OSError, sqlite3.Error) as err:
            raise LogError(f"cannot open the task log {path}: {err}") from err
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA secure_delete = ON")  # a deleted row's bytes are zeroed
            migrate(conn, migrations)
        except sqlite3.DatabaseError as err:
            conn.close()
            if unavailable(err):
                raise LogUnavailable(f"cannot open the task log {path}: {err}") from err
            raise LogError(f"{path} is not a usable task log: {err}") from err
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def params(args: Sequence[Any]) -> Sequence[Any]:
        return args

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._unavailable("read"):
            yield self._conn

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._unavailable("write"):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                # SQLite may have rolled back already (a full disk, an I/O error): the error
                # that says why is the one to raise, not "no transaction is active"
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def _unavailable(self, doing: str) -> Iterator[None]:
        """A file that cannot be used now raises `LogUnavailable` (one sentence)."""
        try:
            yield
        except sqlite3.Error as err:
            if not unavailable(err):
                raise
            raise LogUnavailable(f"cannot {doing} the task log {self.location}: {err}") from err

    def schema_version(self) -> int:
        with self.read() as conn:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            return version

    def integrity_check(self) -> str:
        with self.read() as conn:
            verdict: str = conn.execute("PRAGMA integrity_check").fetchone()[0]
            return verdict

    def checkpoint(self, tries: int = 5, wait_s: float = 0.2) -> bool:
        """Copy the WAL into the database and truncate it to nothing (after a `forget`: the
        WAL holds the pages as they were before the delete). A reader in another process
        holding an older snapshot stops the truncation: tried `tries` times, `wait_s` apart.
        Whether the WAL is empty now."""
        for attempt in range(tries):
            with self._lock:
                busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            if not busy:
                return True
            if attempt + 1 < tries:
                time.sleep(wait_s)
        return False

    def close(self) -> None:
        with self._lock:
            self._conn.close()
