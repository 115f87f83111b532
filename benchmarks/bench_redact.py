"""Redaction measured on the test corpora: selftaught's table against `detect-secrets` (Yelp's
maintained detector, its default plugins), as recall on secrets and false positives on
secret-free technical text.

    pip install detect-secrets   # optional: without it only the table is measured
    python benchmarks/bench_redact.py [--out redact.json]

A secret counts as caught when it is gone from the text after redaction (for detect-secrets:
after every value it reports is replaced). A clean text counts as a false positive when
anything in it is redacted (reported).

Then time (the table only): each built-in pattern's worst on the adversarial inputs of
`tests/redact_fuzz.py` (100 KB each, built from the pattern's own literals), the whole table
on the inputs that froze the proxy (issue 49), and the whole table on 1.5 MB of this repo's
docs and source (as one text, and one text per file). A run still going after its cap is
stopped (SIGALRM) and shown as at least the cap. Uses only what the table had before round
four, so `PYTHONPATH=<old>/src python benchmarks/bench_redact.py --out <name>` measures an
older table the same way. Writes benchmarks/results/redact.json (or --out).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the corpora live in the tests

from common import RESULTS, machine_info  # noqa: E402

from selftaught.redact import BUILTIN_PATTERNS, Redactor, _apply  # noqa: E402
from selftaught.runs import atomic_write_json  # noqa: E402
from tests.redact_fuzz import adversarial_texts  # noqa: E402
from tests.test_sleep_redact import (  # noqa: E402
    clean_corpus,
    pasted_secrets,
    secrets_corpus,
    technical_text,
)


def detect_secrets_redactor() -> Callable[[str], str] | None:
    """detect-secrets as it scans a repository (its default plugins and filters: entropy
    limits, heuristics), one text per temporary file."""
    try:
        from detect_secrets import SecretsCollection
        from detect_secrets.settings import default_settings
    except ImportError:
        return None

    def redact(text: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "pasted.txt"
            path.write_text(text, encoding="utf-8")
            collection = SecretsCollection()
            with default_settings():
                collection.scan_file(str(path))
            found = {s.secret_value for _, s in collection if s.secret_value}
        for value in sorted(found, key=len, reverse=True):
            text = text.replace(value, "[REDACTED]")
        return text

    return redact


def measure(redact: Callable[[str], str], secrets_: list, clean: list[str]) -> dict:
    missed = [text for text, secret in secrets_ if secret in redact(text)]
    flagged = [text for text in clean if redact(text) != text]
    return {
        "secrets": len(secrets_),
        "recall": round(1 - len(missed) / len(secrets_), 4),
        "clean": len(clean),
        "false_positive_rate": round(len(flagged) / len(clean), 4),
        "missed": [m[:100] for m in missed],
        "false_positives": [f[:100] for f in flagged],
    }


SIZE = 100_000
FROZE_THE_PROXY = {  # issue 49's inputs, and the cubic one found while fixing them
    "curl ": "curl " * 20_000,
    "mysql ": "mysql " * 16_667,
    "eyJ-": "eyJ-" * 25_000,
    "sshpass ": "sshpass " * 12_500,
    "password for + spaces": "password for" + " " * 99_988,
}


class _Stopped(Exception):
    pass


def timed(fn: Callable[[], Any], cap_s: float) -> float:
    """Seconds `fn()` took; `math.inf` when it was stopped at `cap_s` (the regex engine
    checks for signals, so a SIGALRM ends even a runaway match)."""

    def stop(*_: object) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, cap_s)
    start = time.perf_counter()
    try:
        fn()
    except _Stopped:
        return math.inf
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.perf_counter() - start


def shown(seconds: float, cap_s: float) -> float | str:
    return round(seconds, 4) if seconds != math.inf else f">= {cap_s:g}"


def pattern_times(cap_s: float = 10.0) -> dict:
    """Each pattern's worst time on its adversarial inputs (a pattern stops at its first
    input that reaches the cap)."""
    rows = []
    for i, pattern in enumerate(BUILTIN_PATTERNS):
        worst, worst_text, inputs = 0.0, "", 0
        for text in adversarial_texts(pattern.regex, SIZE):
            took = timed(lambda p=pattern, t=text: _apply(p, t), cap_s)
            inputs += 1
            if took > worst:
                worst, worst_text = took, text
            if took == math.inf:
                break
        rows.append(
            {"pattern": f"{i}-{pattern.name}", "inputs": inputs, "worst_s": shown(worst, cap_s),
             "worst_input": worst_text[:40], "seconds": worst}
        )  # fmt: skip
    over = [r["pattern"] for r in rows if r["seconds"] >= 1.0]
    worst = max(rows, key=lambda r: r["seconds"])
    for row in rows:
        del row["seconds"]
    return {"size": SIZE, "over_1s": over, "worst": worst, "patterns": rows}


def mixed_text() -> list[str]:
    files = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "src").rglob("*.py"))
    parts, size = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        parts.append(text[: 1_500_000 - size])
        size += len(parts[-1])
        if size >= 1_500_000:
            break
    return parts


def table_times(table: Redactor, cap_s: float = 60.0) -> dict:
    froze = {
        name: shown(timed(lambda t=text: table.redact(t), cap_s), cap_s)
        for name, text in FROZE_THE_PROXY.items()
    }
    parts = mixed_text()
    whole = "\n".join(parts)
    return {
        "froze_the_proxy_100KB_s": froze,
        "mixed_1.5MB_one_text_s": shown(timed(lambda: table.redact(whole), cap_s), cap_s),
        "mixed_1.5MB_per_file_s": shown(
            timed(lambda: [table.redact(p) for p in parts], cap_s), cap_s
        ),
        "mixed_files": len(parts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="redact.json", help="file name under results/")
    args = parser.parse_args()
    table = Redactor()
    systems: dict[str, Callable[[str], str]] = {"selftaught": lambda t: table.redact(t)[0]}
    other = detect_secrets_redactor()
    if other is not None:
        systems["detect-secrets"] = other
        systems["both"] = lambda t: other(table.redact(t)[0])
    corpora = {
        "first (tests: secrets_corpus / clean_corpus)": (secrets_corpus(), clean_corpus()),
        "pasted (tests: pasted_secrets / technical_text)": (pasted_secrets(), technical_text()),
    }
    results: dict = {}
    for corpus, (secrets_, clean) in corpora.items():
        for name, redact in systems.items():
            row = measure(redact, secrets_, clean)
            results.setdefault(corpus, {})[name] = row
            print(
                f"{corpus:50s} {name:15s} recall {row['recall']:7.1%} of {row['secrets']}"
                f"   false positives {row['false_positive_rate']:6.1%} of {row['clean']}"
            )
    if other is None:
        print("detect-secrets is not installed: only the table was measured")
    results["time"] = {"patterns": pattern_times(), "table": table_times(table)}
    worst = results["time"]["patterns"]["worst"]
    print(f"worst pattern on 100 KB: {worst['pattern']} {worst['worst_s']} s")
    print(f"over 1 s: {results['time']['patterns']['over_1s']}")
    for name, value in results["time"]["table"].items():
        print(f"{name}: {value}")
    results["machine"] = machine_info()
    atomic_write_json(RESULTS / args.out, results)


if __name__ == "__main__":
    main()
