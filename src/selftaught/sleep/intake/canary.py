"""Canary: a staged proposal tried on a share of live requests before it is adopted.

`selftaught proxy --canary-share S` picks that share of requests (a seeded draw per
interaction id: the same ids are picked again with the same seed) and gives them the staged
proposal of the newest staged night (or `--canary-night`): its `proposal/skill.md` and
`memory.md` injected instead of the adopted ones.

- `shadow` (`--canary-mode shadow`, the default): the client gets the adopted version's answer
  as always; the staged answer is asked for beside it (never delaying the client) and logged
  as its own row, `skill_version = "staged:<night>"`, `shadow_of` = the served row's id. A
  shadow row is never returned and never mined as a task.
- `serve`: the client gets the staged answer, logged as a normal row with
  `skill_version = "staged:<night>"`, so feedback on it counts for the staged proposal.

Either way probation (`selftaught sleep probation`, `sleep status`) compares the staged
proposal with the adopted version before anyone adopts it. The staged night is looked up
again every few seconds: once it is adopted (or another night is staged) the canary follows.

A staged proposal with an adapter (report.json `proposal.adapter`) is tried on a local
upstream (`--upstream local`): the proxy folds the staged adapter into a copy of the base
weights, beside the adopted model, and sends the canary's requests there. Through a remote
upstream it cannot be (the staged adapter exists only on this machine): the proxy refuses to
start.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from selftaught.errors import InputError
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.probation import STAGED
from selftaught.sleep.paths import Adopted


class CanarySettings(Protocol):
    """What the canary reads of the proxy's config (`ProxyConfig` has it; declared here so
    that this module needs nothing from the proxy's)."""

    @property
    def project(self) -> str: ...
    @property
    def home(self) -> Path | None: ...
    @property
    def inject(self) -> bool: ...
    @property
    def canary_share(self) -> float: ...
    @property
    def canary_mode(self) -> str: ...
    @property
    def canary_night(self) -> str | None: ...
    @property
    def canary_seed(self) -> int: ...


CANARY_MODES = ("shadow", "serve")
RESOLVE_EVERY_S = 5.0  # how often the staged night is looked up again


class CanaryError(InputError):
    """A canary that cannot run as configured; the message says why."""


def picked(interaction_id: str, share: float, seed: int = 0) -> bool:
    """Whether this request is in the canary share (deterministic per id and seed)."""
    if share <= 0:
        return False
    return random.Random(f"{seed}:{interaction_id}").random() < share


@dataclass(frozen=True)
class Staged:
    """The staged proposal the canary injects."""

    night: str
    night_dir: Path
    documents: Adopted  # its skill and memory; version = the label
    adapter: Path | None = None  # its LoRA adapter (a local upstream serves it)

    @property
    def label(self) -> str:
        return STAGED + self.night


class Canary:
    """The canary of one running proxy: which proposal, which requests, and its counters."""

    def __init__(self, config: CanarySettings, *, local: bool):
        self.project = config.project
        self.home = config.home
        self.share = config.canary_share
        self.mode = config.canary_mode
        self.night = config.canary_night
        self.seed = config.canary_seed
        self.local = local
        self.note: str | None = None  # why no proposal is tried right now
        self.counts = {"served": 0, "shadow": 0, "shadow_errors": 0}
        self._staged: Staged | None = None
        self._checked = -float("inf")
        self._lock = threading.Lock()

    def resolve(self) -> Staged | None:
        """The staged proposal now (raises CanaryError when it cannot be tried)."""
        try:
            night_dir = staging.resolve_night(self.project, self.night, self.home)
            night = staging.read_night(night_dir)
        except staging.StagingError as err:
            self.note = str(err)
            return None
        if night.status != "staged":
            self.note = f"night {night_dir.name} is {night.status}, not staged"
            return None
        adapter = staging.staged_adapter(night_dir, night)
        if adapter is not None and not self.local:
            raise CanaryError(
                f"night {night_dir.name}'s proposal has an adapter: a canary cannot try it "
                "through a remote upstream (adopt it, or use a local upstream)"
            )
        folder = night_dir / "proposal"
        skill, memory = (_read(folder / f"{n}.md") for n in ("skill", "memory"))
        self.note = None
        documents = Adopted(skill, memory, STAGED + night_dir.name)
        return Staged(night_dir.name, night_dir, documents, adapter)

    def current(self) -> Staged | None:
        """The staged proposal, looked up again every RESOLVE_EVERY_S; a proposal that cannot
        be tried (found after startup) is skipped with a note, never failing a request."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= RESOLVE_EVERY_S:
                self._checked = now
                try:
                    self._staged = self.resolve()
                except CanaryError as err:
                    self._staged, self.note = None, str(err)
            return self._staged

    def pick(self, interaction_id: str, mode: str) -> Staged | None:
        """The proposal to try on this request in `mode`, or None."""
        if self.mode != mode or not picked(interaction_id, self.share, self.seed):
            return None
        return self.current()

    def snapshot(self) -> dict[str, Any]:
        staged = self._staged
        return {
            "share": self.share,
            "mode": self.mode,
            "night": staged.night if staged else None,
            "note": self.note,
            **self.counts,
        }


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def start_canary(config: CanarySettings, *, local: bool) -> Canary | None:
    """The proxy's canary, checked at startup (None when `canary_share` is 0); `local`: the
    upstream runs in this process and can serve a staged adapter."""
    if config.canary_share <= 0:
        return None
    if not config.inject:
        raise CanaryError("--canary-share needs the skill injection (drop --no-inject)")
    canary = Canary(config, local=local)
    with canary._lock:
        canary._staged = canary.resolve()  # an adapter on a remote upstream: refused here
        canary._checked = time.monotonic()
    if canary.night is not None and canary._staged is None:
        raise CanaryError(f"--canary-night: {canary.note}")
    return canary
