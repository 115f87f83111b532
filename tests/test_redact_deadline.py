"""The redaction deadline (security round four): a text that cannot be redacted in time is
withheld whole, never stored as it came, and counted; long texts are searched a window at a
time so the deadline cannot be outrun inside one regex call; windows and the patterns' gates
change nothing that is redacted."""

from __future__ import annotations

import dataclasses
import random
import re
import string
import time

import pytest

from selftaught.errors import ConfigError
from selftaught.redact import (
    BUILTIN_PATTERNS,
    DEADLINE_ENV,
    DEFAULT_DEADLINE_S,
    WITHHELD,
    Redactor,
    _fold,
    default_deadline_s,
)
from tests.redact_fuzz import witnesses
from tests.test_sleep_redact import clean_corpus, pasted_secrets, secrets_corpus, technical_text


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


# ---- the deadline: fails closed, cannot be outrun inside one pattern --------------------------


def test_a_text_past_the_deadline_is_withheld_never_stored_as_is():
    # a quadratic pattern of the operator's own, on 1 MB: without windows it would run for
    # hours inside one regex call, where no deadline can be checked
    secret = "sk-" + "Zq9" * 16
    text = "a" * 1_000_000 + " " + secret
    redactor = Redactor([r"a[^\n]*?z"], deadline_s=0.2, window=4000, overlap=200)
    (out, n), took = _timed(redactor.redact, text)
    assert out == WITHHELD.format(len(text)) and n == 1
    assert secret not in out and redactor.withheld == 1
    assert took < 3.0, f"{took:.1f}s"


def test_one_deadline_covers_a_whole_value_and_counts_what_it_withheld():
    redactor = Redactor()
    deadline = redactor.deadline()
    deadline.expires = time.monotonic() - 1  # already spent, as by a row's earlier fields
    value = {"messages": [{"role": "user", "content": "my password is hunter2x!"}], "n": 3}
    out, n = redactor.redact_value(value, deadline)
    assert out["messages"][0]["content"] == WITHHELD.format(len("my password is hunter2x!"))
    assert out["messages"][0]["role"] == WITHHELD.format(4) and out["n"] == 3
    assert n == 2 and deadline.withheld == 2 and redactor.withheld == 2


def test_the_task_log_stores_a_placeholder_for_a_row_past_its_deadline(log_at):
    from selftaught.sleep.intake.log import Interaction, TaskLog

    slow = Redactor([r"a[^\n]*?z"], deadline_s=0.2, window=4000, overlap=200)
    secret = "hunter2-Xk9#mQ2"
    it = Interaction(
        messages=[{"role": "user", "content": "a" * 400_000 + f" password: {secret}"}],
        reply=f"your password is {secret}",
        project="p",
        source="proxy",
    )
    log = TaskLog(log_at, redactor=slow)
    assert log.add(it)
    back = log.get(it.id)
    stored = str(back.messages) + str(back.reply)
    assert secret not in stored and "redaction timed out" in back.messages[0]["content"]
    assert back.reply == WITHHELD.format(len(it.reply))  # the row's deadline was spent
    assert back.redactions >= 2 and slow.withheld >= 2
    log.close()


def test_the_deadline_is_one_setting_with_a_default(monkeypatch):
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    assert default_deadline_s() == DEFAULT_DEADLINE_S == Redactor().deadline_s
    monkeypatch.setenv(DEADLINE_ENV, "0.5")
    assert Redactor().deadline_s == 0.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(DEADLINE_ENV, bad)
        with pytest.raises(ConfigError, match=DEADLINE_ENV):
            Redactor()
    with pytest.raises(ConfigError, match="deadline"):
        Redactor(deadline_s=0)


# ---- windows and gates change nothing that is redacted ----------------------------------------


def _long_text(rng: random.Random) -> str:
    """Every corpus text, secret or clean, joined by filler of random lengths, so that the
    windows' edges fall everywhere, inside secrets too."""
    texts = [t for t, _ in secrets_corpus()] + [t for t, _ in pasted_secrets()]
    texts += clean_corpus() + technical_text()
    rng.shuffle(texts)
    return "".join(t + " " + "lorem ipsum " * rng.randint(0, 40) + "\n" for t in texts)


def test_windows_redact_exactly_what_one_pass_over_the_text_does():
    rng = random.Random(7)
    text = _long_text(rng)
    key = "-----BEGIN RSA PRIVATE KEY-----\n" + "QUJD" * 1500 + "\n-----END RSA PRIVATE KEY-----"
    token = "sk-proj-" + "Ab1" * 2000  # longer than the overlap: runs past a window's edge
    text = text[:5000] + key + " " + token + " " + text[5000:]
    whole = Redactor(window=10**9).redact(text)
    for window, overlap in [(997, 1200), (4096, 1500), (20_011, 2048)]:
        assert Redactor(window=window, overlap=overlap).redact(text) == whole, window
    out = whole[0]
    assert "QUJD" not in out and "Ab1Ab1" not in out


def test_gates_skip_only_patterns_that_cannot_match():
    gated = Redactor(window=2000, overlap=1500)
    ungated = Redactor(window=2000, overlap=1500)
    ungated.patterns = [dataclasses.replace(p, gate=()) for p in ungated.patterns]
    texts = [t for t, _ in secrets_corpus()] + [t for t, _ in pasted_secrets()]
    texts += clean_corpus() + technical_text()
    texts += [w for p in BUILTIN_PATTERNS for w in witnesses(p.regex)]
    texts += [t.upper() for t in texts] + [t.swapcase() for t in texts]
    # letters outside ASCII that a case-blind pattern reads as s, i and k
    texts += ["PA\u017f\u017fWORD = hunter2x!", "the \u0130d_token: aB3dE5gH7jK9mN1pQ"]
    texts += ["api_\u212aey = aB3dE5gH7jK9mN1pQ"]
    texts += [_long_text(random.Random(3))]
    for text in texts:
        assert gated.redact(text) == ungated.redact(text), text[:80]


def test_folding_finds_every_letter_a_case_blind_pattern_takes_for_ascii():
    every = "".join(map(chr, range(0x110000)))
    folded = _fold(every)
    assert len(folded) == len(every)  # positions in the folded text are the text's
    for m in re.finditer(r"(?i)[a-z]", every):
        assert folded[m.start()] in string.ascii_lowercase, hex(ord(m.group()))
