"""The slow update's night side: the project's edit ledger (`skill.ledger`) and its rollbacks.

Built on the night's consolidate step, not beside it: a night's skill (and memory) phase is a
`SkillTrainer` run, so it records its edits in the project's ledger
(`<home>/projects/<p>/edit_ledger.jsonl`), shows the analyst what failed on earlier nights,
and at the end of every `slow_every`-th night runs the slow update (`skill.slow`) inside the
phase, before demo modes and proofread see its best skill. What only a night knows is added
here: before a night learns, every adopted version rolled back since (`staging` events:
rollback, auto_rollback) turns the edits its night accepted, and that the version held, into
`rolled_back` rows. A dry run writes to a copy of the ledger in its scratch folder.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import normalize
from selftaught.skill.ledger import EditLedger, LedgerEvent
from selftaught.sleep.adoption import staging
from selftaught.sleep.paths import edit_ledger_path


def night_ledger(project: str, home: Path, night_dir: Path, dry_run: bool) -> Path:
    """The ledger a night's trainers write: the project's, or for a dry run a copy of it."""
    path = edit_ledger_path(project, home)
    if not dry_run:
        return path
    copy = night_dir / path.name
    if path.is_file():
        shutil.copyfile(path, copy)
    return copy


def with_ledger(training: SkillOptConfig, path: Path) -> SkillOptConfig:
    """The night's training settings writing to `path`, unless the user named a ledger."""
    if training.edit_ledger:
        return training
    return dataclasses.replace(training, edit_ledger=str(path))


def rolled_back(events: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    """Adopted versions that a later rollback undid: version -> (its night, why)."""
    night_of = {
        int(e["version"]): str(e["night"])
        for e in events
        if e.get("event") == "adopt" and e.get("night") and e.get("version") is not None
    }
    out: dict[int, tuple[str, str]] = {}
    for e in events:
        if e.get("event") not in ("rollback", "auto_rollback"):
            continue
        to, since = int(e.get("version") or 0), int(e.get("previous") or 0)
        for version, night in night_of.items():
            if to < version <= since and version not in out:
                out[version] = (night, f"version {version} rolled back ({e['event']} to {to})")
    return out


def _held(e: LedgerEvent, text: str) -> bool:
    """Whether a version's (normalised) document holds what edit `e` did."""
    if e.content:
        return normalize(e.content) in text
    return normalize(e.target) not in text  # a delete


def sync_rollbacks(project: str, home: Path, ledger: EditLedger) -> int:
    """Record `rolled_back` for the accepted edits of every rolled-back night that its
    version still held; returns the rows added (none twice: rows are idempotent)."""
    undone = rolled_back(staging.events(project, home))
    if not undone:
        return 0
    nights = staging.nights_dir(project, home)
    events, now = ledger.events(), time.time()
    rows = []
    for version, (night, why) in sorted(undone.items()):
        held = staging.read_version(project, version, home)
        texts = {"skill": normalize(held.skill), "memory": normalize(held.memory)}
        folder = (nights / night).resolve()
        for e in events:
            run = Path(e.run)
            mine = e.kind == "accepted" and folder in (run, run.parent)
            if mine and _held(e, texts.get(e.document, "")):
                rows.append(dataclasses.replace(e, kind="rolled_back", reason=why, time=now))
    ledger.append(rows)
    return len(rows)
