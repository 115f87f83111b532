"""The SQLite backend of the task log: one file in WAL mode, mode 0600.

Safe for many processes writing at once (a busy timeout, short `BEGIN IMMEDIATE`
transactions). Every connection deletes securely (`PRAGMA secure_delete`: a deleted row's
bytes are overwritten with zeros, whatever SQLite was built with), and `checkpoint` copies the
WAL into the database and truncates it, so that what a `forget` deleted is left in no file.
The schema is versioned with `PRAGMA user_version` and the ordered migrations of
`intake/log.py`, applied on open; a log written by a newer selftaught is refused.
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
from selftaught.sleep.store import LogError
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


class SqliteBackend:
    """One connection guarded by a lock, so a TaskLog can be shared by threads."""

    dialect = SQLITE

    def __init__(self, path: Path, migrations: Sequence[str], *, busy_timeout_s: float = 30.0):
        self.location = path
        self._lock = threading.Lock()
        self._conn = self._open(migrations, busy_timeout_s)

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
        with self._lock:
            yield self._conn

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

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
