"""One notion of "the same item", for every place that asks: merging a night's requests,
splitting them, recalling past ones, dreaming variants, re-asks, and every leak guard (demos,
a night's weight data, `train --method dpo`'s preference prompts).

Real traffic is full of one template with different values ("Which day comes 2 days after
Wednesday?" / "... after Saturday?"): those are different items, with different answers. A
resend, a rewording or a politer copy of one request is the same item. A text's **values** are
what tells one instance of a template from another: its numbers and math symbols in order
(`numbers`: "5 - 3" is not "3 - 5" nor "5 * 3"), and its named values: words written as names
(capitalised mid-sentence: "Saturday", "Paris", "JSON"), quoted words, day and month names.
Two texts are the same item when

1. they are the same words, numbers and symbols (case, spacing, punctuation and politeness
   words such as "please" or "could you" aside): a resend, whatever its labels say; else
2. their numbers and symbols are equal, in order, and so are their named values (counted in
   both texts, whichever text wrote them as a name: "france" and "France" are one value); and
3. when both have one shape (as many tokens, most of them equal in place: one template,
   not a reordered sentence), the tokens that differ are not values ("Alice gave Bob" is not
   "Bob gave Alice"), and their references, when both are known, agree (a value no rule
   here recognises shows in the answers: "translate: the cat" / "translate: the dog"); and
4. the other words that say what is asked (stop words and politeness aside) overlap at
   `word_share` Jaccard or more (`WORD_SHARE`, a night's `MineConfig.near_duplicate`), in
   any order ("What is the capital of France?" / "The capital of France is what?").

A key (`item_key`) is computed once per text (cached) with linear-time regexes; an index
(`DuplicateIndex`) compares a key only with the keys of equal numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

WORD_SHARE = 0.8
"""Default share of what-is-asked words two texts with the same values need in common."""

T = TypeVar("T")

_TOKEN = re.compile(r"[^\W\d_]+|\d+(?:\.\d+)?|[-+*/×÷^=<>()\[\]{}%√&|~]")
_NUMBER_OR_SYMBOL = re.compile(r"\d|[-+*/×÷^=<>()\[\]{}%√&|~]")
# "1. " / "2) " opening a line number a list's lines: layout, not what the problem is about
_LIST_MARKER = re.compile(r"(?m)^[ \t]*\d+[.)](?=\s)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_WORD_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")  # "follow-up": a word, not a minus
_QUOTED = re.compile(r"\"([^\"\n]*)\"|“([^”\n]*)”|‘([^’\n]*)’|`([^`\n]*)`|(?<!\w)'([^'\n]*)'(?!\w)")
_SENTENCE_END = frozenset(".!?:;\n")


def _words(text: str) -> list[str]:
    return [m.group().lower() for m in _TOKEN.finditer(text) if m.group()[0].isalpha()]


POLITE = frozenset(
    _words("please pls plz kindly thanks thank thx hi hello hey dear could would can you tell me")
)
"""Words that ask politely, not what is asked: dropped before texts are compared."""
STOP = frozenset(
    _words(
        """a an the is are was were be been being am of to in on at for from by with about as
        into onto than then and or but if so that this these those it its what which who whom
        whose when where why how do does did done will shall may might must should there here
        i my we our us your he she him his her they them their s t d ll re ve m"""
    )
)
"""Words too common to say what is asked (they still count in rule 1 and in a template's
shape)."""
_CALENDAR = frozenset(
    _words(
        """monday tuesday wednesday thursday friday saturday sunday january february march
        april june july august september october november december"""
    )
)  # "may" is left out: lower-case, it is a verb; capitalised, rule 2 reads it as a name


@dataclass(frozen=True)
class ItemKey:
    """What `same_item` compares of one text (and its reference, when known)."""

    tokens: tuple[str, ...]
    """Its words (politeness dropped), numbers and math symbols, lower-case, in order."""
    numbers: tuple[str, ...]
    """Its numbers and math symbols, in order (list markers and thousands commas dropped)."""
    named: frozenset[str]
    """The words this text writes as values: names, quoted words, days and months."""
    asked: frozenset[str]
    """Its other words that say what is asked (no stop words, no politeness)."""
    reference: frozenset[str] = frozenset()
    """Its accepted answers, normalized (empty: not known)."""

    @property
    def digits(self) -> tuple[str, ...]:
        """Its numbers alone, in order."""
        return tuple(n for n in self.numbers if n[0].isdigit())

    def values(self, named: frozenset[str]) -> Counter[str]:
        """How often each of the `named` values occurs in this text."""
        return Counter(t for t in self.tokens if t in named)


def item_key(text: str, reference: Any = None) -> ItemKey:
    """The key of `text` (computed once per text) with `reference` (any accepted answer; a
    list: any of them)."""
    key = _text_key(text)
    answers = normalized_reference(reference)
    return dataclasses.replace(key, reference=answers) if answers else key


@functools.lru_cache(maxsize=8192)
def _text_key(text: str) -> ItemKey:
    text = _WORD_HYPHEN.sub(" ", _THOUSANDS.sub("", _LIST_MARKER.sub("", text)))
    tokens: list[str] = []
    named: set[str] = set()
    last = 0
    for m in _TOKEN.finditer(text):
        token = m.group()
        low = token.lower()
        if low in POLITE:
            continue  # not a token, and not where a sentence starts
        initial = not tokens or any(c in _SENTENCE_END for c in text[last : m.start()])
        last = m.end()
        tokens.append(low)
        if low in STOP or not token[0].isalpha():
            continue
        if low in _CALENDAR or (token[0].isupper() and not initial):
            named.add(low)
    for m in _QUOTED.finditer(text):
        quoted = next(g for g in m.groups() if g is not None)
        named.update(w for w in _words(quoted) if w not in STOP and w not in POLITE)
    numbers = tuple(t for t in tokens if _NUMBER_OR_SYMBOL.match(t))
    asked = {t for t in tokens if t[0].isalpha() and t not in STOP} - named
    if not (numbers or named or asked):  # nothing pins it ("Hi!", "Who is it?"): every word does
        words = _words(text)
        return ItemKey(tuple(tokens or words), (), frozenset(), frozenset(words))
    return ItemKey(tuple(tokens), numbers, frozenset(named), frozenset(asked))


_NUMERIC = re.compile(r"[-+]?\d+(?:\.\d+)?")


def normalized_reference(reference: Any) -> frozenset[str]:
    """The accepted answers of `reference` as compared (lower-case, spacing and end
    punctuation aside, a number by its value); empty when there is none."""
    if reference is None:
        return frozenset()
    refs = reference if isinstance(reference, list | tuple) else [reference]
    out = set()
    for ref in refs:
        if ref is None:
            continue
        said = " ".join(str(ref).lower().split()).strip(" .!?")
        if _NUMERIC.fullmatch(said):
            said = repr(float(said))
        if said:
            out.add(said)
    return frozenset(out)


def same_item(a: ItemKey, b: ItemKey, word_share: float = WORD_SHARE) -> bool:
    """Whether `a` and `b` are one item (the module's rules 1 to 4)."""
    if a.tokens == b.tokens:
        return True
    if a.numbers != b.numbers:
        return False
    named = a.named | b.named
    if a.values(named) != b.values(named):
        return False
    if _other_instance(a, b, named):
        return False
    union = a.asked | b.asked
    if not union - named:
        return True
    return len((a.asked & b.asked) - named) / len(union - named) >= word_share


def _other_instance(a: ItemKey, b: ItemKey, named: frozenset[str]) -> bool:
    """Two texts of one shape (as many tokens, most of them in the same places: a reordered
    sentence is not one shape) are two instances of their template when a word that differs
    is a value, or when both answers are known and differ."""
    if len(a.tokens) != len(b.tokens):
        return False
    changed = [(x, y) for x, y in zip(a.tokens, b.tokens, strict=True) if x != y]
    if 2 * len(changed) > len(a.tokens):
        return False
    if any(x in named or y in named for x, y in changed):
        return True
    return bool(a.reference and b.reference) and not a.reference & b.reference


def same_values(a: ItemKey, b: ItemKey) -> bool:
    """Whether `b` keeps `a`'s values: the same numbers in order and the same named values
    (a paraphrase may reword the operators: "3 + 4" / "3 and 4")."""
    named = a.named | b.named
    return a.digits == b.digits and a.values(named) == b.values(named)


class DuplicateIndex(Generic[T]):
    """Items by their keys, for "is this the same item as one already here?": a lookup
    compares a key with the keys of equal numbers only."""

    def __init__(self, word_share: float = WORD_SHARE) -> None:
        self.word_share = word_share
        self._buckets: dict[tuple[str, ...], list[tuple[ItemKey, T]]] = {}

    def add(self, key: ItemKey, item: T) -> None:
        self._buckets.setdefault(key.numbers, []).append((key, item))

    def find(self, key: ItemKey) -> T | None:
        """The first item added that is the same item as `key`'s (None: none is)."""
        return next(self.find_all(key), None)

    def find_all(self, key: ItemKey) -> Iterator[T]:
        """Every item added that is the same item as `key`'s, in the order added."""
        for other, item in self._buckets.get(key.numbers, ()):
            if same_item(key, other, self.word_share):
                yield item

    def remove(self, item: T) -> None:
        """Forget `item` (by identity)."""
        for bucket in self._buckets.values():
            bucket[:] = [(k, i) for k, i in bucket if i is not item]


def groups(keys: Iterable[ItemKey], word_share: float = WORD_SHARE) -> list[list[int]]:
    """The indexes of `keys` grouped into items (a text the same item as any member of a
    group joins it), each group in order, groups by their first member."""
    keys = list(keys)
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    buckets: dict[tuple[str, ...], list[int]] = {}
    for i, key in enumerate(keys):
        buckets.setdefault(key.numbers, []).append(i)
    for members in buckets.values():
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                if find(i) != find(j) and same_item(keys[i], keys[j], word_share):
                    parent[find(j)] = find(i)
    out: dict[int, list[int]] = {}
    for i in range(len(keys)):
        out.setdefault(find(i), []).append(i)
    return list(out.values())
