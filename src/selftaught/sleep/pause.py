"""Patience over nights: a project's nights in a row without an accepted proposal, and the
pause of its schedule once they reach `sleep run --patience K`.

    <home>/projects/<project>/patience.json
        {"without_accept": 2, "last_night": "20260101-031700", "paused": null}

Every finished night counts: a night that staged (or adopted) a proposal sets the count to 0,
a `no_proposal` night adds one; a night that could not learn (too few tasks, a backend
failure, an interruption) leaves it as it is. With `--patience K`, the K-th `no_proposal`
night in a row pauses the project's schedule: a scheduled night (`sleep schedule` runs
`sleep run --scheduled`) skips the project and says why in cron.log, and `sleep status` says
it is paused, why and how to resume: `selftaught sleep resume --project P`, or a night run by
hand that stages a proposal. A night run by hand always runs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.runs import atomic_write_json, read_json
from selftaught.sleep.paths import project_dir
from selftaught.stops import StopReason

STATE_FILE = "patience.json"
ACCEPTED = ("staged", "adopted")
NOT_ACCEPTED = ("no_proposal",)


@dataclass(frozen=True)
class Paused:
    """Why a project's schedule is paused: the night that reached the patience, when."""

    night: str
    at: float
    patience: int

    @property
    def why(self) -> str:
        return f"{self.patience} nights in a row without an accepted proposal (--patience)"

    def to_dict(self) -> dict[str, Any]:
        return {"night": self.night, "at": self.at, "patience": self.patience, "why": self.why}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Paused:
        return cls(str(d.get("night") or ""), float(d.get("at") or 0.0), int(d["patience"]))


@dataclass(frozen=True)
class NightPatience:
    """The project's count of nights in a row without an accepted proposal, and its pause."""

    without_accept: int = 0
    last_night: str | None = None
    paused: Paused | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "without_accept": self.without_accept,
            "last_night": self.last_night,
            "paused": self.paused.to_dict() if self.paused else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NightPatience:
        paused = d.get("paused")
        return cls(
            int(d.get("without_accept") or 0),
            d.get("last_night"),
            Paused.from_dict(paused) if paused else None,
        )


def _path(project: str, home: Path | None) -> Path:
    return project_dir(project, home) / STATE_FILE


def read(project: str, home: Path | None = None) -> NightPatience:
    path = _path(project, home)
    return NightPatience.from_dict(read_json(path)) if path.is_file() else NightPatience()


def _write(project: str, home: Path | None, state: NightPatience) -> None:
    atomic_write_json(_path(project, home), state.to_dict())


def count_night(
    project: str, night_id: str, status: str, patience: int | None, home: Path | None = None
) -> StopReason | None:
    """Count a finished night; the patience stop when this night reaches it (the project's
    schedule is then paused)."""
    state = read(project, home)
    if status in ACCEPTED:
        state = NightPatience(0, night_id, None)  # a proposal the gate accepted resumes it
    elif status in NOT_ACCEPTED:
        state = NightPatience(state.without_accept + 1, night_id, state.paused)
    else:
        return None
    stop = None
    if patience is not None and state.without_accept >= patience:
        stop = StopReason.patience(patience, "nights", f"after night {night_id}")
        if state.paused is None:
            state = NightPatience(
                state.without_accept, night_id, Paused(night_id, time.time(), patience)
            )
    _write(project, home, state)
    return stop


def resume(project: str, home: Path | None = None) -> NightPatience:
    """Lift the pause and start counting again; returns the state it replaced."""
    before = read(project, home)
    if _path(project, home).parent.is_dir():
        _write(project, home, NightPatience(0, before.last_night, None))
    return before


def status_line(project: str, home: Path | None = None) -> str | None:
    """What `sleep status` says of the project's patience: paused (why, how to resume), or
    the count so far; None when there is nothing to say."""
    state = read(project, home)
    if state.paused is not None:
        p = state.paused
        return (
            f"  schedule paused since night {p.night}: {p.why}; a scheduled night skips this "
            f"project. Resume: `selftaught sleep resume --project {project}` (or run a night by "
            "hand: one that stages a proposal resumes it)"
        )
    if state.without_accept:
        return f"  nights in a row without an accepted proposal: {state.without_accept}"
    return None
