"""The keys this process was given (a model's, the proxy's, the vendors' variables), and
`scrub_secrets`, which cuts them from any text. A leaf module: the error root cuts them from
a backend's message where the error is built, and the redactor (`selftaught.redact`) from
every text it redacts."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

MARK = "[REDACTED:{}]"
"""What a redacted secret is replaced by (its kind in the braces)."""

# The variables that hold API keys; their values are scrubbed like the keys given in code.
KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "SELFTAUGHT_API_KEY",
)
# A shorter key is not scrubbed: it would cut ordinary words (a local server's "EMPTY", "k").
MIN_SECRET_CHARS = 8
_given: set[str] = set()
_given_lock = threading.Lock()


def add_secret(value: str | None) -> None:
    """Remember a key this process was given (a model's, the proxy's), so that every text
    redacted from now on has it replaced, whatever it looks like."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _given_lock:
            _given.add(value)


def known_secrets() -> list[str]:
    """The keys given (`add_secret`) and those in KEY_VARIABLES, longest first (a key that
    holds another is replaced whole)."""
    with _given_lock:
        keys = set(_given)
    keys.update(v for v in (os.environ.get(name, "") for name in KEY_VARIABLES) if v)
    return sorted((k for k in keys if len(k) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub_secrets(text: str, secrets: Iterable[str] | None = None) -> tuple[str, int]:
    """`text` with each known key (or each of `secrets`) replaced, and how many were."""
    total = 0
    for secret in known_secrets() if secrets is None else secrets:
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            total += text.count(secret)
            text = text.replace(secret, MARK.format("api_key"))
    return text, total
