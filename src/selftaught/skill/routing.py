"""Routing among many skills: which one fits a request.

A project can hold several skills, each with a name, a one-line description written for
routing, and the train tasks it was learned on. The router scores every skill against a
request with lexical BM25 (the `retrieval` extra, as demo retrieval does) over the skill's
description and each of its tasks; a skill's score is its best document's, so one near task
is enough and a long list of tasks is not penalised for its length. English stop words
("the", "is", ...: `text.STOP_WORDS`, bm25s's list) are left out on both sides, since BM25
gives every shared word a positive weight and "the" alone would route a request. A request
that shares no other word with any skill routes to none: the agent gets no skill rather than
a wrong one.

**Kinds first, cards for the rest.** With the kinds a project's nights found
(`KindIndex`: each kind's word centroid, `sleep/night/kinds.py`), a request is first asked
which kind it is of (`KindIndex.kind_of`): the kind whose centroid its words are most like, when
their cosine reaches the index's `similarity`; of no kind otherwise. Every kind counts, whether
its skill is served or not, so a request of a kind with no skill of its own goes to no skill
(the project's own skill, or the base) rather than to another kind's skill it shares a word
with. A request of no kind is then routed by BM25 over the cards of the skills that are no
kind (a user's SKILL.md no night has seen traffic of yet, a skill adopted before kinds
existed): a description is the only evidence such a skill has, and it is asked only about the
requests no kind claims. A skill whose name is a kind is routed by its kind alone: its
traffic, not its description's words, says what it serves. A night gives its tasks their
kinds by the same question (`find_kinds`), so a night trains and measures each skill on the
requests the proxy sends it.

Names follow Claude Code's skill rule (lower-case letters, digits and hyphens, at most 64
characters), so one name serves every place a skill is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from selftaught.errors import InputError
from selftaught.retrieval import bm25s_module
from selftaught.skill.clustering import word_vector
from selftaught.text import STOP_WORDS, words

NAME_MAX = 64
KIND_SIMILARITY = 0.5  # the cosine that makes words one kind's (`KindIndex`, `KindConfig`)
DESCRIPTION_MAX = 1024
_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _terms(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOP_WORDS]


class SkillNameError(InputError):
    """A skill name or description that no agent would accept."""


def slug_name(text: str, fallback: str = "skill") -> str:
    """`text` as a valid skill name: lower-case words joined by hyphens, cut at 64."""
    slug = "-".join(re.findall(r"[a-z0-9]+", text.lower()))[:NAME_MAX].strip("-")
    return slug or fallback


def check_name(name: str) -> str:
    """`name` when it is a valid skill name, else a clear error."""
    if len(name) > NAME_MAX or not _NAME_RE.match(name):
        raise SkillNameError(
            f"skill name {name!r} is not valid: lower-case letters, digits and single hyphens, "
            f"at most {NAME_MAX} characters (e.g. {slug_name(name)!r})"
        )
    return name


def check_description(description: str) -> str:
    """One line of at most 1,024 characters: what a router and an agent read."""
    line = " ".join(description.split())
    if not line:
        raise SkillNameError("a skill needs a one-line description (it is what routes to it)")
    if len(line) > DESCRIPTION_MAX:
        raise SkillNameError(
            f"skill description is {len(line)} characters; at most {DESCRIPTION_MAX}"
        )
    return line


@dataclass(frozen=True)
class SkillCard:
    """What the router knows of one skill: never its body, only what describes its scope."""

    name: str
    description: str
    tasks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name)
        object.__setattr__(self, "description", check_description(self.description))


@dataclass(frozen=True)
class Route:
    """The routing decision for one request (logged per row). `kind`: the kind the request is
    of (None: of no kind, or no kinds known); then `score` is its cosine with that kind and the
    runner-up is the next kind (`KindIndex`), else they are the cards' BM25 scores."""

    skill: str | None
    score: float
    runner_up: str | None = None
    runner_up_score: float = 0.0
    kind: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "skill": self.skill,
            "kind": self.kind,
            "score": round(self.score, 4),
            "runner_up": self.runner_up,
            "runner_up_score": round(self.runner_up_score, 4),
        }


