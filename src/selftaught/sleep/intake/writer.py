"""Logging off the request path: a bounded queue drained by one thread into the task log.

`submit` never blocks and never raises: when the queue is full the row is dropped, and a write
that fails is reported on stderr; both are counted (the proxy shows the counters on /health).
Rows are written in batches (one transaction each); a batch that fails is retried row by row
so one bad row never costs the others, and a row the log refuses goes in as
`storable.salvaged` makes it (every field made storable, else a minimal error row saying why;
counted as `salvaged`): no answered request is left out for its bytes. While the log's
database cannot be reached or its file written (`LogUnavailable`: a Postgres server down, a
SQLite file locked past the wait, read-only or on a full disk), batches go to a spool file
under the home instead (`spool.py`: redacted, fsynced) and are replayed, oldest first, once it
answers again, by a thread of their own (so no new row ever waits on a database that does not
answer), and once more when the writer closes; /health shows the state, what was spooled and
what waits. When the spool cannot be written either, rows are tried on the log again (and
counted as failures where it refuses them too), the thread probes the log until it answers,
and `not_ready` says so (the proxy's `/ready`).

`submit` returns a future that says where the row went (`logged`, `spooled`, `failed`,
`dropped`) once it is there: the proxy waits for it before the answer's last byte, so a proxy
killed at any moment never leaves an answered request out of the log (at worst a logged one
the client never received).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.sleep.intake.log import Interaction, LogUnavailable, TaskLog
from selftaught.sleep.intake.spool import RETRY_S, Spool, spool_dir
from selftaught.sleep.intake.spool import record as spool_line
from selftaught.sleep.intake.storable import salvaged


@dataclass
class _Item:
    row: Interaction
    outcome: Future[str]


@dataclass
class WriterStats:
    submitted: int = 0
    logged: int = 0
    failures: int = 0
    dropped: int = 0
    spooled: int = 0  # written to the spool while the database was unreachable
    replayed: int = 0  # stored from the spool once it answered again
    salvaged: int = 0  # refused as they were: stored made storable, or as a minimal error row


class LogWriter:
    def __init__(
        self,
        log: TaskLog,
        *,
        max_queue: int = 10_000,
        batch_size: int = 256,
        home: Path | None = None,
    ):
        self.log = log
        self.stats = WriterStats()
        self.batch_size = batch_size
        self._spool_dir = spool_dir(home)
        # a dead proxy's rows wait here: this writer replays them
        self._spool = Spool(self._spool_dir) if any(self._spool_dir.glob("*.jsonl")) else None
        self.unreachable: str | None = None  # why the log cannot be written now
        self.spool_error: str | None = None  # why the spool could not be written, last time
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=max_queue)
        self._pending = 0
        self._cond = threading.Condition()
        self._replay_now = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="selftaught-log-writer", daemon=True)
        self._replayer = threading.Thread(
            target=self._replay_loop, name="selftaught-log-replay", daemon=True
        )
        self._thread.start()
        self._replayer.start()
        if self._spool is not None:
            self._replay_now.set()  # a dead proxy's rows: stored now, before new ones

    def submit(self, interaction: Interaction) -> Future[str]:
        """Queue a row; the future's result is where it went: logged, spooled, failed or
        dropped (never an exception)."""
        outcome: Future[str] = Future()
        with self._cond:
            self.stats.submitted += 1
            self._pending += 1
        try:
            self._queue.put_nowait(_Item(interaction, outcome))
        except queue.Full:
            self._done([outcome], "dropped")
            self._warn(f"log queue full: dropped interaction {interaction.id}")
        return outcome

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            waiting = self._spool.waiting if self._spool else 0
            state = "unreachable" if self.unreachable else "ok"
            return {**self.stats.__dict__, "queued": self._pending, "spool_waiting": waiting,
                    "state": state, "error": self.unreachable,
                    "spool_error": self.spool_error}  # fmt: skip

    def not_ready(self) -> str | None:
        """Why a new row could be stored nowhere now, as one fixed word (None: it goes into
        the log, or into the spool while the log is away)."""
        if not self._thread.is_alive():
            return "log_writer_stopped"
        if self.unreachable and self.spool_error:
            return "log_and_spool_unavailable"
        if self._queue.full():
            return "log_queue_full"
        return None

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        try:
            self._queue.put(None, timeout=1)
        except queue.Full:
            return
        self._thread.join(timeout_s)
        self._stopping = True
        self._replay_now.set()
        self._replayer.join(timeout_s)
        if not self._replayer.is_alive():
            # a last try, so that a writer closed before its replay thread ran (a busy
            # machine) leaves nothing in the spool that the log could take now
            self._replay()
        if self._spool is not None:
            self._spool.close()  # rows still waiting stay for the next writer here

    # -- the writer thread
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.batch_size:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._write(batch)
                    return
                batch.append(more)
            self._write(batch)

    def _write(self, batch: list[_Item]) -> None:
        waiting = self._spool is not None and self._spool.waiting
        if self.spool_error is None and (self.unreachable or waiting):
            self._to_spool(batch)  # older rows wait in the spool: these go after them
            return
        try:
            self.log.add_many(item.row for item in batch)
            self._done([item.outcome for item in batch], "logged")
            self._answers_again()
            return
        except LogUnavailable as err:
            self._to_spool(batch, err)
            return
        except Exception:  # noqa: BLE001 - retried one by one below
            pass
        for i, item in enumerate(batch):
            try:
                self._done([item.outcome], self._write_one(item.row))
            except LogUnavailable as err:
                self._to_spool(batch[i:], err)
                return

    def _write_one(self, row: Interaction) -> str:
        """Store one row; one the log refuses goes in as `salvaged` makes it (storable, else a
        minimal error row). Where it went: logged or failed; raises LogUnavailable."""
        try:
            self.log.add(row)
            return "logged"
        except LogUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - never let logging reach the client
            refused = err
        for other in salvaged(row, refused):
            try:
                self.log.add(other)
            except LogUnavailable:
                raise
            except Exception:  # noqa: BLE001 - the next, smaller row
                continue
            self._salvaged(row, refused)
            return "logged"
        self._warn(f"could not log interaction {row.id}: {type(refused).__name__}: {refused}")
        return "failed"

    def _salvaged(self, row: Interaction, why: Exception) -> None:
        with self._cond:
            self.stats.salvaged += 1
        self._warn(f"interaction {row.id} was stored changed: {type(why).__name__}: {why}")

    # -- the replay thread
    def _replay_loop(self) -> None:
        """Store spooled rows (a dead proxy's at start, ours while the database was away):
        tried at once when rows are spooled, then every RETRY_S while some wait; with none
        waiting and the log away (nothing could be spooled), probe it every RETRY_S."""
        while not self._stopping:
            self._replay_now.wait(RETRY_S)
            self._replay_now.clear()
            if not self._stopping:
                self._replay()

    def _replay(self) -> None:
        if self._spool is None or self._spool.waiting == 0:
            self._probe()
            return
        before = self._spool.replayed
        try:
            self._spool.replay(self.log)
        except LogUnavailable as err:
            self.unreachable = str(err)
            return
        except Exception as err:  # noqa: BLE001 - never let the replay thread die
            self._warn(f"could not replay the spool: {type(err).__name__}: {err}")
            return
        replayed = self._spool.replayed - before
        with self._cond:
            self.stats.replayed += replayed
        if self.unreachable and self._spool.waiting == 0:
            self._warn(f"the log answers again: {replayed} spooled interactions stored")
            self.unreachable = None

    def _probe(self) -> None:
        """The log away and nothing spooled to replay: try a write that stores nothing, so
        that the state (and `not_ready`) follows the log back without new traffic."""
        if not self.unreachable:
            return
        try:
            self.log.ping()
        except LogUnavailable as err:  # still away: try again later
            self.unreachable = str(err)
            return
        except Exception:  # noqa: BLE001 - never let the replay thread die
            return
        self._answers_again()

    def _answers_again(self) -> None:
        """A write went through: the log is reachable (once nothing waits in the spool)."""
        self.spool_error = None
        if self.unreachable and not (self._spool is not None and self._spool.waiting):
            self._warn("the log answers again")
            self.unreachable = None

    def _to_spool(self, batch: list[_Item], err: Exception | None = None) -> None:
        """Keep rows the database cannot take now: redacted, on disk, for `_replay`."""
        if err is not None and self.unreachable is None:
            self._warn(f"{err}; spooling interactions to {self._spool_dir} until it answers")
        if err is not None:
            self.unreachable = str(err)
        rows = [(item, self._spoolable(item.row)) for item in batch]
        lost = [item.outcome for item, row in rows if row is None]
        if lost:
            self._done(lost, "failed")
        kept = [(item, row) for item, row in rows if row is not None]
        try:
            self._spool = self._spool or Spool(self._spool_dir)
            self._spool.append([row for _, row in kept])
        except Exception as spool_err:  # noqa: BLE001 - never let logging reach the client
            self.spool_error = f"{type(spool_err).__name__}: {spool_err}"
            self._done([item.outcome for item, _ in kept], "failed")
            self._warn(f"could not spool {len(kept)} interactions: {spool_err}")
            return
        self.spool_error = None
        self._done([item.outcome for item, _ in kept], "spooled")
        self._replay_now.set()

    def _spoolable(self, row: Interaction) -> Interaction | None:
        """The row as the spool keeps it (redacted, its line encodable); one that cannot be
        is replaced as `salvaged` says; None when nothing can be (counted as failed)."""
        try:
            out = self.log.redacted(row)
            spool_line(out).encode()
            return out
        except Exception as err:  # noqa: BLE001 - never let logging reach the client
            refused = err
        for other in salvaged(row, refused):
            try:
                out = self.log.redacted(other)
                spool_line(out).encode()
            except Exception:  # noqa: BLE001 - the next, smaller row
                continue
            self._salvaged(row, refused)
            return out
        self._warn(f"could not spool interaction {row.id}: {type(refused).__name__}: {refused}")
        return None

    _COUNTERS = {"logged": "logged", "failed": "failures", "dropped": "dropped",
                 "spooled": "spooled"}  # fmt: skip

    def _done(self, outcomes: list[Future[str]], where: str) -> None:
        with self._cond:
            counter = self._COUNTERS[where]
            setattr(self.stats, counter, getattr(self.stats, counter) + len(outcomes))
            self._pending -= len(outcomes)
            self._cond.notify_all()
        for outcome in outcomes:
            if not outcome.done():  # a waiter that gave up may have cancelled it
                outcome.set_result(where)

    @staticmethod
    def _warn(message: str) -> None:
        print(f"selftaught proxy: {message}", file=sys.stderr, flush=True)
