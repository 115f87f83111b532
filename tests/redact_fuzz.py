"""Adversarial inputs for a redaction pattern, built from its own literals: witness strings
walked out of the regex (an alternation branch at a time), then each witness, its prefixes and
its near-miss (less its last character) repeated to the size asked for, bare or followed by a
space or a dash; each witness with one character pumped (to fill the size, cut there, or 64
times and repeated); and hand-picked seeds (`curl ` * N, `mysql -u` * N, `eyJ` * N). Used by
tests/test_redact_bounded.py and benchmarks/bench_redact.py."""

from __future__ import annotations

import re
import string
import sys
from typing import Any

if sys.version_info >= (3, 11):  # the parser moved into `re` (and is private) in 3.11
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
else:  # pragma: no cover
    import sre_constants
    import sre_parse

C = sre_constants
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT))
_ATOMIC = getattr(C, "ATOMIC_GROUP", C.SUBPATTERN)  # 3.11+

# Candidate characters for a class, most "token-like" first.
_CANDIDATES = "a1A -_./:=@'\"\n|;&+~x0zZ9"

# Hand-picked: the prefixes that made the table quadratic, and the near-misses around them.
SEEDS = (
    "curl ",
    "curl -u ",
    "curl -u a",
    "mysql ",
    "mysql -u",
    "mysql -u root ",
    "mysql -p'",
    "sshpass ",
    "sshpass -p ",
    "docker login ",
    "eyJ",
    "eyJaaaaaaaaaa.",
    "eyJaaaaaaaaaa.aaaaaaaaaa.",
    "password",
    "password for ",
    "password = ",
    "aws secret ",
    "aws_",
    "token ",
    "api key is ",
    "-----BEGIN ",
    "-----BEGIN A ",
    "-----BEGIN RSA PRIVATE KEY-----",
    "https://",
    "https://a:",
    "https://a:b",
    "machine a login ",
    "--password=",
    "AKIAAAAAAAAAAAAAAAAA ",
    "a_",
    "a-",
    "secret",
    "x",
    " ",
)


def _in_set(items: list[tuple[Any, Any]], ch: str) -> bool:
    negate = bool(items) and items[0][0] is C.NEGATE
    hit = False
    for op, av in items[1:] if negate else items:
        if op is C.LITERAL:
            hit = ord(ch) == av
        elif op is C.RANGE:
            hit = av[0] <= ord(ch) <= av[1]
        elif op is C.CATEGORY:
            hit = {
                C.CATEGORY_DIGIT: ch.isdigit(),
                C.CATEGORY_NOT_DIGIT: not ch.isdigit(),
                C.CATEGORY_SPACE: ch.isspace(),
                C.CATEGORY_NOT_SPACE: not ch.isspace(),
                C.CATEGORY_WORD: ch.isalnum() or ch == "_",
                C.CATEGORY_NOT_WORD: not (ch.isalnum() or ch == "_"),
            }.get(av, False)
        if hit:
            break
    return hit != negate


def _one_char(op: Any, av: Any, gap: bool = False) -> str:
    # a gap: words apart; then any printable character the class allows
    candidates = (" " + _CANDIDATES if gap else _CANDIDATES) + string.printable
    if op is C.LITERAL:
        return chr(av)
    if op is C.NOT_LITERAL:
        return next(c for c in candidates if ord(c) != av)
    if op is C.ANY:
        return "a"
    if op is C.CATEGORY:
        return next((c for c in candidates if _in_set([(C.CATEGORY, av)], c)), "")
    if op is C.IN:
        return next((c for c in candidates if _in_set(av, c)), "")
    return ""


def _walk(parsed: Any, branch: int, gap: bool = False) -> str:
    """One string the pattern's literals spell out: alternation `branch` (or the last one)
    everywhere, every repeat at its minimum (at least once; a space where a gap may be
    empty), assertions skipped."""
    out = []
    for op, av in parsed:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.CATEGORY, C.IN):
            out.append(_one_char(op, av, gap))
        elif op in _REPEATS:
            low, high, sub = av
            times = min(max(low, 1), high)
            out.append(_walk(sub, branch, gap or low == 0) * times)
        elif op is C.SUBPATTERN:
            out.append(_walk(av[-1], branch, gap))
        elif op is _ATOMIC:
            out.append(_walk(av, branch, gap))
        elif op is C.BRANCH:
            options = av[1]
            out.append(_walk(options[min(branch, len(options) - 1)], branch, gap))
        elif op in (C.AT, C.ASSERT, C.ASSERT_NOT, C.GROUPREF):
            continue
    return "".join(out)


def _branches(parsed: Any) -> int:
    most = 1
    for op, av in parsed:
        if op is C.BRANCH:
            most = max(most, len(av[1]), *(_branches(sub) for sub in av[1]))
        elif op in _REPEATS:
            most = max(most, _branches(av[2]))
        elif op is C.SUBPATTERN:
            most = max(most, _branches(av[-1]))
    return most


def witnesses(regex: re.Pattern[str], limit: int = 4) -> list[str]:
    """Up to `limit` strings spelled from the pattern's literals (first, last and middle
    alternation branches)."""
    parsed = sre_parse.parse(regex.pattern, regex.flags & ~re.UNICODE)
    n = _branches(parsed)
    picks = sorted({0, n - 1, *range(0, n, max(1, n // max(1, limit - 2)))})[:limit]
    return list(dict.fromkeys(_walk(parsed, b) for b in picks))


def _cuts(word: str, most: int) -> list[int]:
    """Where a prefix of `word` ends: each change of character kind, at most `most`."""
    kinds = [c.isalpha() * 1 + c.isdigit() * 2 + c.isspace() * 4 for c in word]
    cuts = [i for i in range(1, len(word)) if kinds[i] != kinds[i - 1] or word[i - 1] != word[i]]
    if len(cuts) > most:
        step = len(cuts) / most
        cuts = [cuts[int(k * step)] for k in range(most)]
    return cuts


def repeat(piece: str, size: int) -> str:
    return (piece * (size // max(1, len(piece)) + 1))[:size]


def adversarial_pieces(regex: re.Pattern[str], cuts: int = 6) -> list[str]:
    """The pieces to repeat for one pattern: its witnesses, their prefixes and near-misses,
    bare and followed by a space or a dash (inside most token classes, outside `\\b`),
    then the hand-picked seeds."""
    pieces: list[str] = []
    for word in witnesses(regex):
        for piece in [word, word[:-1], *(word[:i] for i in _cuts(word, cuts))]:
            if piece:
                pieces += [piece, piece + " ", piece + "-"]
    return list(dict.fromkeys(pieces + list(SEEDS)))


def pumped(regex: re.Pattern[str], size: int, cuts: int = 12) -> list[str]:
    """Each witness cut after one of its characters, that character repeated to fill `size`
    (one start, one long run that never matches: "password for" + 100 KB of spaces), and the
    witness with it repeated 64 times, repeated to `size` (many starts, each with a run)."""
    texts: list[str] = []
    for word in witnesses(regex):
        for i in [0, *_cuts(word, cuts)]:
            head, ch, tail = word[:i], word[i], word[i + 1 :]
            texts.append(head + ch * (size - len(head)))  # and no tail: nothing can match
            texts.append(repeat(head + ch * 64 + tail, size))
    return list(dict.fromkeys(texts))


def adversarial_texts(regex: re.Pattern[str], size: int) -> list[str]:
    """Every adversarial text of `size` characters for one pattern."""
    return [repeat(piece, size) for piece in adversarial_pieces(regex)] + pumped(regex, size)
