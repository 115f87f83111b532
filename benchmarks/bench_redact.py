"""Redaction measured on the test corpora: selftaught's table against `detect-secrets` (Yelp's
maintained detector, its default plugins), as recall on secrets and false positives on
secret-free technical text.

    pip install detect-secrets   # optional: without it only the table is measured
    python benchmarks/bench_redact.py

A secret counts as caught when it is gone from the text after redaction (for detect-secrets:
after every value it reports is replaced). A clean text counts as a false positive when
anything in it is redacted (reported). Writes benchmarks/results/redact.json.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the corpora live in the tests

from common import RESULTS  # noqa: E402

from selftaught.redact import Redactor  # noqa: E402
from selftaught.runs import atomic_write_json  # noqa: E402
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


def main() -> None:
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
    atomic_write_json(RESULTS / "redact.json", results)


if __name__ == "__main__":
    main()
