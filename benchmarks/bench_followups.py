"""The follow-up readers on corpora of (reply, next turn, label) lines: the rules alone
(`selftaught.sleep.night.followup`, no model) and the rules then the miner model where they
read nothing or a bare rejection (`followup_model.py`), side by side.

Corpora:
- `tests/fixtures/followups_dev.jsonl`: written with the rule reader, tuned on (dev);
- `tests/fixtures/followups_dev2.jsonl`: written with the model reader, to choose its prompt and
  default (dev): terse and value-first corrections, other languages, partial corrections,
  names and code outputs, and turns that only look like feedback;
- `tests/fixtures/followups_dev3.jsonl`: 526 lines in 14 languages written blind by an outside
  author from `benchmarks/data/followups_report3_brief.md` (dev: the third reader was tuned on
  its even lines and on odd lines 1, 5, 9, ...; lines 3, 7, 11, ... held out to the end:
  `--lines 3::4`);
- `benchmarks/data/followups_report.jsonl`: 320 lines written blind, by an author who never saw
  the reader's code, after the first reader was committed; its errors were then read, so it
  measured the first reader only;
- `benchmarks/data/followups_report2.jsonl`: 400 lines written blind the same way, for the
  second reader (committed before this corpus was first read or run);
- `benchmarks/data/followups_report3.jsonl`: lines written blind from the brief above, for the
  third reader (committed before this corpus was first read or run: test data, run once);
- `benchmarks/data/followups_report4.jsonl`: 557 lines written blind from the same brief (its
  output path changed) by an author who saw none of the project, for the fourth reader: written
  while that reader was tuned on the corpora above, unopened by the reader's authors, run once
  after the reader was committed; its errors were then read, so it measured the fourth reader
  only, and the fifth was tuned on it (dev: its even lines, then all);
- `benchmarks/data/followups_report5.jsonl`: 524 lines in 17 languages (and mixed turns)
  written blind from the same brief (its output path changed, a `lang` key added) by an author
  who saw none of the project, for the fifth reader: written while that reader was tuned,
  kept outside the repository until the reader was committed, unopened by its authors, run
  once (test data);
- any other file: `--corpus PATH` (a corpus written blind later is measured this way).

A signal is **false** when the turn is no feedback (label `none`), when its direction is wrong
(a thumbs-down on an acceptance, a thumbs-up on a rejection), when a correction's value is not
the labelled one, or when a rule is read where the label states none. The false signal rate is
false / all signals raised, with a 95% Wilson interval; recall is per label kind (the right
kind read, and for a correction the right value). The model reader also reports its calls
(repairs included), parse rate and wall time.

    python benchmarks/bench_followups.py                          # the rules, on dev
    python benchmarks/bench_followups.py --corpora dev dev2 --reader both --model local
    python benchmarks/bench_followups.py --corpus new.jsonl --reader both \\
        --model 'http://127.0.0.1:8011/v1#qwen'
    python benchmarks/bench_followups.py --show-errors            # each miss and false signal
    python benchmarks/bench_followups.py --corpora dev3 --lines 0::2   # dev3's even lines

The model's answers are saved every `--save-every` lines under runs/bench/followups/ (one
file per corpus and model, with its settings), before the turn checks them: a killed run
resumes where it stopped, and a changed check re-reads them without asking again (`--fresh`
starts over). Appends one row per corpus and reader to
benchmarks/results/followups.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from common import REPO, RESULTS, machine_info, resumed_units  # noqa: E402

from selftaught.runs import atomic_write_json  # noqa: E402
from selftaught.sleep.night.checks import Rule  # noqa: E402
from selftaught.sleep.night.followup import Followup, read_followup  # noqa: E402
from selftaught.sleep.night.followup_model import (  # noqa: E402
    PROMPT_TEXT,
    READINGS,
    FollowupAsk,
    ModelRead,
    ModelReader,
    settle_answers,
    wants_model,
)
from selftaught.sleep.night.miner import Parsed  # noqa: E402
from selftaught.stats import wilson_interval  # noqa: E402

CORPORA = {
    "dev": HERE.parent / "tests" / "fixtures" / "followups_dev.jsonl",
    "dev2": HERE.parent / "tests" / "fixtures" / "followups_dev2.jsonl",
    "report": HERE / "data" / "followups_report.jsonl",
    "report2": HERE / "data" / "followups_report2.jsonl",
    "dev3": HERE.parent / "tests" / "fixtures" / "followups_dev3.jsonl",
    "report3": HERE / "data" / "followups_report3.jsonl",
    "report4": HERE / "data" / "followups_report4.jsonl",
    "report5": HERE / "data" / "followups_report5.jsonl",
}
DOWN = {"correction", "rejection"}
STATE = REPO / "runs" / "bench" / "followups"


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


def measure(items: list[dict], reads: list[Followup | None], show: bool) -> dict:
    """The figures of one reader's `reads` of `items`."""
    signals = false = 0
    reasons: Counter[str] = Counter()
    by_kind: dict[str, list[int]] = {}
    for item, read in zip(items, reads, strict=True):
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
    found, of = by_kind.get("correction", [0, 0])
    return {
        "items": len(items),
        "signals": signals,
        "false_signals": false,
        "false_signal_rate": round(false / signals, 4) if signals else None,
        "false_signal_rate_ci95": [round(lo, 4), round(hi, 4)],
        "correction_recall": round(found / of, 4) if of else None,
        "recall_by_kind": {k: {"found": f, "of": n} for k, (f, n) in sorted(by_kind.items())},
        "false_by_reason": dict(reasons),
    }


