"""Where a proxy's rows wait while the log's database cannot be reached.

The proxy's writer (`writer.py`) appends each batch it cannot store (`LogUnavailable`) to its
own spool file, `<home>/spool/<host>-<pid>-<n>.jsonl` (mode 0600, already redacted, fsynced), and
replays it into the log once the database answers again, oldest first, before anything newer;
replaying twice stores nothing twice (rows keep their ids). A writer holds an exclusive
`flock` on its file while it lives; a file nobody holds is a dead proxy's, and the next
writer on this host replays it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import sys
import threading
import uuid
from pathlib import Path

from selftaught.runs import private_dirs
from selftaught.sleep.intake.log import Feedback, Interaction, LogUnavailable, TaskLog
from selftaught.sleep.intake.storable import salvaged

RETRY_S = 2.0
"""While the database is unreachable, batches go straight to the spool and a replay is tried
at most this often (each try may wait for a connection)."""
REPLAY_BATCH = 256


def record(it: Interaction) -> str:
    """One spool line: every field of the (redacted) interaction."""
    fields = {f.name: getattr(it, f.name) for f in dataclasses.fields(it)}
    fields["feedback"] = dataclasses.asdict(it.feedback)
    return json.dumps(fields, ensure_ascii=False)


def from_record(line: str) -> Interaction:
    fields = json.loads(line)
    fields["feedback"] = Feedback(**fields["feedback"])
    return Interaction(**fields)


class Spool:
    """This process's spool file, and the dead ones' it finds beside it."""

    def __init__(self, folder: Path):
        private_dirs(folder)
        self.folder = folder
        # one file per writer (two proxies in one process never share one)
        self.path = folder / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # alive: nobody else replays this file
        self._lock = threading.Lock()  # the writer appends while the replay thread stores
        self.replayed = 0  # rows taken out of the files and stored (or refused), in all
        self.waiting = self._count(self.path) + sum(self._count(p) for p in self._orphans())

    def append(self, rows: list[Interaction]) -> None:
        """Add rows (already redacted) durably: written and fsynced before this returns."""
        with self._lock:
            os.write(self._fd, "".join(record(r) + "\n" for r in rows).encode())
            os.fsync(self._fd)
            self.waiting += len(rows)

    def replay(self, log: TaskLog) -> int:
        """Store every waiting row (dead proxies' first, then ours) and empty the files;
        returns how many were new. Raises what the log raises (still unreachable): the rows
        stay spooled and nothing is stored twice on the next try."""
        stored = 0
        for path in self._orphans():
            with open(path, "rb+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its proxy is alive after all, or another one replays it
                stored += self._store(path.read_bytes(), path, log)
                path.unlink()
        with self._lock:
            taken = self.path.read_bytes()
        stored += self._store(taken, self.path, log)
        with self._lock:  # keep what was appended while the rows were stored
            rest = self.path.read_bytes()[len(taken) :]
            os.ftruncate(self._fd, 0)
            if rest:
                os.write(self._fd, rest)
            os.fsync(self._fd)
            self.waiting = sum(1 for line in rest.splitlines() if line.strip())
        return stored

    def close(self) -> None:
        """Release the file; an empty one is removed (rows still waiting stay for the next
        writer on this host)."""
        if self.waiting == 0:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self._fd)

    # -- inside
    def _orphans(self) -> list[Path]:
        return [p for p in sorted(self.folder.glob("*.jsonl")) if p != self.path]

    @staticmethod
    def _count(path: Path) -> int:
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
        return 0

    def _store(self, data: bytes, path: Path, log: TaskLog) -> int:
        rows: list[Interaction] = []
        for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(from_record(line))
            except (ValueError, TypeError) as err:  # a line cut by a kill: never acknowledged
                print(f"selftaught proxy: skipped {path}:{n}: {err}", file=sys.stderr)
        stored = sum(
            _store_chunk(log, rows[start : start + REPLAY_BATCH])
            for start in range(0, len(rows), REPLAY_BATCH)
        )
        self.replayed += len(rows)
        return stored


def _store_chunk(log: TaskLog, rows: list[Interaction]) -> int:
    """Store rows (already redacted); a row the log refuses is stored as `salvaged` makes it
    (else said and dropped), never costing the others. The database down (LogUnavailable)
    stops the replay: they stay spooled."""
    try:
        return log.add_many(rows, redact=False)
    except LogUnavailable:
        raise
    except Exception as err:  # noqa: BLE001 - one bad row never costs the others
        if len(rows) > 1:
            return sum(_store_chunk(log, [row]) for row in rows)
        refused = err
    for other in salvaged(rows[0], refused):  # stored changed rather than lost
        try:
            return log.add_many([other], redact=False)
        except LogUnavailable:
            raise
        except Exception:  # noqa: BLE001 - the next, smaller row
            continue
    print(f"selftaught proxy: could not replay {rows[0].id}: {refused}", file=sys.stderr)
    return 0


def spool_dir(home: Path | None) -> Path:
    from selftaught.sleep.paths import sleep_home

    return (home or sleep_home()) / "spool"