@dataclass(frozen=True)
class KindIndex:
    """The kinds a request may be of: each kind's word centroid (L2-normalised; kind id ->
    word -> weight) and the cosine a request must reach to be of one. Built once per set of
    kinds: routing a request costs its words' look-ups, not a pass over every centroid."""

    centroids: Mapping[str, Mapping[str, float]]
    similarity: float = KIND_SIMILARITY
    ids: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    """The kinds that can claim a request (those with words), in order."""
    _postings: dict[str, list[tuple[int, float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        ids: list[str] = []
        for kind, centroid in self.centroids.items():
            if centroid:  # a kind with no words yet claims no request
                for word, weight in centroid.items():
                    self._postings.setdefault(word, []).append((len(ids), weight))
                ids.append(kind)
        object.__setattr__(self, "ids", tuple(ids))

    def ranked(self, text: str) -> list[tuple[str, float]]:
        """The two kinds most like `text`, each with its cosine (best first; ties: the first
        kind); a kind that shares no word with it is not listed."""
        sims = [0.0] * len(self.ids)
        for word, weight in word_vector(text).items():
            for i, w in self._postings.get(word, ()):
                sims[i] += weight * w
        top = sorted(range(len(self.ids)), key=lambda i: (-sims[i], i))[:2]
        return [(self.ids[i], sims[i]) for i in top if sims[i] > 0]

    def of(self, ranked: Sequence[tuple[str, float]]) -> str | None:
        """The kind a request ranked so is of: the first when it reaches `similarity`."""
        return ranked[0][0] if ranked and ranked[0][1] >= self.similarity - 1e-12 else None

    def kind_of(self, text: str) -> str | None:
        """The kind `text` is of: the one most like it when their cosine reaches
        `similarity`; None when none does."""
        return self.of(self.ranked(text))


class SkillRouter:
    """Kinds first (`KindIndex`), then BM25 over the cards of the skills that are no kind
    (module docstring); a request neither claims goes to no skill."""

    def __init__(self, cards: Sequence[SkillCard], kinds: KindIndex | None = None):
        names = [c.name for c in cards]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise SkillNameError(f"two skills share a name: {', '.join(dup)}")
        self.cards = tuple(cards)
        self.kinds = kinds
        known = set(kinds.ids) if kinds is not None else set()
        self._owner: list[int] = []
        docs: list[list[str]] = []
        for i, card in enumerate(self.cards):
            if card.name in known:
                continue  # a kind's skill: routed by its kind alone
            for text in (card.description, *card.tasks):
                docs.append(_terms(text) or ["\x00"])
                self._owner.append(i)
        self._index = None
        if docs:
            self._index = bm25s_module().BM25()
            self._index.index(docs, show_progress=False)

    def scores(self, text: str) -> list[float]:
        """Each skill's card score for `text` (card order): its best document's BM25 score (0
        for a skill that is a kind)."""
        best = [0.0] * len(self.cards)
        query = _terms(text)
        if not query or self._index is None:
            return best
        for doc, score in enumerate(self._index.get_scores(query)):
            owner = self._owner[doc]
            best[owner] = max(best[owner], float(score))
        return best

    def route(self, text: str) -> Route:
        """The kind's skill when `text` is of a kind (None when that kind has no skill here),
        else the card that fits it best (ties: the first card), else none."""
        if self.kinds is not None:
            ranked = self.kinds.ranked(text)
            if (kind := self.kinds.of(ranked)) is not None:
                score = ranked[0][1]
                second = ranked[1] if len(ranked) > 1 else (None, 0.0)
                skill = kind if any(c.name == kind for c in self.cards) else None
                return Route(skill, score, second[0], second[1], kind=kind)
        return self._by_card(text)

    def _by_card(self, text: str) -> Route:
        ranked = sorted(((-s, i) for i, s in enumerate(self.scores(text)) if s > 0))
        if not ranked:
            return Route(skill=None, score=0.0)
        top_score, top = -ranked[0][0], ranked[0][1]
        if len(ranked) == 1:
            return Route(skill=self.cards[top].name, score=top_score)
        second_score, second = -ranked[1][0], ranked[1][1]
        return Route(
            skill=self.cards[top].name,
            score=top_score,
            runner_up=self.cards[second].name,
            runner_up_score=second_score,
        )