# ---- the model reader, resumable ----------------------------------------------------------


def _answer_dict(got: Parsed[ModelRead] | None) -> dict[str, Any] | None:
    """A model's answer as saved (its parsed reading, before the turn is checked)."""
    if got is None:
        return None
    read = None
    if got.value is not None:
        rules = [{"kind": r.kind, "arg": r.arg} for r in got.value.rules]
        read = {"kind": got.value.kind, "value": got.value.value, "rules": rules,
                "invalid": got.value.invalid}  # fmt: skip
    return {"status": got.status, "error": got.error, "read": read}


def _answer_of(d: dict[str, Any]) -> Parsed[ModelRead]:
    read = d.get("read")
    value = None
    if read is not None:
        rules = tuple(Rule(r["kind"], r.get("arg")) for r in read["rules"])
        value = ModelRead(read["kind"], read.get("value"), rules, read.get("invalid", 0))
    return Parsed(status=d["status"], error=d.get("error"), value=value)


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("_")[:60]


def _asks(items: list[dict], ruled: list[Followup | None], idx: list[int]) -> list[FollowupAsk]:
    return [
        FollowupAsk(items[i].get("request", ""), items[i]["reply"], items[i]["followup"], ruled[i])
        for i in idx
    ]


def _ask_model(
    run: dict[str, Any], path: Path, items: list[dict], ruled: list, todo: list[int], args
) -> None:
    """Ask the model about the `todo` lines, saving its answers every `--save-every` lines."""
    from selftaught.models import load_model
    from selftaught.models.usage import TrackedModel, UsageLedger
    from selftaught.sleep.night.miner import Miner, MinerConfig

    ledger = UsageLedger()
    config = MinerConfig(
        concurrent_calls=args.concurrency, followup_max_tokens=args.max_tokens, call_timeout_s=600.0
    )
    miner = Miner(TrackedModel(load_model(args.model), ledger, "miner"), "m", config)
    reader = ModelReader(miner, args.reading)
    print(f"  model reader: {len(todo)} turns to read")
    for start in range(0, len(todo), args.save_every):
        chunk = todo[start : start + args.save_every]
        before = sum(u.calls + u.errors for u in ledger.roles.values())
        t0 = time.monotonic()
        answers, skipped = reader.answers(_asks(items, ruled, chunk))
        run["runs"].append(
            {
                "answers": {str(i): _answer_dict(a) for i, a in zip(chunk, answers, strict=True)},
                "skipped": dict(skipped),
                "calls": sum(u.calls + u.errors for u in ledger.roles.values()) - before,
                "wall_s": round(time.monotonic() - t0, 2),
            }
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, run)
        print(f"  ... {start + len(chunk)}/{len(todo)} read", flush=True)


