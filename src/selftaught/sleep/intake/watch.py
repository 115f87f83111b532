"""The proxy's probation watch: recompute probation in a background thread after each
feedback and every `probation_every` completed requests, and with `auto_rollback` roll back
a version that does worse than the one it replaced (`sleep.intake.probation`).

The thread reads the log through its own connection (SQLite WAL: readers never block the
proxy's writer), so a check never delays a client, however long it takes; pokes that arrive
during a check are folded into one more check.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from selftaught.sleep.intake.log import TaskLog
from selftaught.sleep.intake.probation import (
    ProbationConfig,
    maybe_roll_back,
    probation_for,
    skill_probations,
)
from selftaught.sleep.store import LogUrl


class ProbationWatch:
    """One proxy's watch: `poke()` asks for a check, `request_done()` counts requests."""

    def __init__(
        self,
        project: str,
        log_path: Path | LogUrl,
        home: Path | None,
        config: ProbationConfig,
        *,
        auto_rollback: bool,
        every: int,
    ):
        self.project = project
        self.log_path = log_path
        self.home = home
        self.config = config
        self.auto_rollback = auto_rollback
        self.every = every
        self.last: dict[str, Any] | None = None  # the last check's result
        self.error: str | None = None  # the last check's failure, if it failed
        self.rollbacks: list[dict[str, Any]] = []
        self.checks = 0
        self._requests = 0
        self._wanted = 0  # pokes so far
        self._done = 0  # pokes answered by a finished check
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="selftaught-probation", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        with self._cond:
            self._wanted += 1
            self._cond.notify_all()

    def request_done(self) -> None:
        self._requests += 1
        if self._requests % self.every == 0:
            self.poke()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Every check asked for so far has finished (for tests and benchmarks)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= self._wanted, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        log: TaskLog | None = None
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or self._wanted > self._done)
                    if self._stopping:
                        return
                    target = self._wanted
                try:
                    log = log or TaskLog(self.log_path)
                    self._check(log)
                    self.error = None
                except Exception as err:  # noqa: BLE001 - a failed check is shown on /health
                    self.error = f"{type(err).__name__}: {err}"
                with self._cond:
                    self._done = target
                    self._cond.notify_all()
        finally:
            if log is not None:
                log.close()

    def _check(self, log: TaskLog) -> None:
        result = probation_for(self.project, log, home=self.home, config=self.config, narrow=True)
        self.checks += 1
        summary = {"checked_at": time.time(), **result.to_dict()}
        # without --auto-rollback, only a version a --no-val night staged is rolled back
        done = maybe_roll_back(
            self.project, result, home=self.home, by="proxy", asked=self.auto_rollback
        )
        if done is not None:
            row = {"time": time.time(), "from": done.previous, "to": done.version}
            self.rollbacks.append(row)
            summary["rolled_back"] = row
        summary["skills"] = self._check_skills(log)
        self.last = summary

    def _check_skills(self, log: TaskLog) -> dict[str, Any]:
        """Each adopted skill's verdict (many skills); with `auto_rollback` a drop rolls back
        that skill alone."""
        out: dict[str, Any] = {}
        for result in skill_probations(self.project, log, home=self.home, config=self.config):
            adopted = result.adopted
            row: dict[str, Any] = {"verdict": adopted.verdict if adopted else None}
            out[str(result.skill)] = row
            if self.auto_rollback:
                done = maybe_roll_back(result.unit, result, home=self.home, by="proxy")
                if done is not None:
                    rolled = {"time": time.time(), "skill": result.skill,
                              "from": done.previous, "to": done.version}  # fmt: skip
                    self.rollbacks.append(rolled)
                    row["rolled_back"] = rolled
        return out

    def snapshot(self) -> dict[str, Any]:
        """What /health shows: the last verdict, the rollbacks done, a failed check."""
        last = self.last or {}
        adopted = last.get("adopted")
        return {
            "auto_rollback": self.auto_rollback,
            "every": self.every,
            "checks": self.checks,
            "checked_at": last.get("checked_at"),
            "verdict": adopted["verdict"] if adopted else None,
            "compared": f"{adopted['new']['version']} vs {adopted['old']['version']}"
            if adopted
            else None,
            "adopted": adopted,
            "staged": last.get("staged", []),
            "skills": last.get("skills", {}),
            "rollbacks": self.rollbacks,
            "error": self.error,
        }
