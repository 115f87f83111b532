"""Kinds of request: a night's tasks grouped by intent, each group with an id kept across nights.

    <home>/projects/<project>/kinds.json   every kind the project's nights found: its id, its
                                           heaviest words, its word centroid, when it was seen
                                           (read and written by `sleep/kinds_file.py`)

Real traffic is many kinds of request, drifting from night to night. Each night gives every task
it uses (mined tonight or recalled) a kind, found from the requests' own words, no label needed:

1. a recalled task keeps the kind it had;
2. a task of a known kind takes it: the question the proxy asks of each request it routes
   (`skill.routing.KindIndex`: the kind whose centroid the request's words are most like, when
   their cosine reaches `similarity`), so a request the proxy sends to a kind's skill is one
   the night trains and measures that skill on;
3. with many skills, a task of no known kind that the router sends to a starting skill that is
   no kind yet (a user's SKILL.md, a skill adopted before kinds) takes that skill's name as its
   kind (`SkillRouter`: its card, as the proxy routes a request of no kind);
4. the others are grouped by intent (`skill.clustering`: TF-IDF, seeded k-means, merges at
   `similarity`), their words weighed against every kind known too (each kind's words count as
   one more text), so a night with one kind of traffic still tells its words apart;
5. a group whose centroid reaches `similarity` (cosine) with a known kind's is that kind (its
   centroid tonight blends the stored one with its recalled tasks'); else it founds a new kind,
   named by its heaviest words (a valid skill name, unique in the project);
6. a request too rare to be grouped (under `min_tasks` like it) joins the kind it is like (its
   cosine reaches `similarity`); one like no kind waits with none: tonight it carries no
   kind's tag and trains no kind's skill (the project's own skill serves it, as the proxy
   serves a request of no kind), and a later night, with more requests like it, finds its
   kind (recall keeps it without one). Lumping it into another kind would found or move that
   kind on words that are not its own.

One threshold says "of this kind" for a group and for one request alike: kinds.json records
the `similarity` its night used, and the proxy routes by it (`kinds_file.kind_index`: read
once, again when the file changes). One request carries its own words (a name, a quoted text) that a
group's centroid averages away, so a request of a kind with long instance text can fall short
of it: the proxy then serves it no kind's skill, the safe side.

A kind's id never changes; its centroid follows its traffic (tonight's centroid blended with the
stored one, so a kind that drifts keeps its id) and only tonight's traffic moves it: a quiet
kind is left as it was. `kinds.json` is written after a night that used its interactions, as
recall is; it holds words (the heaviest of each kind), never a request. A forget that takes
tasks out of the recall pool rebuilds every kind's words from the recalled tasks left, and
deletes a kind it took the last of (`forget_words`).

A task's kind is its tag for the gate's per-tag veto (`kind:<id>`, `split.NightTask`): a night
whose candidate gains on one kind while it loses another kind's val items beyond their noise is
refused, and the report measures each kind apart (`KindRecord`, report.json `kinds[]`). With many
skills a kind's skill is the skill of the same name (`night/skills.py`), its whole-val check
routing each val task by the kinds as they will be after tonight (`NightKinds.index`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from selftaught.errors import ConfigError
from selftaught.skill.clustering import (
    Vector,
    blend,
    centroid,
    cosine,
    group_vectors,
    heaviest,
    tfidf_vectors,
    word_vector,
)
from selftaught.skill.routing import KIND_SIMILARITY, KindIndex, SkillCard, SkillRouter
from selftaught.skill.skillset import fallback_name, unique_name
from selftaught.sleep.kinds_file import Kind, index_of, kinds_path, read_kinds, save_kinds
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.records import KindRecord, ValPairRecord

CENTROID_WORDS = 32  # a kind's centroid keeps its heaviest words only
NAME_WORDS = 6  # the words that say what a kind is about (the report, `sleep status`)


@dataclass(frozen=True)
class KindConfig:
    """How a night finds the kinds of its requests (`kinds.py`)."""

    similarity: float = KIND_SIMILARITY
    """Two groups of requests whose word centroids reach this cosine are one kind: within a
    night they merge, and tonight's group joins a known kind it reaches. One request is of the
    kind its words are most like when they reach it: the night's first look at each task and
    the proxy's routing (kinds.json records it)."""
    min_tasks: int = 2
    """Fewest requests that found a new kind; a rarer one joins a kind it is like, or waits
    with none (chosen on the stream's dev seeds: `bench_kind_routing.py`, `mined`)."""
    max_groups: int = 8
    """Most groups a night's new requests are split into (each joins a kind or founds one)."""
    grouping_seed: int = 0
    """Seeds the grouping's k-means (not the night's `training.seed`: a kind's grouping stays
    what it was when that changes)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.similarity <= 1.0:
            raise ConfigError(f"kinds similarity must be in (0, 1], got {self.similarity}")
        if self.min_tasks < 1 or self.max_groups < 1:
            raise ConfigError("kinds min_tasks and max_groups must be >= 1")


def forget_words(
    project: str, home: Path | None, kept: Sequence[MinedTask], gone: Collection[str]
) -> int:
    """After a forget took tasks of the kinds `gone` out of the recall pool: each kind's words
    (centroid, terms) rebuilt from its recalled tasks that remain (`kept`), so no word of a
    forgotten row stays in kinds.json through them; a kind of `gone` with none left is deleted,
    id and all (its words may all be a forgotten row's), and the next night finds its traffic
    a kind again. Returns how many kinds were rebuilt or deleted."""
    kinds, similarity = read_kinds(kinds_path(project, home))
    if not kinds:
        return 0
    vectors = _vectors([t.prompt for t in kept], ())
    rebuilt = []
    for kind in kinds:
        members = [i for i, t in enumerate(kept) if t.kind == kind.id]
        if not members and kind.id in gone:
            continue
        words = _kept_words(centroid(vectors, members))
        rebuilt.append(replace(kind, centroid=words, terms=tuple(heaviest(words, NAME_WORDS))))
    save_kinds(project, home, rebuilt, similarity)
    return len(kinds)


def _kept_words(vector: Vector) -> dict[str, float]:
    """A centroid as kinds.json keeps it: its heaviest words, L2-normalised, rounded."""
    kept = blend({w: vector[w] for w in heaviest(vector, CENTROID_WORDS)})
    return {w: round(v, 6) for w, v in kept.items()}


# ---- finding tonight's kinds ------------------------------------------------------------------


@dataclass(frozen=True)
class NightKinds:
    """Tonight's kinds: every kind known after tonight (what kinds.json is to hold), those
    found tonight, and the night's tasks (each with its `kind` set) with the ids of those that
    were recalled or dreamt (neither is tonight's traffic)."""

    kinds: tuple[Kind, ...]
    new: tuple[str, ...]
    tasks: tuple[MinedTask, ...]
    not_traffic: frozenset[str] = frozenset()
    similarity: float = KIND_SIMILARITY

    def index(self) -> KindIndex:
        """The kinds after tonight as the proxy will route among them (kinds.json's)."""
        return index_of(self.kinds, self.similarity)

    def of(self, kind: str) -> list[MinedTask]:
        return [t for t in self.tasks if t.kind == kind]

    def traffic(self, kind: str) -> list[MinedTask]:
        """The kind's tasks that came from tonight's traffic."""
        return [t for t in self.of(kind) if t.id not in self.not_traffic]

    def quiet(self, kind: str) -> bool:
        """No traffic of `kind` tonight (only its recalled tasks, if any)."""
        return not self.traffic(kind)

    def seen(self) -> list[Kind]:
        """The kinds with tasks tonight (their own or recalled), in the registry's order."""
        here = {t.kind for t in self.tasks}
        return [k for k in self.kinds if k.id in here]


def find_kinds(
    tasks: Sequence[MinedTask],
    known: Sequence[Kind],
    config: KindConfig,
    night_id: str,
    *,
    not_traffic: Collection[str] = (),
    seeds: Sequence[SkillCard] = (),
    reserved: Collection[str] = (),
) -> NightKinds:
    """Give every task a kind (module docstring) and return the kinds after tonight.
    `not_traffic`: ids of recalled and dreamt tasks (they neither found a kind nor move one);
    `seeds`: starting skills' cards whose names are no kind yet; `reserved`: names a new kind
    may not take (the project's skills)."""
    book = {k.id: k for k in known}
    for task in tasks:
        if task.kind is not None and task.kind not in book:
            task.kind = None  # its kind was forgotten since (kinds.json deleted)
    seeds = [s for s in seeds if s.name not in book]
    new = _route(tasks, seeds, book, config.similarity)
    vectors = _vectors([t.prompt for t in tasks], book.values())
    refs = {
        kid: _reference(kind, vectors, [i for i, t in enumerate(tasks) if t.kind == kid])
        for kid, kind in book.items()
    }
    taken = {*book, *reserved}
    unknown = [i for i, t in enumerate(tasks) if t.kind is None]
    grouping = group_vectors(
        [vectors[i] for i in unknown],
        min_size=config.min_tasks,
        max_groups=config.max_groups,
        merge_similarity=config.similarity,
        seed=config.grouping_seed,
    )
    for group in grouping.groups:
        members = [unknown[j] for j in group]
        vector = centroid(vectors, members)
        kid = _closest(vector, refs, config.similarity)
        if kid is None:
            kid = _new_id(vector, taken)
            new.append(kid)
            refs[kid] = vector
        for i in members:
            tasks[i].kind = kid
    _place_strays(tasks, [unknown[j] for j in grouping.left_out], vectors, refs, config.similarity)
    kinds = _moved(book, new, tasks, vectors, night_id, set(not_traffic))
    return NightKinds(kinds, tuple(new), tuple(tasks), frozenset(not_traffic),
                      config.similarity)  # fmt: skip


def _vectors(texts: Sequence[str], known: Collection[Kind]) -> list[Vector]:
    """Each text's TF-IDF vector, each known kind's words counting as one more text; a text
    whose every word is in every text (a night of one kind, none known yet) is weighed by its
    words' counts alone, so its kind still has words to be known by."""
    vectors = tfidf_vectors([*texts, *(" ".join(k.centroid) for k in known)])[: len(texts)]
    return [v or word_vector(t) for v, t in zip(vectors, texts, strict=True)]


def _route(
    tasks: Sequence[MinedTask],
    seeds: Sequence[SkillCard],
    book: dict[str, Kind],
    similarity: float,
) -> list[str]:
    """Each task without a kind routed as the proxy routes a request (`SkillRouter`): one of
    a known kind takes it; one of no kind that a starting skill's card (`seeds`) routes takes
    that skill's name as its kind. Returns the seeds that became kinds."""
    router = SkillRouter(seeds, index_of(list(book.values()), similarity))
    found: list[str] = []
    for task in tasks:
        if task.kind is not None:
            continue
        route = router.route(task.prompt)
        name = route.kind or route.skill
        if name is not None:
            task.kind = name
            if name not in book:
                book[name] = Kind(name)
                found.append(name)
    return found


def _reference(kind: Kind, vectors: Sequence[Vector], members: Sequence[int]) -> Vector:
    """What tonight's groups are compared with: the kind's stored centroid blended with its
    tasks' tonight (recalled ones), when it has some."""
    here = centroid(vectors, members)
    return blend(dict(kind.centroid), here) if here else dict(kind.centroid)


def _closest(vector: Vector, refs: Mapping[str, Vector], least: float) -> str | None:
    """The kind most like `vector` when its cosine reaches `least` (ties: the first)."""
    best, best_sim = None, -1.0
    for kid, ref in refs.items():
        sim = cosine(vector, ref)
        if sim > best_sim + 1e-12:
            best, best_sim = kid, sim
    return best if best_sim >= least - 1e-12 else None


def _new_id(vector: Vector, taken: set[str]) -> str:
    """A new kind's id: its three heaviest words as a skill name, unique in the project."""
    name = fallback_name(heaviest(vector, 3))[0] if vector else "requests"
    kid = unique_name(name, taken)
    taken.add(kid)
    return kid


def _place_strays(
    tasks: Sequence[MinedTask],
    strays: Sequence[int],
    vectors: Sequence[Vector],
    refs: Mapping[str, Vector],
    similarity: float,
) -> None:
    """Each stray joins the kind it is like (cosine at least `similarity`); the others keep no
    kind (module docstring, step 6)."""
    for i in strays:
        tasks[i].kind = _closest(vectors[i], refs, similarity)


def _moved(
    book: Mapping[str, Kind],
    new: Sequence[str],
    tasks: Sequence[MinedTask],
    vectors: Sequence[Vector],
    night_id: str,
    not_traffic: set[str],
) -> tuple[Kind, ...]:
    """Every kind after tonight: one with traffic tonight has its centroid blended with that
    traffic's and the night counted; one without keeps everything (a kind with no centroid yet,
    found on recalled tasks alone, takes theirs). Known kinds first, then tonight's new ones."""
    out = []
    for kid in [*book, *(k for k in new if k not in book)]:
        kind = book.get(kid, Kind(kid))
        members = [i for i, t in enumerate(tasks) if t.kind == kid]
        traffic = [i for i in members if tasks[i].id not in not_traffic]
        if not traffic and (kind.centroid or not members):
            out.append(kind)  # quiet tonight: left as it was
            continue
        here = centroid(vectors, traffic or members)
        moved = blend(dict(kind.centroid), here) if kind.centroid else here
        kept = _kept_words(moved)
        out.append(
            Kind(
                id=kid,
                terms=tuple(heaviest(kept, NAME_WORDS)),
                centroid=kept,
                first_night=kind.first_night or night_id,
                last_night=night_id if traffic else kind.last_night,
                nights=kind.nights + (1 if traffic else 0),
            )
        )
    return tuple(out)


# ---- the report's kinds[] ---------------------------------------------------------------------

ItemValues = Mapping[str, float | None]  # val task id -> its hard score (None: errored)


@dataclass(frozen=True)
class KindSkill:
    """What became of a kind's skill tonight (many skills; one skill: `SHARED`)."""

    skill: str | None
    status: str  # staged / rejected / kept / shared
    reason: str | None = None


SHARED = KindSkill(None, "shared")


def kind_records(
    kinds: NightKinds,
    before: ItemValues | None,
    after: ItemValues | None,
    skills: Mapping[str, KindSkill] | None = None,
) -> tuple[KindRecord, ...]:
    """One record per kind with tasks tonight: its traffic, signals, tasks by split, val
    `before` / `after` the night on its val tasks and on its recalled val tasks alone
    (`skills`: each kind's skill tonight; None: one skill serves every kind)."""
    out = []
    new = set(kinds.new)
    for kind in kinds.seen():
        tasks = kinds.of(kind.id)
        traffic = kinds.traffic(kind.id)
        recalled = [t for t in tasks if t.id in kinds.not_traffic and not _dreamt(t)]
        val = [t.id for t in tasks if t.split == "val"]
        old_val = [t.id for t in recalled if t.split == "val"]
        owned = (skills or {}).get(kind.id, SHARED)
        out.append(
            KindRecord(
                id=kind.id,
                terms=kind.terms,
                new=kind.id in new,
                traffic=len({s for t in traffic for s in t.sources}),
                mined=len(traffic),
                splits=dict(Counter(str(t.split) for t in tasks)),
                recalled=dict(Counter(str(t.split) for t in recalled)),
                signals=_signals(traffic),
                val=_pair(val, before, after),
                recalled_val=_pair(old_val, before, after),
                skill=owned.skill,
                skill_status=owned.status,
                reason=owned.reason,
            )
        )
    return tuple(out)


def _dreamt(task: MinedTask) -> bool:
    return task.state.synthetic is not None


def _signals(tasks: Sequence[MinedTask]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for task in tasks:
        for signal in task.signals:
            trust = "trusted" if signal.trusted else "untrusted"
            row = out.setdefault(signal.kind, {})
            row[trust] = row.get(trust, 0) + 1
    return out


def _pair(
    ids: Sequence[str], before: ItemValues | None, after: ItemValues | None
) -> ValPairRecord | None:
    """Mean hard score on `ids` before and after (those scored both times), None when none."""
    if before is None or after is None:
        return None
    pairs: list[tuple[float, float]] = []
    for i in ids:
        b, a = before.get(i), after.get(i)
        if b is not None and a is not None:
            pairs.append((b, a))
    if not pairs:
        return None
    n = len(pairs)
    return ValPairRecord(
        before=round(sum(b for b, _ in pairs) / n, 6),
        after=round(sum(a for _, a in pairs) / n, 6),
        n=n,
    )
