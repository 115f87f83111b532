"""Word and number tokens of a text, shared by the edit guard, routing and retrieval (the one
notion of a duplicate has its own: `selftaught.duplicates`)."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def numbers(text: str) -> list[str]:
    """The numbers of a text as digit strings, in order (signs and thousands separators
    dropped: a mangled copy often loses them)."""
    return _NUMBER.findall(text.replace(",", ""))
