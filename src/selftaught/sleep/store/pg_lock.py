"""The night's lock in Postgres: nights on any host never overlap.

A night holds a session-level advisory lock on a connection of its own for as long as it
runs; the server releases it when that session ends, also when the process is killed (at
once) or its host disappears (TCP keepalives: within ~30 s). Keys, per project:

    a night over every project   exclusive (NIGHT, 0)
    a night over project P       shared (NIGHT, 0) + exclusive (NIGHT, key(P))

so two nights over every project, or two over the same project, or one over every project
and one over P, exclude each other, while nights over two different projects run side by
side. The holder writes who it is (host, pid, night, since) in `night_holders`; `read_holder`
shows a row only while its session still holds the lock (`pg_locks`), so a dead night's row
is never shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from selftaught.sleep.store.postgres import connect
from selftaught.sleep.store.versions import project_key

NIGHT = 0x5E1F_0A17  # the advisory lock namespace of nights (pg_locks.classid)
ALL = "*"  # the holder row of a night over every project


def _keys(project: str | None) -> list[tuple[str, int]]:
    """(pg function, second key) to take in order."""
    if project is None:
        return [("pg_try_advisory_lock", 0)]
    return [("pg_try_advisory_lock_shared", 0), ("pg_try_advisory_lock", project_key(project))]


@contextlib.contextmanager
def night_lock(
    url: str, night_id: str, what: str, project: str | None, error: Any
) -> Iterator[dict[str, Any]]:
    """Hold the lock for the block; raise `error(holder)` at once when a night holds it."""
    conn = connect(url, "night", autocommit=True)  # its session is the lock's lifetime
    try:
        for function, key in _keys(project):
            if not conn.execute(f"SELECT {function}(%s, %s)", (NIGHT, key)).fetchone()[0]:
                raise error(read_holder(url, conn) or {"night": "?", "what": "night"})
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "night": night_id,
            "what": what,
            "project": project,
            "started": time.time(),
        }
        conn.execute(
            "INSERT INTO night_holders (lock_key, backend_pid, holder) "
            "VALUES (%s, pg_backend_pid(), %s) ON CONFLICT (lock_key) DO UPDATE "
            "SET backend_pid = EXCLUDED.backend_pid, holder = EXCLUDED.holder",
            (project or ALL, json.dumps(holder)),
        )
        yield holder
        with contextlib.suppress(Exception):  # the session's end releases it anyway
            conn.execute(
                "DELETE FROM night_holders WHERE lock_key = %s AND backend_pid = pg_backend_pid()",
                (project or ALL,),
            )
    finally:
        conn.close()


def read_holder(url: str, conn: Any = None) -> dict[str, Any] | None:
    """Who holds a night's lock now (host, pid, night, since), or None."""
    own = conn is None
    conn = conn or connect(url, "status", autocommit=True)
    try:
        row = conn.execute(
            "SELECT h.holder FROM night_holders h JOIN pg_locks l "
            "ON l.pid = h.backend_pid AND l.locktype = 'advisory' AND l.granted "
            "AND l.classid::bigint = %s AND l.mode = 'ExclusiveLock' "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY h.lock_key LIMIT 1",
            (NIGHT,),
        ).fetchone()
    finally:
        if own:
            conn.close()
    return json.loads(row[0]) if row else None
