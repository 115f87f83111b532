"""Word and number tokens of a text, shared by the edit guard, routing and retrieval (the one
notion of a duplicate has its own: `selftaught.duplicates`)."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+")
# English words too common to say what a text is about (bm25s's list): a request that shares
# only these with a skill's card or a kind's words is not of it (routing, kinds, clustering)
STOP_WORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
     "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
     "these", "they", "this", "to", "was", "will", "with")
)  # fmt: skip
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def numbers(text: str) -> list[str]:
    """The numbers of a text as digit strings, in order (signs and thousands separators
    dropped: a mangled copy often loses them)."""
    return _NUMBER.findall(text.replace(",", ""))