def model_reads(
    name: str, items: list[dict], args: argparse.Namespace, lines: range
) -> tuple[list[Followup | None], dict[str, Any]]:
    """The rules, then the model where they read a bare rejection (or nothing): the reading of
    each of `lines`, and the model's calls, parse rate and wall time. The model's answers are
    saved by line of the whole corpus before the turn checks them, so a changed check, or
    another slice of lines, re-reads them without asking again."""
    corpus = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:12]
    settings = {
        "model": args.model,
        "corpus": corpus,
        "prompt": hashlib.sha256(PROMPT_TEXT.encode()).hexdigest()[:12],
        "max_tokens": args.max_tokens,
        "reading": args.reading,
    }
    path = STATE / f"{_slug(name)}-{_slug(args.model)}-{args.reading}.json"
    if args.fresh and path.exists():
        path.unlink()
    run = {"settings": settings, "runs": resumed_units(path, settings)}
    ruled = [read_followup(it["followup"], it["reply"]) for it in items]
    done = {int(i): a for r in run["runs"] for i, a in r["answers"].items()}
    wanted = [i for i in lines if wants_model(items[i]["followup"], ruled[i], args.reading)]
    todo = [i for i in wanted if i not in done]
    if todo:
        _ask_model(run, path, items, ruled, todo, args)
        done = {int(i): a for r in run["runs"] for i, a in r["answers"].items()}
    skipped: Counter[str] = Counter()
    for r in run["runs"]:
        skipped.update(r["skipped"])
    answers = [_answer_of(done[i]) if done.get(i) is not None else None for i in wanted]
    got, report = settle_answers(_asks(items, ruled, wanted), answers, args.model, skipped)
    reads = list(ruled)
    for i, read in zip(wanted, got, strict=True):
        reads[i] = read
    cost = {k: v for k, v in report.to_dict().items() if k not in ("model", "first_error")}
    # each line read cost a call, and a second one when it was repaired or failed to parse
    cost["calls"] = report.asked + report.repaired + report.parse_failures
    cost["wall_s"] = round(sum(r["wall_s"] for r in run["runs"]), 1)  # the whole corpus's
    return [reads[i] for i in lines], cost


# ---- the table in docs/sleep-conversations.md ---------------------------------------------

DEV_TABLE = ("dev3[0::2]", "dev3[1::2]", "dev3[3::4]", "dev3", "dev2", "dev")
TUNED = {
    "dev3[0::2]": "tuned on",
    "dev3[1::2]": "half tuned on (1, 5, 9, ...)",
    "dev3[3::4]": "held out",
    "dev3": "all",
    "dev2": "tuned on",
    "dev": "tuned on",
}


def _model_name(spec: str) -> str:
    if spec == "local":
        return "embedded 135M"
    return "Qwen2.5-Coder-0.5B" if "qwen2.5-coder-0.5b" in spec.lower() else spec


