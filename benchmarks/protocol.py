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
- A later report *round* (`report_settings_round<N>.json`) takes fresh report seeds, written
  down with its settings before any of its runs; an earlier round's rows stay as they are.
  A round may name the git tag its runs must be made on (`code_tag`): a sitting at any other
  commit is refused, so changes landing meanwhile never reach the round.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common import BENCH_DIR, REPO, RESULTS

REPORT_SETTINGS = BENCH_DIR / "report_settings.json"  # round 1
ROUNDS = {1: REPORT_SETTINGS, 2: BENCH_DIR / "report_settings_round2.json"}
LATEST_ROUND = max(ROUNDS)
DESIGN_SPLITS = ("train", "val")
RESULTS_DIR = RESULTS.relative_to(REPO).as_posix()  # what benchmarks write


def round_path(round_: int) -> Path:
    if round_ not in ROUNDS:
        raise SystemExit(f"report round {round_} is unknown; the rounds: {sorted(ROUNDS)}")
    return ROUNDS[round_]


def load_report_settings(path: Path = REPORT_SETTINGS) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("dev_seeds", "report_seeds", "tasks", "systems", "settings"):
        if key not in data:
            raise SystemExit(f"{path.name}: missing {key!r}")
    if set(data["dev_seeds"]) & set(data["report_seeds"]):
        raise SystemExit(f"{path.name}: a seed cannot be both a dev seed and a report seed")
    for spec, systems in data.get("systems_per_task", {}).items():
        if spec not in data["tasks"] or not set(systems) <= set(data["systems"]):
            raise SystemExit(f"{path.name}: systems_per_task[{spec!r}] names a task or system "
                             "the file does not plan")  # fmt: skip
    return data


def round_settings(round_: int) -> dict[str, Any]:
    """A round's settings; a later round's report seeds must be fresh (no earlier round's)."""
    data = load_report_settings(round_path(round_))
    for earlier in range(1, round_):
        before = load_report_settings(ROUNDS[earlier])["report_seeds"]
        used = set(data["report_seeds"]) & set(before)
        if used:
            raise SystemExit(f"{ROUNDS[round_].name}: report seed(s) {sorted(used)} were round "
                             f"{earlier}'s; a new round takes fresh seeds")  # fmt: skip
    return data


def planned_systems(frozen: dict[str, Any], spec: str) -> list[str]:
    """The systems a round runs on `spec`: its `systems_per_task` entry, else every system."""
    return list(frozen.get("systems_per_task", {}).get(spec, frozen["systems"]))


def report_seeds() -> list[int]:
    """Every round's report seeds: no design tool may score any of them."""
    seeds = [load_report_settings(p)["report_seeds"] for p in ROUNDS.values() if p.exists()]
    return sorted({seed for round_seeds in seeds for seed in round_seeds})


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
            f"seeds (report_settings*.json); choose on the dev seeds "
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


def check_round_commit(frozen: dict[str, Any]) -> None:
    """Refuse a sitting of a round that names its `code_tag` on any other commit."""
    tag = frozen.get("code_tag")
    if not tag:
        return
    verify = ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}"]
    tagged = subprocess.run(verify, capture_output=True, text=True, check=False).stdout.strip()
    if not tagged:
        raise SystemExit(f"this report round runs on the commit tagged {tag}: no such tag here")
    if _git("rev-parse", "HEAD") != tagged:
        raise SystemExit(
            f"this report round runs on the commit tagged {tag} ({tagged[:10]}), not on HEAD: "
            f"run it from a worktree there (git worktree add ../round {tag})"
        )
    if code_state()["dirty"]:
        raise SystemExit(f"this report round runs on the commit tagged {tag} as committed: "
                         "the tree has other changes (git status)")  # fmt: skip


def code_state() -> dict[str, Any]:
    """The code a row was measured with: HEAD, and whether the tree had other changes (the
    results a benchmark writes are not code: a report's own new results file is no change)."""
    changes = _git("status", "--porcelain", "--", ".", f":!{RESULTS_DIR}")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(changes)}
