"""Lexical grouping of texts by intent: TF-IDF vectors, seeded spherical k-means, then merges.

No model is needed and the result is the same on every run with the same seed. A text's
vector holds its words that carry letters (numbers name an instance, not an intent), outside
quotation marks (a quoted text is the instance the request works on: "how many e's in the
text: \"...\"" is one intent whatever it quotes) unless nothing else is left, and are no
English stop word (`text.STOP_WORDS`: they are in most texts of every intent), weighted
by sublinear term frequency times a smoothed inverse document frequency that is 0 for a word
every text holds ("what" in a task whose items all ask "What is ..."), L2-normalised.

Grouping: k-means (k-means++ seeding from `seed`) over-splits on purpose (about twice as many
groups as the texts could fill at `min_size` each, at most `2 * max_groups`); groups whose
centroids' cosine is at least `merge_similarity` are one intent and merge (the closest pair
first), and while more than `max_groups` remain the closest pair merges whatever its cosine.
Then each group smaller than `min_size` (the smallest first) joins the group most similar to
it; one that shares no weighted word with any other group is left out (`Grouping.left_out`).
Texts with no weighted word at all join the largest group (all texts alike: one group).

`group_vectors` does the same on vectors made elsewhere (a night's kinds weigh words against
the kinds it knows too, `sleep/night/kinds.py`).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from selftaught.text import STOP_WORDS, words

Vector = dict[str, float]
_QUOTED = re.compile(r'"[^"\n]*"|\u201c[^\u201d\n]*\u201d')  # "..." and \u201c...\u201d


def intent_tokens(text: str) -> list[str]:
    """The words of `text` that can carry an intent: those with a letter in them, outside
    quotation marks (the quoted text is the instance; all of it when nothing is left), English
    stop words left out (a kind held together by "the" and "in" is no intent)."""
    outside = _content_words(_QUOTED.sub(" ", text))
    return outside or _content_words(text)


def _content_words(text: str) -> list[str]:
    return [w for w in words(text) if not w.isdigit() and w not in STOP_WORDS]


def tfidf_vectors(texts: Sequence[str]) -> list[Vector]:
    """One L2-normalised TF-IDF vector per text (see the module docstring)."""
    docs = [Counter(intent_tokens(t)) for t in texts]
    n = len(docs)
    df: Counter[str] = Counter()
    for doc in docs:
        df.update(doc.keys())
    idf = {w: math.log((1 + n) / (1 + c)) for w, c in df.items()}
    out: list[Vector] = []
    for doc in docs:
        vec = {w: (1 + math.log(c)) * idf[w] for w, c in doc.items() if idf[w] > 0}
        out.append(_normalized(vec))
    return out


def word_vector(text: str) -> Vector:
    """One text's vector with no corpus to weigh its words against: sublinear term frequency
    alone, L2-normalised (how one request is compared with the kinds' centroids)."""
    return _normalized({w: 1 + math.log(c) for w, c in Counter(intent_tokens(text)).items()})


def _normalized(vec: Vector) -> Vector:
    norm = math.sqrt(sum(v * v for v in vec.values()))
    return {w: v / norm for w, v in vec.items()} if norm > 0 else {}


def cosine(a: Vector, b: Vector) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(w, 0.0) for w, v in a.items())


def centroid(vectors: Sequence[Vector], members: Sequence[int]) -> Vector:
    """The L2-normalised sum of the members' vectors ({} when they hold no word)."""
    total: dict[str, float] = {}
    for i in members:
        for w, v in vectors[i].items():
            total[w] = total.get(w, 0.0) + v
    return _normalized(total)


def blend(*vectors: Vector) -> Vector:
    """The L2-normalised sum of `vectors`: each weighs the same, whatever its size."""
    return centroid(vectors, range(len(vectors)))


@dataclass(frozen=True)
class Grouping:
    """Groups of text indices (largest first, ties by first member) and the indices left out."""

    groups: tuple[tuple[int, ...], ...]
    left_out: tuple[int, ...]


def top_terms(vectors: Sequence[Vector], members: Sequence[int], k: int = 6) -> list[str]:
    """The words that weigh most in a group's centroid (ties alphabetical)."""
    return heaviest(centroid(vectors, members), k)