def dev_table(results: Path) -> str:
    """The readers on the dev corpora, the latest run of each (rules alone, then the rules
    and a reading model), as a markdown table."""
    rows = json.loads((results / "followups.json").read_text())["runs"]
    latest: dict[tuple, dict] = {}
    for r in rows:
        if r.get("corpus") in DEV_TABLE and r.get("reader") and r.get("code"):
            if r["reader"] == "model" and not r.get("reading"):
                continue  # the reader before the readings (the whole vocabulary on every turn)
            key = (r["corpus"], r["reader"], r.get("model"), r.get("reading"))
            latest[key] = r
    lines = [
        "| corpus | lines | reader | turns | false signals | rate (95% CI) | corrections "
        "with their value | model calls |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    order = sorted(latest, key=lambda k: (DEV_TABLE.index(k[0]), k[1] != "rule", str(k[2:])))
    for corpus, reader, model, reading in order:
        r = latest[(corpus, reader, model, reading)]
        lo, hi = r["false_signal_rate_ci95"]
        found = r["recall_by_kind"].get("correction", {"found": 0, "of": 0})
        who = "rules" if reader == "rule" else f"rules + {_model_name(model)} ({reading})"
        lines.append(
            f"| {corpus.split('[')[0]} | {TUNED[corpus]} | {who} | {r['items']} | "
            f"{r['false_signals']}/{r['signals']} | {r['false_signal_rate']:.3f} "
            f"({lo:.3f}–{hi:.3f}) | {found['found']}/{found['of']} "
            f"({r['correction_recall']:.2f}) | {r.get('calls', 0)} |"
        )
    return "\n".join(lines)


# ---- main -----------------------------------------------------------------------------------


def _print_side_by_side(name: str, results: dict[str, dict]) -> None:
    readers = list(results)
    print(f"{name}: {next(iter(results.values()))['items']} turns")
    header = f"  {'':28}" + "".join(f"{r:>24}" for r in readers)
    print(header)

    def row(label: str, cell) -> None:
        print(f"  {label:28}" + "".join(f"{cell(results[r]):>24}" for r in readers))

    def fsr(res: dict) -> str:
        lo, hi = res["false_signal_rate_ci95"]
        return f"{res['false_signals']}/{res['signals']} {res['false_signal_rate']} [{lo}-{hi}]"

    row("false signals", fsr)
    kinds = next(iter(results.values()))["recall_by_kind"]
    for kind in kinds:
        row(f"{kind} read right", lambda r, k=kind: "{found}/{of}".format(**r["recall_by_kind"][k]))
    row("corrections with value", lambda r: str(r["correction_recall"]))
    row("calls", lambda r: str(r.get("calls", 0)))
    row("parse rate", lambda r: str(r.get("parse_rate", "-")))
    row("wall s", lambda r: str(r.get("wall_s", "-")))


def _lines(parser: argparse.ArgumentParser, spec: str) -> tuple[int, int]:
    """`--lines START::STEP` as (start, step); (0, 1) when not given."""
    if not spec:
        return 0, 1
    m = re.fullmatch(r"(\d+)::([1-9]\d*)", spec)
    if m is None:
        parser.error(f"--lines {spec!r}: expected START::STEP, e.g. 0::2")
    return int(m.group(1)), int(m.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", nargs="+", default=["dev"], choices=list(CORPORA))
    parser.add_argument("--corpus", nargs="*", type=Path, default=[], help="other corpus files")
    parser.add_argument("--reader", choices=("rule", "model", "both"), default="rule")
    parser.add_argument("--model", help="the miner model's spec (local, an endpoint URL, ...)")
    parser.add_argument(
        "--reading",
        choices=READINGS,
        default="values",
        help="values: the model names the value of the rules' bare rejections; turns: it also "
        "reads the turns the rules read nothing in (a signal kept where they see a cue)",
    )
    parser.add_argument(
        "--lines",
        default="",
        metavar="START::STEP",
        help="read every STEP-th line from START (0::2 the even lines of a corpus)",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--fresh", action="store_true", help="discard saved model answers")
    parser.add_argument("--show-errors", action="store_true")
    args = parser.parse_args()
    if args.reader != "rule" and not args.model:
        parser.error("--reader model or both needs --model SPEC")
    for path in args.corpus:
        if not path.is_file():
            parser.error(f"--corpus {path}: no such file")
    out = RESULTS / "followups.json"
    rows = json.loads(out.read_text())["runs"] if out.exists() else []
    code = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    corpora = [(n, CORPORA[n]) for n in args.corpora] + [(p.stem, p) for p in args.corpus]
    start, step = _lines(parser, args.lines)
    for name, path in corpora:
        every = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        lines = range(start, len(every), step)
        items = [every[i] for i in lines]
        shown = f"{name}[{args.lines}]" if args.lines else name
        results: dict[str, dict] = {}
        if args.reader in ("rule", "both"):
            t0 = time.monotonic()
            reads = [read_followup(it["followup"], it["reply"]) for it in items]
            wall = round(time.monotonic() - t0, 2)
            results["rule"] = {**measure(items, reads, args.show_errors), "wall_s": wall}
        if args.reader in ("model", "both"):
            reads, cost = model_reads(name, every, args, lines)
            results[f"model {args.model}"] = {**measure(items, reads, args.show_errors), **cost}
        _print_side_by_side(shown, results)
        for label, result in results.items():
            reader = "rule" if label == "rule" else "model"
            row = {
                "corpus": shown,
                "reader": reader,
                "code": code,
                "date": time.strftime("%Y-%m-%d"),
            }
            if reader == "model":
                row |= {
                    "model": args.model,
                    "reading": args.reading,
                    "loadavg": machine_info()["loadavg"],
                }
            rows.append({**row, **result})
    atomic_write_json(out, {"runs": rows})


if __name__ == "__main__":
    main()
