"""One night at a time: an exclusive `flock` on `<home>/night.lock`.

The holder writes who it is (pid, night, start time) into the file; a second night fails at
once with `NightRunning` naming it. The kernel drops the lock when its process dies, even by
kill -9, so a crashed night never blocks the next one.

With a Postgres log ($SELFTAUGHT_LOG is a URL) the lock is a database advisory lock instead,
one per project, held by a session of the night's own (`store/pg_lock.py`): nights on any host
never overlap, and the server releases a dead night's lock with its session.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from selftaught.errors import Busy
from selftaught.runs import private_dirs


class NightRunning(Busy):
    """Another night holds the lock; the message names it."""

    def __init__(self, holder: dict[str, Any]):
        self.holder = holder
        started = holder.get("started")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
        host = f"host {holder['host']}, " if holder.get("host") else ""
        super().__init__(
            f"another night is running: {holder.get('what', 'night')} {holder.get('night', '?')} "
            f"({host}pid {holder.get('pid', '?')}, started {when}); this one exits without doing "
            "anything"
        )


def lock_path(home: Path) -> Path:
    return home / "night.lock"


def _shared() -> str | None:
    """The Postgres URL holding the lock ($SELFTAUGHT_LOG), its tables made sure of."""
    from selftaught.sleep.paths import shared_url
    from selftaught.sleep.store import versions

    db = versions.store(shared_url())  # opening it brings the shared tables up to date
    return None if db is None else db.url


def read_holder(home: Path) -> dict[str, Any] | None:
    """Who holds the lock now (with a Postgres log: any night, on any host), or None."""
    if (url := _shared()) is not None:
        from selftaught.sleep.store import pg_lock

        return pg_lock.read_holder(url)
    path = lock_path(home)
    if not path.exists():
        return None
    with open(path, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            try:
                holder: dict[str, Any] = json.loads(f.read() or "{}")  # the holder's JSON
                return holder
            except json.JSONDecodeError:
                return {}
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


@contextlib.contextmanager
def night_lock(
    home: Path, night_id: str, what: str = "night", *, project: str | None = None
) -> Iterator[None]:
    """Hold the lock for the block; raise NightRunning at once when another night holds it.
    `project`: the night's one project (None: every project); only a Postgres lock tells
    them apart (nights over two different projects may run at once there)."""
    if (url := _shared()) is not None:
        from selftaught.sleep.store import pg_lock

        with pg_lock.night_lock(url, night_id, what, project, NightRunning):
            yield
        return
    private_dirs(home)
    path = lock_path(home)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            try:
                holder = json.loads(f.read() or "{}")
            except json.JSONDecodeError:
                holder = {}
            raise NightRunning(holder) from None
        try:
            f.seek(0)
            f.truncate()
            json.dump(
                {"pid": os.getpid(), "night": night_id, "what": what, "started": time.time()}, f
            )
            f.flush()
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