def heaviest(vector: Vector, k: int) -> list[str]:
    """The `k` words that weigh most in `vector` (ties alphabetical)."""
    return [w for w, _ in sorted(vector.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def group_texts(
    texts: Sequence[str],
    *,
    min_size: int,
    max_groups: int,
    merge_similarity: float,
    seed: int = 0,
) -> tuple[Grouping, list[Vector]]:
    """Group `texts` by intent (module docstring); returns the grouping and the vectors."""
    vectors = tfidf_vectors(texts)
    grouping = group_vectors(
        vectors,
        min_size=min_size,
        max_groups=max_groups,
        merge_similarity=merge_similarity,
        seed=seed,
    )
    return grouping, vectors


def group_vectors(
    vectors: Sequence[Vector],
    *,
    min_size: int,
    max_groups: int,
    merge_similarity: float,
    seed: int = 0,
) -> Grouping:
    """Group texts by their `vectors` (one per text, L2-normalised; {}: no weighted word), as
    `group_texts` does."""
    live = [i for i, v in enumerate(vectors) if v]
    blank = [i for i, v in enumerate(vectors) if not v]
    if not live:
        groups = [list(range(len(vectors)))] if vectors else []
        return _finish(groups, [], vectors, min_size)
    k = min(len(live), 2 * max_groups, max(1, (2 * len(vectors)) // max(min_size, 1)))
    groups = _kmeans(vectors, live, k, random.Random(seed))
    groups = _merge_similar(vectors, groups, merge_similarity, max_groups)
    groups, left = _fold_small(vectors, groups, min_size)
    if blank:
        if groups:
            max(groups, key=len).extend(blank)
        else:
            left.extend(blank)
    return _finish(groups, left, vectors, min_size)


def _finish(
    groups: list[list[int]], left: list[int], vectors: Sequence[Vector], min_size: int
) -> Grouping:
    kept = [sorted(g) for g in groups if len(g) >= min_size]
    left = sorted(left + [i for g in groups if len(g) < min_size for i in g])
    kept.sort(key=lambda g: (-len(g), g[0]))
    return Grouping(tuple(tuple(g) for g in kept), tuple(left))


def _kmeans(
    vectors: Sequence[Vector], live: list[int], k: int, rng: random.Random
) -> list[list[int]]:
    """Spherical k-means with k-means++ seeding; empty groups dropped."""
    centers = [vectors[rng.choice(live)]]
    while len(centers) < k:
        far = [1.0 - max(cosine(vectors[i], c) for c in centers) for i in live]
        total = sum(far)
        if total <= 1e-12:
            break  # every text already matches a center
        pick, acc = rng.random() * total, 0.0
        for i, d in zip(live, far, strict=True):
            acc += d
            if acc >= pick:
                centers.append(vectors[i])
                break
    assign: list[int] = []
    for _ in range(30):
        new = [
            max(range(len(centers)), key=lambda c: (cosine(vectors[i], centers[c]), -c))
            for i in live
        ]
        if new == assign:
            break
        assign = new
        members = [
            [i for i, a in zip(live, assign, strict=True) if a == c] for c in range(len(centers))
        ]
        centers = [centroid(vectors, m) if m else centers[c] for c, m in enumerate(members)]
    groups = [[i for i, a in zip(live, assign, strict=True) if a == c] for c in range(len(centers))]
    return [g for g in groups if g]


def _closest_pair(vectors: Sequence[Vector], groups: list[list[int]]) -> tuple[float, int, int]:
    cents = [centroid(vectors, g) for g in groups]
    best = (-1.0, 0, 1)
    for a in range(len(groups)):
        for b in range(a + 1, len(groups)):
            sim = cosine(cents[a], cents[b])
            if sim > best[0] + 1e-12:
                best = (sim, a, b)
    return best


def _merge_similar(
    vectors: Sequence[Vector], groups: list[list[int]], similarity: float, max_groups: int
) -> list[list[int]]:
    groups = [list(g) for g in groups]
    while len(groups) > 1:
        sim, a, b = _closest_pair(vectors, groups)
        if sim < similarity - 1e-12 and len(groups) <= max_groups:
            break
        groups[a].extend(groups.pop(b))
    return groups


def _fold_small(
    vectors: Sequence[Vector], groups: list[list[int]], min_size: int
) -> tuple[list[list[int]], list[int]]:
    """Each group under `min_size` joins its most similar group (cosine > 0), else is left out."""
    groups = [list(g) for g in groups]
    left: list[int] = []
    while len(groups) > 1:
        small = [i for i, g in enumerate(groups) if len(g) < min_size]
        if not small:
            break
        s = min(small, key=lambda i: (len(groups[i]), -i))
        cent = centroid(vectors, groups[s])
        sims = [(cosine(cent, centroid(vectors, g)), -i) for i, g in enumerate(groups) if i != s]
        sim, neg = max(sims)
        if sim <= 1e-12:
            left.extend(groups.pop(s))
            continue
        target = -neg
        groups[target].extend(groups[s])
        groups.pop(s)
    return groups, left
