"""Precision of the follow-up reader (`selftaught.sleep.night.followup`): how often the user's
next turn, read with no model, raises a false signal.

Corpora of (reply, next turn, label) lines:
- `tests/fixtures/followups_dev.jsonl`: written with the reader, tuned on (dev);
- `benchmarks/data/followups_report.jsonl`: 320 lines written blind, by an author who never saw
  the reader's code, after the first reader was committed; its errors were then read, so it
  measured the first reader only;
- `benchmarks/data/followups_report2.jsonl`: 400 lines written blind the same way, for the
  second reader (committed before this corpus was first read or run).

A signal is **false** when the turn is no feedback (label `none`), when its direction is wrong
(a thumbs-down on an acceptance, a thumbs-up on a rejection), when a correction's value is not
the labelled one, or when a rule is read where the label states none. The false signal rate is
false / all signals raised, with a 95% Wilson interval; recall is per label kind (the right
kind read, and for a correction the right value).

    python benchmarks/bench_followups.py                # both corpora
    python benchmarks/bench_followups.py --show-errors  # each miss and false signal

Writes benchmarks/results/followups.json (one row per corpus and run, appended).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from common import RESULTS  # noqa: E402

from selftaught.runs import atomic_write_json  # noqa: E402
from selftaught.sleep.night.followup import Followup, read_followup  # noqa: E402
from selftaught.stats import wilson_interval  # noqa: E402

CORPORA = {
    "dev": HERE.parent / "tests" / "fixtures" / "followups_dev.jsonl",
    "report": HERE / "data" / "followups_report.jsonl",
    "report2": HERE / "data" / "followups_report2.jsonl",
}
DOWN = {"correction", "rejection"}


def _same(a: str | None, b: str | None) -> bool:
    norm = lambda s: "".join((s or "").lower().split()).rstrip(".")  # noqa: E731
    return norm(a) == norm(b)


def false_signal(read: Followup, label: dict) -> str | None:
    """Why `read` is a false signal for `label`, or None when it is a true one."""
    kind = label["kind"]
    if kind == "none":
        return "a signal where the turn is no feedback"
    if read.kind == "correction":
        if kind != "correction":
            return f"a correction where the label is {kind}"
        if not _same(read.reference, label.get("reference")):
            return f"corrected to {read.reference!r}, labelled {label.get('reference')!r}"
        return None
    if read.kind == "rejection":
        return None if kind in DOWN else f"a thumbs-down on a {kind}"
    if read.kind == "acceptance":
        return None if kind == "acceptance" else f"a thumbs-up on a {kind}"
    if kind not in ("rule", *DOWN):  # read.kind == "rule"
        return f"a rule where the label is {kind}"
    want = set(label.get("rules") or [])
    got = {r.kind for r in read.rules}
    if want and not want & got:
        return f"rules {sorted(got)} where the label states {sorted(want)}"
    return None


def recalled(read: Followup | None, label: dict) -> bool:
    if read is None or read.kind != label["kind"]:
        return False
    return label["kind"] != "correction" or _same(read.reference, label.get("reference"))


def measure(path: Path, show: bool) -> dict:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    signals = false = 0
    reasons: Counter[str] = Counter()
    by_kind: dict[str, list[int]] = {}
    for item in items:
        read = read_followup(item["followup"], item["reply"])
        hit = by_kind.setdefault(item["kind"], [0, 0])
        hit[1] += 1
        hit[0] += recalled(read, item)
        if read is not None:
            signals += 1
            why = false_signal(read, item)
            if why is not None:
                false += 1
                reasons[why.split(" ")[1] if why.startswith("a ") else "wrong value"] += 1
                if show:
                    print(f"  FALSE  {why}: {item['followup']!r}")
        if show and item["kind"] != "none" and not recalled(read, item):
            print(f"  MISS   {item['kind']} read as {read.kind if read else 'none'}: "
                  f"{item['followup']!r}")  # fmt: skip
    lo, hi = wilson_interval(false, signals) if signals else (0.0, 1.0)
    return {
        "items": len(items),
        "signals": signals,
        "false_signals": false,
        "false_signal_rate": round(false / signals, 4) if signals else None,
        "false_signal_rate_ci95": [round(lo, 4), round(hi, 4)],
        "recall_by_kind": {k: {"found": f, "of": n} for k, (f, n) in sorted(by_kind.items())},
        "false_by_reason": dict(reasons),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", nargs="+", default=["dev"], choices=list(CORPORA))
    parser.add_argument("--show-errors", action="store_true")
    args = parser.parse_args()
    out = RESULTS / "followups.json"
    rows = json.loads(out.read_text())["runs"] if out.exists() else []
    code = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    for name in args.corpora:
        print(f"{name}: {CORPORA[name]}")
        result = measure(CORPORA[name], args.show_errors)
        rate, (lo, hi) = result["false_signal_rate"], result["false_signal_rate_ci95"]
        print(f"  {result['signals']} signals on {result['items']} turns, "
              f"{result['false_signals']} false: rate {rate} (95% CI {lo}-{hi})")  # fmt: skip
        for kind, r in result["recall_by_kind"].items():
            print(f"  {kind:11} read right {r['found']} of {r['of']}")
        rows.append({"corpus": name, "code": code, "date": time.strftime("%Y-%m-%d"), **result})
    atomic_write_json(out, {"runs": rows})


if __name__ == "__main__":
    main()
