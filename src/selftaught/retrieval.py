"""Retrieval of demonstrations: per example, the K demos of a pool most similar to it.

Lexical BM25 with the maintained `bm25s` library (an optional extra:
``pip install "selftaught[retrieval]"``); no embedding model, so it works offline. Both sides
are tokenized into lower-case words and numbers (`selftaught.text`; single digits kept:
"3 + 4" and "3 + 5" differ). A demo that shares no token with the request is never shown, and
neither is a demo made from the example itself (by id): retrieval for a val item draws on
train demos only.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

from selftaught.demos import Demo
from selftaught.errors import MissingDependency
from selftaught.text import words

EXTRA_HINT = 'pip install "selftaught[retrieval]" (adds bm25s)'


class RetrievalUnavailable(MissingDependency):
    """Retrieval was asked for but `bm25s` is not installed."""


def bm25s_module() -> Any:
    """The `bm25s` module, or a clear error naming the extra to install."""
    try:
        import bm25s
    except ImportError as err:
        raise RetrievalUnavailable(
            f"retrieving demonstrations per request needs the bm25s library: {EXTRA_HINT}"
        ) from err
    return bm25s


def available() -> bool:
    try:
        bm25s_module()
    except RetrievalUnavailable:
        return False
    return True


class DemoRetriever:
    """A BM25 index over a pool of demos' inputs."""

    def __init__(self, demos: Sequence[Demo]):
        self.demos = tuple(demos)
        self._index: Any = None
        tokens = [words(d.input_text()) or ["\x00"] for d in self.demos]
        if self.demos:
            self._index = bm25s_module().BM25()
            self._index.index(tokens, show_progress=False)

    def scores(self, query: str) -> list[float]:
        """BM25 score of every demo for `query` (pool order)."""
        q = words(query)
        if not q or self._index is None:
            return [0.0] * len(self.demos)
        return [float(x) for x in self._index.get_scores(q)]

    def pick(self, query: str, k: int, exclude: Collection[str] = ()) -> tuple[Demo, ...]:
        """The `k` demos most similar to `query` (best first; ties in pool order), leaving out
        those whose id is in `exclude` and those sharing no token with it."""
        ranked = sorted(
            (
                (-s, i)
                for i, s in enumerate(self.scores(query))
                if s > 0 and self.demos[i].id not in exclude
            ),
        )
        return tuple(self.demos[i] for _, i in ranked[:k])


@functools.lru_cache(maxsize=16)
def retriever_for(demos: tuple[Demo, ...]) -> DemoRetriever:
    """One index per pool (a policy, the proxy's adopted version), built once."""
    return DemoRetriever(demos)
