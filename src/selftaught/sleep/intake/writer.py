"""Logging off the request path: a bounded queue drained by one thread into the task log.

`submit` never blocks and never raises: when the queue is full the row is dropped, and a write
that fails is reported on stderr; both are counted (the proxy shows the counters on /health).
Rows are written in batches (one transaction each); a batch that fails is retried row by row
so one bad row never costs the others.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from selftaught.sleep.intake.log import Interaction, TaskLog


@dataclass
class WriterStats:
    submitted: int = 0
    logged: int = 0
    failures: int = 0
    dropped: int = 0


class LogWriter:
    def __init__(self, log: TaskLog, *, max_queue: int = 10_000, batch_size: int = 256):
        self.log = log
        self.stats = WriterStats()
        self.batch_size = batch_size
        self._queue: queue.Queue[Interaction | None] = queue.Queue(maxsize=max_queue)
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="selftaught-log-writer", daemon=True)
        self._thread.start()

    def submit(self, interaction: Interaction) -> None:
        with self._cond:
            self.stats.submitted += 1
            self._pending += 1
        try:
            self._queue.put_nowait(interaction)
        except queue.Full:
            self._done(dropped=1)
            self._warn(f"log queue full: dropped interaction {interaction.id}")

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {**self.stats.__dict__, "queued": self._pending}

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

    def _write(self, batch: list[Interaction]) -> None:
        try:
            self.log.add_many(batch)
            self._done(logged=len(batch))
            return
        except Exception:  # noqa: BLE001 - retried one by one below
            pass
        for item in batch:
            try:
                self.log.add(item)
                self._done(logged=1)
            except Exception as err:  # noqa: BLE001 - never let logging reach the client
                self._done(failures=1)
                self._warn(f"could not log interaction {item.id}: {type(err).__name__}: {err}")

    def _done(self, *, logged: int = 0, failures: int = 0, dropped: int = 0) -> None:
        with self._cond:
            self.stats.logged += logged
            self.stats.failures += failures
            self.stats.dropped += dropped
            self._pending -= logged + failures + dropped
            self._cond.notify_all()

    @staticmethod
    def _warn(message: str) -> None:
        print(f"selftaught proxy: {message}", file=sys.stderr, flush=True)
