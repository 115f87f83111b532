"""Routing among many skills: which one fits a request.

A project can hold several skills, each with a name, a one-line description written for
routing, and the train tasks it was learned on. The router scores every skill against a
request with lexical BM25 (the `retrieval` extra, as demo retrieval does) over the skill's
description and each of its tasks; a skill's score is its best document's, so one near task
is enough and a long list of tasks is not penalised for its length. English stop words
("the", "is", ...: bm25s's list) are left out on both sides, since BM25 gives every shared
word a positive weight and "the" alone would route a request. A request that shares no other
word with any skill routes to none: the agent gets no skill rather than a wrong one.

Names follow Claude Code's skill rule (lower-case letters, digits and hyphens, at most 64
characters), so one name serves every place a skill is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from selftaught.errors import InputError
from selftaught.retrieval import bm25s_module
from selftaught.text import words

NAME_MAX = 64
DESCRIPTION_MAX = 1024
_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _terms(text: str) -> list[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return [w for w in words(text) if w not in STOPWORDS_EN]


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
    """The routing decision for one request (logged per row)."""

    skill: str | None
    score: float
    runner_up: str | None = None
    runner_up_score: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "skill": self.skill,
            "score": round(self.score, 4),
            "runner_up": self.runner_up,
            "runner_up_score": round(self.runner_up_score, 4),
        }


class SkillRouter:
    """BM25 over each skill's description and tasks; the best-scoring skill wins."""

    def __init__(self, cards: Sequence[SkillCard]):
        names = [c.name for c in cards]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise SkillNameError(f"two skills share a name: {', '.join(dup)}")
        self.cards = tuple(cards)
        self._owner: list[int] = []
        docs: list[list[str]] = []
        for i, card in enumerate(self.cards):
            for text in (card.description, *card.tasks):
                docs.append(_terms(text) or ["\x00"])
                self._owner.append(i)
        self._index = None
        if docs:
            self._index = bm25s_module().BM25()
            self._index.index(docs, show_progress=False)

    def scores(self, text: str) -> list[float]:
        """Each skill's score for `text` (card order): its best document's BM25 score."""
        best = [0.0] * len(self.cards)
        query = _terms(text)
        if not query or self._index is None:
            return best
        for doc, score in enumerate(self._index.get_scores(query)):
            owner = self._owner[doc]
            best[owner] = max(best[owner], float(score))
        return best

    def route(self, text: str) -> Route:
        """The skill that fits `text` best (ties: the first card), or none when no skill
        shares a word with it."""
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
