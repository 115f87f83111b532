"""The benchmark protocol, in code (benchmarks/README.md, "Protocol", says it in words).

- Dev seeds are for every choice: defaults, orders, caps, task settings. Tools that score a
  design choice (`bench_demo_kinds.py`, `bench_demos.py`, `bench_peers.py` outside
  `--report`) score on train and val only: they refuse the test split and the report seeds.
- Report seeds were written down before any run, in `report_settings.json` (committed, with
  the tasks, systems, budgets, sizes and models). `bench_peers.py --report` runs every system
  once per report seed with those settings; it refuses to start while the settings file has
  uncommitted changes, and every row records the settings file's commit and the code's.
- A report run is never repeated to get a better number: a re-run is a new row beside the
  old one (the results keep every row, with its date and commits; the tables show them all).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common import BENCH_DIR, REPO, RESULTS

REPORT_SETTINGS = BENCH_DIR / "report_settings.json"
DESIGN_SPLITS = ("train", "val")
RESULTS_DIR = RESULTS.relative_to(REPO).as_posix()  # what benchmarks write


def load_report_settings(path: Path = REPORT_SETTINGS) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("dev_seeds", "report_seeds", "tasks", "systems", "settings"):
        if key not in data:
            raise SystemExit(f"{path.name}: missing {key!r}")
    if set(data["dev_seeds"]) & set(data["report_seeds"]):
        raise SystemExit(f"{path.name}: a seed cannot be both a dev seed and a report seed")
    return data


def report_seeds(path: Path = REPORT_SETTINGS) -> list[int]:
    return list(load_report_settings(path)["report_seeds"]) if path.exists() else []


def check_design_use(tool: str, *, seeds: Iterable[int] = (), splits: Iterable[str] = ()) -> None:
    """Refuse what a design tool must not score: the test split, or a report seed."""
    bad_splits = [s for s in splits if s not in DESIGN_SPLITS]
    if bad_splits:
        raise SystemExit(
            f"{tool} scores design choices: it scores on {' and '.join(DESIGN_SPLITS)} only, "
            f"never on {', '.join(bad_splits)} (benchmarks/README.md, Protocol)"
        )
    reserved = sorted(set(seeds) & set(report_seeds()))
    if reserved:
        raise SystemExit(
            f"{tool} scores design choices: seed(s) {', '.join(map(str, reserved))} are report "
            f"seeds ({REPORT_SETTINGS.name}); choose on the dev seeds "
            f"{load_report_settings()['dev_seeds']}"
        )


def _git(*args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {out.stderr.strip() or out.returncode}")
    return out.stdout.strip()


def settings_commit(path: Path = REPORT_SETTINGS) -> str:
    """The commit that last changed the settings file; refuses a file with uncommitted
    changes (or never committed): a report runs only on settings written down first."""
    rel = str(path.resolve().relative_to(REPO))
    if _git("status", "--porcelain", "--", rel):
        raise SystemExit(
            f"{rel} has uncommitted changes: commit the report settings before a report run"
        )
    commit = _git("log", "-1", "--format=%H", "--", rel)
    if not commit:
        raise SystemExit(f"{rel} is not committed: commit it before a report run")
    return commit


def code_state() -> dict[str, Any]:
    """The code a row was measured with: HEAD, and whether the tree had other changes (the
    results a benchmark writes are not code: a report's own new results file is no change)."""
    changes = _git("status", "--porcelain", "--", ".", f":!{RESULTS_DIR}")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(changes)}
