"""Adopted versions in Postgres: what every replica serves, switched atomically.

With a Postgres log ($SELFTAUGHT_LOG is a URL), `adoption/staging.py` and `paths.read_adopted`
keep versions here instead of under the sleep home (they pass `local`, the project's
`versions/` folder on this host, where an adapter's files are copied to be served):

    versions        one row per version (skill, memory, meta), written once in one transaction
                    with its adapter's files (`version_files`, bytes), never changed after but
                    by `sleep log forget --everywhere` (`rewrite`: lines of forgotten rows out)
    adopted         one pointer row per project: the version served now (0: nothing adopted),
                    and when it last changed (a rewrite of that version changes it too)
    version_events  every adopt, rollback and auto_rollback (what events.jsonl holds on disk)

A replica never serves half a version: it reads the pointer, then that version's row, which
was complete before the pointer could name it. `poll` serves what a thread re-reads every
`POLL_S` seconds (a request never waits on the database), so every proxy on every host
follows an adopt, a rollback or a rewrite within one poll (the process that made it, at
once); when the database cannot be reached it keeps serving what it had (and says so once on
stderr). An
adapter's files are copied once per host into the sleep home
(`projects/<p>/versions/<N>/adapter`, complete or absent), where the local server loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from selftaught.runs import private_dirs
from selftaught.sleep.store import ADAPTER_DIR, Adopted, LogError, LogUrl

POLL_S = 1.0
"""How often a serving process re-reads the adopted pointer (a proxy follows an adopt on
another host within this many seconds)."""
ADOPT_LOCK = 0x5E1F_ADB7  # pg_advisory_xact_lock(ADOPT_LOCK, project key): one adopt at a time


def project_key(project: str) -> int:
    """A positive int4 per project name, for the two-key advisory locks."""
    return zlib.crc32(project.encode()) % 0x7FFF_FFFF + 1


class PgVersions:
    """The versions of every project in one database (one pool per process and URL)."""

    def __init__(self, url: str):
        from selftaught.sleep.store.postgres import SHARED_MIGRATIONS, PostgresBackend

        self.url = url
        self._db = PostgresBackend(LogUrl(url), "shared", SHARED_MIGRATIONS)
        self._polled: dict[tuple[str, Path], Adopted] = {}  # what poll() serves
        self._stamps: dict[tuple[str, Path], tuple[Any, ...] | None] = {}  # its pointer row
        self._poll_lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self._closing = threading.Event()
        self._warned = False

    def close(self) -> None:
        self._closing.set()
        self._db.close()

    # -- reading
    @contextlib.contextmanager
    def lock(self, project: str) -> Iterator[None]:
        """One adopt or rollback of `project` at a time, across hosts (held until the block
        ends: a transaction-level advisory lock on a connection of its own)."""
        with self._db.write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (ADOPT_LOCK, project_key(project)))
            yield

    def pointer(self, project: str) -> int | None:
        """The version adopted now (None: never adopted here)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT version FROM adopted WHERE project = %s", (project,)
            ).fetchone()
        return None if row is None else row[0]

    def _stamp(self, project: str) -> tuple[Any, ...] | None:
        """The pointer row (version, changed_at): what changes when what is served does."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT version, changed_at FROM adopted WHERE project = %s", (project,)
            ).fetchone()
        return None if row is None else tuple(row)

    def numbers(self, project: str) -> list[int]:
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT version FROM versions WHERE project = %s ORDER BY version", (project,)
            ).fetchall()
        return [r[0] for r in rows]

    def projects(self) -> list[str]:
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT project FROM adopted UNION SELECT project FROM versions"
            ).fetchall()
        return sorted(r[0] for r in rows)

    def read(self, project: str, version: int, local: Path) -> Adopted | None:
        """Version N (its adapter copied to this host first), None when there is none."""
        if version == 0:
            return Adopted("", "", "0")
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT skill, memory, adapter_files FROM versions "
                "WHERE project = %s AND version = %s",
                (project, version),
            ).fetchone()
        if row is None:
            return None
        adapter = self._local_adapter(project, version, local) if row[2] else None
        return Adopted(row[0], row[1], str(version), adapter)

    def current(self, project: str, local: Path) -> Adopted:
        """What is adopted now, read from the database (no cache)."""
        version = self.pointer(project)
        if version is None:
            return Adopted()
        return self.read(project, version, local) or Adopted("", "", str(version))

    def meta(self, project: str, version: int) -> dict[str, Any]:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT meta FROM versions WHERE project = %s AND version = %s", (project, version)
            ).fetchone()
        return json.loads(row[0]) if row else {}

    def poll(self, project: str, local: Path) -> Adopted:
        """What a serving process injects: `current` as last read. The first call reads it;
        from then on a thread of this store re-reads it every POLL_S seconds, so a request
        never waits on the database (and when it cannot be reached, what was read last is
        served)."""
        key = (project, local)
        with self._poll_lock:
            hit = self._polled.get(key)
        if hit is None:
            hit = self._refresh(project, local, None)
            with self._poll_lock:
                self._polled[key] = hit
                if self._poller is None:
                    self._poller = threading.Thread(
                        target=self._poll_forever, name="selftaught-versions", daemon=True
                    )
                    self._poller.start()
        return hit

    def _poll_forever(self) -> None:
        while not self._closing.wait(POLL_S):
            with self._poll_lock:
                watched = list(self._polled.items())
            for (project, local), old in watched:
                fresh = self._refresh(project, local, old)
                with self._poll_lock:
                    self._polled[(project, local)] = fresh

    def _refresh(self, project: str, local: Path, old: Adopted | None) -> Adopted:
        """The adopted version now (`old` again when it has not changed, or when the database
        cannot be reached: said once on stderr)."""
        try:
            stamp = self._stamp(project)
            if old is not None and self._stamps.get((project, local)) == stamp:
                fresh = old  # the pointer row changes with what it serves
            else:
                fresh = self.current(project, local)
            self._stamps[(project, local)] = stamp
        except LogError as err:
            if not self._warned:
                print(f"selftaught: serving the last adopted version read: {err}", file=sys.stderr)
                self._warned = True
            return old if old is not None else Adopted()
        if self._warned:
            print("selftaught: the adopted versions' database answers again", file=sys.stderr)
        self._warned = False
        return fresh

    # -- writing
    def write_version(
        self, project: str, adopted: Adopted, meta: dict[str, Any], adapter: Path | None
    ) -> None:
        """Version N whole (skill, memory, meta and the adapter's files) in one transaction."""
        files = _adapter_files(adapter) if adapter is not None else []
        version = int(str(adopted.version))
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO versions (project, version, skill, memory, meta, adapter_files, "
                "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    project,
                    version,
                    adopted.skill,
                    adopted.memory,
                    json.dumps(meta, ensure_ascii=False, default=str),
                    len(files),
                    time.time(),
                ),
            )
            for name, data in files:
                conn.execute(
                    "INSERT INTO version_files (project, version, name, data) "
                    "VALUES (%s, %s, %s, %s)",
                    (project, version, name, data),
                )

    def point(self, project: str, version: int) -> None:
        """Serve `version` from now on (every replica, within one poll)."""
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO adopted (project, version, changed_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (project) DO UPDATE SET version = EXCLUDED.version, "
                "changed_at = EXCLUDED.changed_at",
                (project, version, time.time()),
            )
        self._refresh_own(project)  # this process serves its own adopt at once, others in a poll

    def documents(self, project: str) -> list[tuple[int, str, str]]:
        """(version, skill, memory) of every version of `project`, oldest first."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT version, skill, memory FROM versions WHERE project = %s ORDER BY version",
                (project,),
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def rewrite(self, project: str, version: int, skill: str, memory: str) -> None:
        """Version N's documents replaced in place: a forget's `--everywhere` takes out the
        lines learned from forgotten rows. When N is served, its pointer row is stamped now,
        so every serving process re-reads it within one poll (this one at once)."""
        now = time.time()
        with self._db.write() as conn:
            conn.execute(
                "UPDATE versions SET skill = %s, memory = %s WHERE project = %s AND version = %s",
                (skill, memory, project, version),
            )
            conn.execute(
                "UPDATE adopted SET changed_at = %s WHERE project = %s AND version = %s",
                (now, project, version),
            )
        self._refresh_own(project)

    def _refresh_own(self, project: str) -> None:
        with self._poll_lock:
            watched = [k for k in self._polled if k[0] == project]
        for key in watched:
            fresh = self.current(*key)
            with self._poll_lock:
                self._polled[key] = fresh
                self._stamps.pop(key, None)

    def record_event(self, project: str, row: dict[str, Any]) -> None:
        """One adopt / rollback event, stamped now (a copied one keeps its `time`)."""
        now = row.get("time", time.time())
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO version_events (project, time, body) VALUES (%s, %s, %s)",
                (project, now, json.dumps({"time": now, **row}, ensure_ascii=False, default=str)),
            )

    def events(self, project: str) -> list[dict[str, Any]]:
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT body FROM version_events WHERE project = %s ORDER BY id", (project,)
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    # -- adapters
    def _local_adapter(self, project: str, version: int, local: Path) -> Path:
        """The version's adapter folder on this host, copied from the database the first time
        (into a temp folder renamed into place: complete or absent)."""
        folder = local / str(version) / ADAPTER_DIR
        if (folder / "adapter_config.json").is_file():
            return folder
        with self._db.read() as conn:
            files = conn.execute(
                "SELECT name, data FROM version_files WHERE project = %s AND version = %s",
                (project, version),
            ).fetchall()
        private_dirs(folder.parent)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".adapter-"))
        try:
            for name, data in files:
                target = tmp / _safe_name(name)
                private_dirs(target.parent)
                target.write_bytes(bytes(data))
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "adapter_config.json").is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder


def _adapter_files(folder: Path) -> list[tuple[str, bytes]]:
    return [
        (p.relative_to(folder).as_posix(), p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]


def _safe_name(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise LogError(f"an adapter file in the database has an unsafe name: {name!r}")
    return str(path)


_stores: dict[str, PgVersions] = {}
_stores_lock = threading.Lock()


def store(url: str | None) -> PgVersions | None:
    """The versions store of the database at `url` (one per process and URL; callers pass
    `paths.shared_url()`), or None when there is none (versions are files in the home)."""
    if url is None:
        return None
    with _stores_lock:
        found = _stores.get(url)
        if found is None:
            found = _stores[url] = PgVersions(url)
        return found


def forget(url: str) -> None:
    """Close and drop the store of `url` and the process's pool of connections to it (its
    database is going away)."""
    from selftaught.sleep.store.postgres import POOLS

    with _stores_lock:
        found = _stores.pop(url, None)
    if found is not None:
        found.close()
    POOLS.forget(url)
