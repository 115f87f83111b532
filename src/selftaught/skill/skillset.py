"""Many skills from one task: cluster its train examples by intent, train one skill per cluster.

    clusters = cluster_tasks(task.examples("train"), task.examples("val"), SkillSetConfig(),
                             start=existing_skill_files)
    result = train_skill_set(task, target, analyst, config=SkillOptConfig(...),
                             output_dir="runs/skills/x", start=existing_skill_files)

**Clustering** (`cluster_tasks`, no model needed, the same on every run). The user's existing
skills (`start`, e.g. `DIR/*/SKILL.md`) come first: a train example that the router over their
descriptions (`skill.routing.SkillRouter`) sends to one joins it. The rest are grouped by the
words of their inputs (`skill.clustering`: TF-IDF and seeded k-means, then merges); a group
under `min_tasks` train examples joins the most similar group, or, sharing no weighted word
with any, stays unrouted (no skill is trained for it). Each new group gets a name and a one-line
description written for routing, by the analyst when a `namer` is given (shown the group's
train inputs only, clipped), else from its top words. Then every val (and test) example is
routed by the router a request would meet, over every cluster's card (description and train
inputs): val never decides the clustering, and an example no card shares a word with is
unrouted.

**Training** (`train_skill_set`): one SkillOpt run (`SkillTrainer`) per cluster on its own train
split, gated on its own val by the one gate, in its own run directory (`skills/<name>/`), so a
killed set resumes the unfinished cluster and keeps the finished ones. A skill that passes its
own gate then meets the **whole-val check**: every val example is served the skill its route
picks among the skills that would ship (the user's existing ones and those accepted so far),
with and without this one; the skill is rejected when any *other* cluster's val examples (or the
unrouted ones, as one group) lose more than the gate's margin in net items (`gate.tag_margin`
when set instead), or, with `gate.tag_alpha` set, a one-sided paired sign test for a loss at that
level (`gate.tag_regressions`, the per-tag veto's rule). Clusters are trained in order
(existing skills first, then new ones, largest first), so each check sees the skills accepted
before it. `--budget-*` applies to each cluster's run on its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from selftaught.errors import ConfigError
from selftaught.gate import TagLoss
from selftaught.models.usage import Usage
from selftaught.results import RunResult, SplitScore
from selftaught.skill.clustering import group_texts, top_terms
from selftaught.skill.routing import (
    DESCRIPTION_MAX,
    KindIndex,
    SkillCard,
    SkillNameError,
    SkillRouter,
    check_description,
    check_name,
    slug_name,
)
from selftaught.skill.skill_md import SkillFile
from selftaught.tasks.base import Example
from selftaught.text import words

if TYPE_CHECKING:
    from selftaught.evaluation import EvalResult

ItemScores = dict[str, list[float] | None]  # val example id -> [hard, soft] (None: errored)
UNROUTED = "(unrouted)"  # the group of val examples no skill's card shares a word with

# the analyst's naming: (the cluster's train inputs, its top words) -> (name, description) or
# None when its reply is unusable (the top words name the cluster then)
Namer = Callable[[Sequence[str], Sequence[str]], "tuple[str, str] | None"]


@dataclass(frozen=True)
class SkillSetConfig:
    """How a task's examples become several skills (`cluster_tasks`, `train_skill_set`)."""

    min_tasks: int = 8
    """Fewest train examples a new skill is trained on: a smaller cluster joins its most
    similar cluster, or stays unrouted (no skill) when it shares no word with any. An
    existing skill with fewer keeps its file unchanged."""
    max_skills: int = 8
    """Most new skills (clusters) one task is split into (existing skills not counted)."""
    merge_similarity: float = 0.5
    """Clusters whose word centroids have at least this cosine are one intent and merge."""
    seed: int = 0
    """Seeds the clustering's k-means."""
    name_inputs: int = 12
    """Train inputs the analyst sees when it names a cluster (the first ones, clipped)."""
    name_input_chars: int = 300
    """Each of those inputs is clipped to this many characters."""

    def __post_init__(self) -> None:
        if self.min_tasks < 1:
            raise ConfigError(f"min_tasks must be >= 1, got {self.min_tasks}")
        if self.max_skills < 1:
            raise ConfigError(f"max_skills must be >= 1, got {self.max_skills}")
        if not 0.0 < self.merge_similarity <= 1.0:
            raise ConfigError(f"merge_similarity must be in (0, 1], got {self.merge_similarity}")
        if self.name_inputs < 1 or self.name_input_chars < 20:
            raise ConfigError("name_inputs must be >= 1 and name_input_chars >= 20")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def skill_file_dict(f: SkillFile) -> dict[str, Any]:
    """A SkillFile as JSON (name, description, body, the other front-matter lines)."""
    return {
        "name": f.card.name,
        "description": f.card.description,
        "body": f.body,
        "extra": list(f.extra),
    }


def skill_file_from(d: dict[str, Any]) -> SkillFile:
    card = SkillCard(str(d["name"]), str(d["description"]))
    return SkillFile(card=card, body=str(d.get("body") or ""), extra=tuple(d.get("extra") or ()))


@dataclass(frozen=True)
class TaskCluster:
    """One skill's share of a task: its card (name, description, train inputs), the train and
    val (and test) example ids routed to it, and the existing skill it starts from (None: a
    new skill, starting empty). `terms` are the words that grouped it. `hold`: why it is not
    trained this time (its skill kept as it is, e.g. a night with no traffic of its kind);
    its val examples still count as its own in the other clusters' whole-val checks."""

    card: SkillCard
    train_ids: tuple[str, ...]
    val_ids: tuple[str, ...]
    test_ids: tuple[str, ...] = ()
    start: SkillFile | None = None
    terms: tuple[str, ...] = ()
    hold: str | None = None

    @property
    def name(self) -> str:
        return self.card.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.card.name,
            "description": self.card.description,
            "tasks": list(self.card.tasks),
            "train_ids": list(self.train_ids),
            "val_ids": list(self.val_ids),
            "test_ids": list(self.test_ids),
            "start": skill_file_dict(self.start) if self.start is not None else None,
            "terms": list(self.terms),
            "hold": self.hold,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskCluster:
        return cls(
            card=SkillCard(str(d["name"]), str(d["description"]), tuple(d.get("tasks") or ())),
            train_ids=tuple(d.get("train_ids") or ()),
            val_ids=tuple(d.get("val_ids") or ()),
            test_ids=tuple(d.get("test_ids") or ()),
            start=skill_file_from(d["start"]) if d.get("start") else None,
            terms=tuple(d.get("terms") or ()),
            hold=d.get("hold"),
        )


def cluster_tasks(
    train: Sequence[Example],
    val: Sequence[Example],
    config: SkillSetConfig | None = None,
    start: Sequence[SkillFile] = (),
    *,
    test: Sequence[Example] = (),
    namer: Namer | None = None,
) -> list[TaskCluster]:
    """The task's examples as clusters, one per skill (module docstring): the existing skills
    (`start`, in their order, each kept even when no example joins it) then the new clusters,
    largest first. Deterministic for a given `namer`."""
    cfg = config or SkillSetConfig()
    names = [s.card.name for s in start]
    if len(set(names)) != len(names):
        raise SkillNameError(f"two starting skills share a name: {', '.join(sorted(names))}")
    joined: dict[str, list[Example]] = {n: [] for n in names}
    rest: list[Example] = []
    router = SkillRouter([s.card for s in start]) if start else None
    for ex in train:
        route = router.route(ex.prompt_text()) if router is not None else None
        if route is not None and route.skill is not None:
            joined[route.skill].append(ex)
        else:
            rest.append(ex)
    found = []
    for s in start:
        tasks = tuple(ex.prompt_text() for ex in joined[s.card.name])
        card = SkillCard(s.card.name, s.card.description, tasks)
        ids = tuple(ex.id for ex in joined[s.card.name])
        found.append(TaskCluster(card, ids, (), start=s))
    found += _new_clusters(rest, cfg, set(names), namer)
    return route_held_out(found, val, test)


def _new_clusters(
    examples: Sequence[Example], cfg: SkillSetConfig, taken: set[str], namer: Namer | None
) -> list[TaskCluster]:
    texts = [ex.prompt_text() for ex in examples]
    grouping, vectors = group_texts(
        texts,
        min_size=cfg.min_tasks,
        max_groups=cfg.max_skills,
        merge_similarity=cfg.merge_similarity,
        seed=cfg.seed,
    )
    out = []
    for members in grouping.groups:
        inputs = [texts[i] for i in members]
        terms = top_terms(vectors, members)
        named = namer(_clipped(inputs, cfg), terms) if namer is not None else None
        name, description = usable_name(named, inputs) or fallback_name(terms)
        name = unique_name(name, taken)
        taken.add(name)
        card = SkillCard(name, description, tuple(inputs))
        ids = tuple(examples[i].id for i in members)
        out.append(TaskCluster(card, ids, (), terms=tuple(terms)))
    return out


def _clipped(inputs: Sequence[str], cfg: SkillSetConfig) -> list[str]:
    from selftaught.skill.reflect import clip

    return [clip(t, cfg.name_input_chars) for t in inputs[: cfg.name_inputs]]


def route_held_out(
    clusters: Sequence[TaskCluster], val: Sequence[Example], test: Sequence[Example] = ()
) -> list[TaskCluster]:
    """`clusters` with their val and test ids: each example goes where the router over every
    cluster's card sends it (none: unrouted)."""
    if not clusters:
        return []
    router = SkillRouter([c.card for c in clusters])
    routed: dict[str, dict[str, list[str]]] = {"val": {}, "test": {}}
    for split, examples in (("val", val), ("test", test)):
        for ex in examples:
            skill = router.route(ex.prompt_text()).skill
            if skill is not None:
                routed[split].setdefault(skill, []).append(ex.id)
    return [
        TaskCluster(
            c.card,
            c.train_ids,
            tuple(routed["val"].get(c.name, ())),
            tuple(routed["test"].get(c.name, ())),
            start=c.start,
            terms=c.terms,
            hold=c.hold,
        )
        for c in clusters
    ]


def usable_name(named: tuple[str, str] | None, inputs: Sequence[str]) -> tuple[str, str] | None:
    """The analyst's (name, description) made valid, or None when it cannot route: no name, no
    description, or a description sharing no word with the cluster's inputs."""
    if not named:
        return None
    name, description = named
    slug = slug_name(str(name), fallback="")
    try:
        line = check_description(str(description))
        check_name(slug)
    except SkillNameError:
        return None
    vocabulary = {w for t in inputs for w in words(t)}
    if not set(words(line)) & vocabulary:
        return None
    return slug, line[:DESCRIPTION_MAX]


def fallback_name(terms: Sequence[str]) -> tuple[str, str]:
    """A name and a description from a cluster's top words (when the analyst's reply is
    unusable, or no analyst names clusters)."""
    name = slug_name("-".join(terms[:3]), fallback="skill")
    about = ", ".join(terms[:6]) or "these tasks"
    return name, f"Requests about {about}."


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`, ... when taken (still a valid name)."""
    if name not in taken:
        return name
    n = 2
    while True:
        suffix = f"-{n}"
        candidate = name[: 64 - len(suffix)].rstrip("-") + suffix
        if candidate not in taken:
            return candidate
        n += 1


def parse_name_reply(text: str) -> tuple[str, str] | None:
    """The analyst's naming reply (`{"name": ..., "description": ...}`), None when unusable."""
    from selftaught.tasks.extract import extract_json

    try:
        data = extract_json(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name, description = data.get("name"), data.get("description")
    if not isinstance(name, str) or not isinstance(description, str):
        return None
    return name, description


# ---- results ----------------------------------------------------------------------------------


def _score_dict(s: SplitScore | None) -> dict[str, Any] | None:
    return s.to_dict() if s is not None else None


def _score_from(d: dict[str, Any] | None) -> SplitScore | None:
    return SplitScore.from_summary(d) if d else None


@dataclass(frozen=True)
class ClusterDelta:
    """One cluster's val examples in the whole-val check: served without and with the skill."""

    cluster: str
    n: int
    before: float  # solved share (the gate's metric), served without the skill
    after: float
    net: float  # items gained (negative: lost)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "n": self.n,
            "before": round(self.before, 6),
            "after": round(self.after, 6),
            "net": round(self.net, 6),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterDelta:
        return cls(
            str(d["cluster"]), int(d["n"]), float(d["before"]), float(d["after"]), float(d["net"])
        )


@dataclass(frozen=True)
class WholeValCheck:
    """The whole val served with routing, without (`before`) and with (`after`) the skill:
    per cluster deltas, and the other clusters that lost beyond the gate (`losses`)."""

    before: SplitScore
    after: SplitScore
    clusters: tuple[ClusterDelta, ...]
    losses: tuple[TagLoss, ...]

    @property
    def passed(self) -> bool:
        return not self.losses

    def reason(self) -> str:
        if self.passed:
            return "whole val: no other cluster lost beyond the gate"
        return "whole val: " + "; ".join(
            t.describe().replace("tag ", "cluster ", 1) for t in self.losses
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "clusters": [c.to_dict() for c in self.clusters],
            "losses": [t.to_dict() for t in self.losses],
            "passed": self.passed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WholeValCheck:
        return cls(
            before=SplitScore.from_summary(d["before"]),
            after=SplitScore.from_summary(d["after"]),
            clusters=tuple(ClusterDelta.from_dict(c) for c in d.get("clusters") or ()),
            losses=tuple(TagLoss(**t) for t in d.get("losses") or ()),
        )


@dataclass(frozen=True)
class SkillOutcome:
    """One cluster's skill: what it started from and what training made of it, its own gate
    (val before / after, decision) and the whole-val check; `accepted` only when both pass."""

    cluster: TaskCluster
    start_body: str
    trained_body: str
    trained: bool
    accepted: bool
    reason: str
    own_before: SplitScore | None = None
    own_after: SplitScore | None = None
    own_accepted: bool = False
    whole_val: WholeValCheck | None = None
    run_dir: str | None = None
    usage: Usage = field(default_factory=dict)  # the cluster's run, per role

    @property
    def card(self) -> SkillCard:
        return self.cluster.card

    @property
    def name(self) -> str:
        return self.cluster.card.name

    def skill_file(self) -> SkillFile:
        """The SKILL.md this outcome writes: name and description, the user's other front
        matter kept as it was, the trained body."""
        extra = self.cluster.start.extra if self.cluster.start is not None else ()
        card = SkillCard(self.card.name, self.card.description)
        return SkillFile(card=card, body=self.trained_body, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster.to_dict(),
            "start_body": self.start_body,
            "trained_body": self.trained_body,
            "trained": self.trained,
            "accepted": self.accepted,
            "reason": self.reason,
            "own_before": _score_dict(self.own_before),
            "own_after": _score_dict(self.own_after),
            "own_accepted": self.own_accepted,
            "whole_val": self.whole_val.to_dict() if self.whole_val else None,
            "run_dir": self.run_dir,
            "usage": self.usage,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SkillOutcome:
        return cls(
            cluster=TaskCluster.from_dict(d["cluster"]),
            start_body=str(d.get("start_body") or ""),
            trained_body=str(d.get("trained_body") or ""),
            trained=bool(d.get("trained")),
            accepted=bool(d.get("accepted")),
            reason=str(d.get("reason") or ""),
            own_before=_score_from(d.get("own_before")),
            own_after=_score_from(d.get("own_after")),
            own_accepted=bool(d.get("own_accepted")),
            whole_val=WholeValCheck.from_dict(d["whole_val"]) if d.get("whole_val") else None,
            run_dir=d.get("run_dir"),
            usage=dict(d.get("usage") or {}),
        )


@dataclass(frozen=True, kw_only=True)
class SkillSetResult(RunResult):
    """A set of skills trained on one task: one `SkillOutcome` per cluster, the examples no
    skill took, and the whole val served with routing before (`base_score`: the starting
    skills) and after (`shipped_score`: the accepted ones)."""

    kind: ClassVar[str] = "skill_set"

    outcomes: list[SkillOutcome] = field(default_factory=list)
    unrouted_train: list[str] = field(default_factory=list)
    unrouted_val: list[str] = field(default_factory=list)
    base_items: ItemScores = field(default_factory=dict)
    """Per val example [hard, soft] (None: errored), served the starting skills."""
    shipped_items: ItemScores = field(default_factory=dict)
    """The same, served the accepted skills."""
    written: list[str] = field(default_factory=list)  # SKILL.md files written (optimize --skills)
    refused: list[RefusedWrite] = field(default_factory=list)  # and those not written, why

    def __post_init__(self) -> None:
        super().__post_init__()
        self._derive(method=self.method or "skill_set")

    @property
    def accepted(self) -> list[SkillOutcome]:
        return [o for o in self.outcomes if o.accepted]

    def texts(self) -> dict[str, str]:
        return {f"{o.name}/SKILL.md": o.skill_file().render() for o in self.accepted}

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "outcomes": [o.to_dict() for o in self.outcomes],
            "unrouted_train": list(self.unrouted_train),
            "unrouted_val": list(self.unrouted_val),
            "base_items": dict(self.base_items),
            "shipped_items": dict(self.shipped_items),
            "written": list(self.written),
            "refused": [r.to_dict() for r in self.refused],
        }

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_from_dict(d),
            "outcomes": [SkillOutcome.from_dict(o) for o in d.get("outcomes") or ()],
            "unrouted_train": list(d.get("unrouted_train") or ()),
            "unrouted_val": list(d.get("unrouted_val") or ()),
            "base_items": dict(d.get("base_items") or {}),
            "shipped_items": dict(d.get("shipped_items") or {}),
            "written": list(d.get("written") or ()),
            "refused": [RefusedWrite(**r) for r in d.get("refused") or ()],
        }


@dataclass(frozen=True)
class RefusedWrite:
    """A skill file not written, and why (e.g. it changed on disk since it was read)."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


def dumps(clusters: Sequence[TaskCluster]) -> str:
    """The clusters as JSON text (what a set's run directory keeps, so a resume re-uses them)."""
    return json.dumps([c.to_dict() for c in clusters], indent=2)


# ---- naming by the analyst --------------------------------------------------------------------


def analyst_namer(model: Any, *, max_tokens: int = 200, timeout_s: float = 120.0) -> Namer:
    """A `Namer` asking `model` (a `ChatModel`, e.g. the run's analyst) with the prompt
    `skill/prompts/skill_name.md`. A reply that is not usable, or a transient backend error,
    gives None (the cluster's top words name it); a fatal backend error stops the run."""
    import asyncio

    from selftaught.models.base import GenerationParams, run_sync
    from selftaught.models.errors import TransientBackendError
    from selftaught.skill.reflect import load_prompt, render

    template = load_prompt("skill_name")
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)

    def name(inputs: Sequence[str], terms: Sequence[str]) -> tuple[str, str] | None:
        requests = "\n".join(f"- {' '.join(t.split())}" for t in inputs)
        prompt = render(template, requests=requests, terms=", ".join(terms) or "(none)")
        messages = [{"role": "user", "content": prompt}]
        try:
            reply = run_sync(asyncio.wait_for(model.achat(messages, params), timeout_s))
        except (TransientBackendError, asyncio.TimeoutError):
            return None
        return parse_name_reply(reply.text)

    return name


# ---- training ---------------------------------------------------------------------------------

SET_LAYOUT = """A skill-set run (selftaught optimize --skills): one skill per cluster of tasks.
config.json            the settings (a resumed run must match them)
clusters.json          the clusters: name, description, train / val / test ids, starting skill
skills/<name>/         each cluster's skill run (a normal optimize run directory, resumable)
outcomes/<name>.json   each finished cluster: own gate, whole-val check, accepted or not
whole_val_cache.json   val scores per item by skill hash (the whole-val checks)
result.json            the set's result (SkillSetResult), written at the end
"""


class ClusterTask:
    """One cluster's share of a task as a `Task`: its train, val and test examples; scoring and
    everything else (kind, instructions, schema, tools) are the task's own."""

    def __init__(self, task: Any, cluster: TaskCluster):
        self._task = task
        self.name = f"{task.name}#{cluster.name}"
        ids = {"train": cluster.train_ids, "val": cluster.val_ids, "test": cluster.test_ids}
        self._ids = {split: set(v) for split, v in ids.items()}

    def examples(self, split: str) -> list[Example]:
        want = self._ids.get(split, set())
        return [ex for ex in self._task.examples(split) if ex.id in want]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._task, attr)


class WholeVal:
    """Scores of the whole val served with routing: each example gets the skill its route picks
    among the served skills (no skill when unrouted; with `kinds`, routed as the proxy routes:
    `SkillRouter`), on the model that serves that skill (`targets`, else `target`), scored once
    per skill hash and model (cached)."""

    def __init__(
        self,
        task: Any,
        target: Any,
        config: Any,
        clusters: Sequence[TaskCluster],
        cache: Any,
        targets: dict[str, Any] | None = None,
        kinds: KindIndex | None = None,
    ):
        from selftaught.evaluation import ScoreCache, answer_dtype
        from selftaught.skill.documents import TrainedDocument

        self.task, self.target, self.config, self.cache = task, target, config, cache
        self.kinds = kinds
        self.targets = dict(targets or {})
        # a skill hash names the text, not the weights that read it: one cache per model
        self.caches = {
            name: ScoreCache(dtype=answer_dtype(model)) for name, model in self.targets.items()
        }
        self.doc = TrainedDocument("skill", "", config.demo_placement)
        self.cards = {c.name: c.card for c in clusters}
        self.val = task.examples("val")
        self.tags = {ex.id: (UNROUTED,) for ex in self.val}
        for c in clusters:
            for vid in c.val_ids:
                self.tags[vid] = (c.name,)

    async def items(self, served: dict[str, str]) -> dict[str, list[float] | None]:
        """Per val example [hard, soft] (None: errored) with `served` (name -> body)."""
        from selftaught.evaluation import ascore
        from selftaught.rollout import RolloutConfig

        cards = [card for name, card in self.cards.items() if name in served]
        router = SkillRouter(cards, self.kinds) if cards else None
        by_body: dict[tuple[str, str | None], list[Example]] = {}
        for ex in self.val:
            skill = router.route(ex.prompt_text()).skill if router is not None else None
            body = served[skill] if skill is not None else ""
            by_body.setdefault((body, skill if skill in self.targets else None), []).append(ex)
        cfg = RolloutConfig(
            concurrency=self.config.concurrency,
            timeout_s=self.config.timeout_s,
            params=_params(self.config),
            progress=False,
            description="whole val",
        )
        out: dict[str, list[float] | None] = {}
        for (body, own), examples in by_body.items():
            model = self.target if own is None else self.targets[own]
            cache = self.cache if own is None else self.caches[own]
            policy = self.doc.policy(body)
            scored = await ascore(
                self.task, model, policy, examples, split="val", rollout=cfg, cache=cache
            )
            out.update(scored.items)
        return out

    def score(self, items: dict[str, list[float] | None]) -> SplitScore:
        from selftaught.evaluation import summarize

        summary = summarize(
            [],
            task=self.task.name,
            model=self.target.name,
            split="val",
            wall_s=0.0,
            skill_hash="served",
            items={ex.id: items[ex.id] for ex in self.val},
        )
        return SplitScore.from_summary(summary.summary(), "val")

    async def check(
        self, name: str, before: dict[str, str], after: dict[str, str]
    ) -> WholeValCheck:
        """`after` (the skill served) against `before` (without it), cluster by cluster; the
        losses of the clusters other than `name` (module docstring: the rule)."""
        from dataclasses import replace

        from selftaught.evaluation import metric_scores
        from selftaught.gate import tag_regressions

        gate = self.config.gate
        old, new = await self.items(before), await self.items(after)
        m_old = metric_scores(old, gate.metric, gate.mixed_weight)
        m_new = metric_scores(new, gate.metric, gate.mixed_weight)
        deltas = []
        for cluster in [*self.cards, UNROUTED]:
            ids = [i for i, t in self.tags.items() if t[0] == cluster]
            pairs = [
                (was, now)
                for i in ids
                if (was := m_old[i]) is not None and (now := m_new[i]) is not None
            ]
            if pairs:
                b, a = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
                deltas.append(
                    ClusterDelta(cluster, len(pairs), b / len(pairs), a / len(pairs), a - b)
                )
        losses: list[TagLoss] = []
        if not gate.accept_all:
            margin = gate.tag_margin if gate.tag_margin is not None else gate.margin
            rule = replace(gate, tag_margin=margin)
            others = {i: t for i, t in self.tags.items() if t[0] != name}
            losses = tag_regressions(m_new, m_old, others, rule)
        return WholeValCheck(self.score(old), self.score(new), tuple(deltas), tuple(losses))


def _params(config: Any) -> Any:
    from selftaught.models.base import GenerationParams

    return GenerationParams(max_tokens=config.max_tokens, temperature=config.temperature)


def _val_score(result: EvalResult | None) -> SplitScore | None:
    return None if result is None else SplitScore.from_summary(result.summary(), "val")


def add_usage(*usages: dict[str, Any]) -> dict[str, Any]:
    """Per-role usage dicts summed (numbers added, the rest kept from the first)."""
    total: dict[str, dict[str, Any]] = {}
    for usage in usages:
        for role, u in usage.items():
            into = total.setdefault(role, {})
            for key, value in u.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    into[key] = into.get(key, 0) + value
                else:
                    into.setdefault(key, value)
    return total


def train_skill_set(
    task: Any,
    model: Any,
    optimizer_model: Any = None,
    *,
    output_dir: Any,
    config: Any = None,
    set_config: SkillSetConfig | None = None,
    start: Sequence[SkillFile] = (),
    clusters: Sequence[TaskCluster] | None = None,
    callbacks: Sequence[Any] = (),
    progress: bool = True,
    console: Any = None,
    targets: dict[str, Any] | None = None,
    kinds: KindIndex | None = None,
) -> SkillSetResult:
    """Cluster `task` (or take `clusters`), train one skill per cluster with `SkillTrainer`
    (`config`: a `SkillOptConfig`, used by every cluster's run), gate each on its own val and on
    the whole val (module docstring), in `output_dir` (resumed when it holds this set). The
    skills themselves are not written anywhere: `SkillSetResult.accepted` holds them
    (`skill_dir.write_skill_files` writes them as SKILL.md files). `targets`: the model that
    serves a cluster's skill when it is not `model` (cluster name -> model, e.g. the base
    with that skill's own adapter): its skill is trained and measured there. `kinds`: the kinds
    a request is routed by before the cards (a night's, as its proxy routes), for the whole-val
    check."""
    run = SkillSetRun(
        task,
        model,
        optimizer_model,
        output_dir=output_dir,
        config=config,
        set_config=set_config,
        start=start,
        clusters=clusters,
        callbacks=callbacks,
        progress=progress,
        console=console,
        targets=targets,
        kinds=kinds,
    )
    return run.train()


class SkillSetRun:
    """The run behind `train_skill_set` (its docstring); `train()` runs or resumes it."""

    def __init__(
        self,
        task: Any,
        model: Any,
        optimizer_model: Any = None,
        *,
        output_dir: Any,
        config: Any = None,
        set_config: SkillSetConfig | None = None,
        start: Sequence[SkillFile] = (),
        clusters: Sequence[TaskCluster] | None = None,
        callbacks: Sequence[Any] = (),
        progress: bool = True,
        console: Any = None,
        targets: dict[str, Any] | None = None,
        kinds: KindIndex | None = None,
    ):
        from rich.console import Console

        from selftaught.models.resolve import resolve_model
        from selftaught.models.usage import TrackedModel, UsageLedger
        from selftaught.runs import RunDir
        from selftaught.skill.config import SkillOptConfig

        self.task = task
        self.config = config or SkillOptConfig()
        self.set_config = set_config or SkillSetConfig()
        self.start = tuple(start)
        self.given = tuple(clusters) if clusters is not None else None
        self.run = RunDir(output_dir)
        self.ledger = UsageLedger()  # naming and whole-val checks (each cluster has its own)
        self.model = resolve_model(model)
        same = optimizer_model is None or optimizer_model is model or optimizer_model == model
        self.analyst_model = self.model if same else resolve_model(optimizer_model)
        self.target = TrackedModel(self.model, self.ledger, "target")
        self.targets = {name: resolve_model(m) for name, m in (targets or {}).items()}
        self.analyst = TrackedModel(self.analyst_model, self.ledger, "optimizer")
        self.callbacks = tuple(callbacks)
        self.kinds = kinds
        self.progress = progress
        self.console = console or Console(stderr=True, quiet=not progress)

    def train(self) -> SkillSetResult:
        import time

        from selftaught.evaluation import ScoreCache, answer_dtype
        from selftaught.models.base import run_sync
        from selftaught.runs import atomic_write_json, atomic_write_text
        from selftaught.skill.trainer import RESUMABLE
        from selftaught.tasks.base import check_disjoint

        t0 = time.perf_counter()
        check_disjoint(self.task)  # validation that overlaps training fails closed
        self.run.check_or_write_config(
            self._run_config(), ignore=RESUMABLE, defaults=self._default_run_config()
        )
        atomic_write_text(self.run.path("README.txt"), SET_LAYOUT)
        clusters = self._clusters()
        cache = ScoreCache.load(self.run.path("whole_val_cache.json"), answer_dtype(self.target))
        from selftaught.models.usage import TrackedModel

        own = {n: TrackedModel(m, self.ledger, "target") for n, m in self.targets.items()}
        whole = WholeVal(self.task, self.target, self.config, clusters, cache, own, self.kinds)
        served = {c.name: c.start.body for c in clusters if c.start is not None}
        start_served = dict(served)
        outcomes: list[SkillOutcome] = []
        for i, cluster in enumerate(clusters, 1):
            outcome = self._outcome(f"{i}/{len(clusters)}", cluster, served, whole)
            outcomes.append(outcome)
            if outcome.accepted:
                served[cluster.name] = outcome.trained_body
        base_items = run_sync(whole.items(start_served))
        shipped_items = run_sync(whole.items(served))
        base, shipped = whole.score(base_items), whole.score(shipped_items)
        in_train = {i for c in clusters for i in c.train_ids}
        in_val = {i for c in clusters for i in c.val_ids}
        result = SkillSetResult(
            run_dir=self.run.root,
            task=self.task.name,
            base_score=base,
            shipped_score=shipped,
            usage=add_usage(self.ledger.to_dict(), *(o.usage for o in outcomes)),
            seconds=time.perf_counter() - t0,
            outcomes=outcomes,
            unrouted_train=[e.id for e in self.task.examples("train") if e.id not in in_train],
            unrouted_val=[e.id for e in self.task.examples("val") if e.id not in in_val],
            base_items=base_items,
            shipped_items=shipped_items,
        )
        atomic_write_json(self.run.path("result.json"), result.to_dict())
        return result

    def _run_config(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "skill_set": self.set_config.to_dict(),
            "task": self.task.name,
            "model": self.model.name,
            "optimizer_model": self.analyst_model.name,
            "start": sorted(s.card.name for s in self.start),
        }

    def _default_run_config(self) -> dict[str, Any]:
        """`_run_config` with every setting at its default: what a saved set that predates a
        setting is read as having (`RunDir.check_or_write_config`)."""
        return {
            **self._run_config(),
            **type(self.config)().to_dict(),
            "skill_set": type(self.set_config)().to_dict(),
        }

    def _clusters(self) -> list[TaskCluster]:
        """The set's clusters: read back on resume (names and routing never change under a
        resumed run), else computed and saved."""
        from selftaught.runs import atomic_write_json, read_json

        path = self.run.path("clusters.json")
        if path.exists():
            return [TaskCluster.from_dict(d) for d in read_json(path)]
        if self.given is not None:
            clusters = list(self.given)
        else:
            test = self.task.examples("test") if self.config.evaluate_test else []
            clusters = cluster_tasks(
                self.task.examples("train"),
                self.task.examples("val"),
                self.set_config,
                self.start,
                test=test,
                namer=analyst_namer(self.analyst, timeout_s=self.config.timeout_s),
            )
        atomic_write_json(path, [c.to_dict() for c in clusters])
        for c in clusters:
            origin = "existing" if c.start is not None else "new"
            self.console.print(
                f"cluster [bold]{c.name}[/] ({origin}): {len(c.train_ids)} train, "
                f"{len(c.val_ids)} val · {c.card.description}"
            )
        return clusters

    def _skip_reason(self, cluster: TaskCluster) -> str | None:
        if cluster.hold is not None:
            return cluster.hold
        n, least = len(cluster.train_ids), self.set_config.min_tasks
        if not n:
            return "no train task routes to it: kept as it is"
        if n < least:
            return f"too few train tasks ({n} < min_tasks {least}): kept as it is"
        if not cluster.val_ids:
            return "no val task routes to it: nothing to gate on"
        return None

    def _outcome(
        self, where: str, cluster: TaskCluster, served: dict[str, str], whole: WholeVal
    ) -> SkillOutcome:
        """The cluster's outcome: read back when it finished before, else trained now."""
        from selftaught.runs import atomic_write_json, read_json

        path = self.run.path("outcomes", f"{cluster.name}.json")
        if path.exists():
            outcome = SkillOutcome.from_dict(read_json(path))
            self.console.print(f"skill {where} [bold]{cluster.name}[/]: finished before, kept")
            return outcome
        body = cluster.start.body if cluster.start is not None else ""
        skip = self._skip_reason(cluster)
        if skip is not None:
            outcome = SkillOutcome(cluster, body, body, trained=False, accepted=False, reason=skip)
        else:
            self.console.print(
                f"skill {where} [bold]{cluster.name}[/]: training on {len(cluster.train_ids)} "
                f"train tasks, gated on {len(cluster.val_ids)} val"
            )
            outcome = self._train_one(cluster, body, served, whole)
        atomic_write_json(path, outcome.to_dict())
        verdict = "[green]accepted[/]" if outcome.accepted else "[yellow]not accepted[/]"
        self.console.print(f"skill {where} [bold]{cluster.name}[/]: {verdict} ({outcome.reason})")
        return outcome

    def _train_one(
        self, cluster: TaskCluster, body: str, served: dict[str, str], whole: WholeVal
    ) -> SkillOutcome:
        from selftaught.models.base import run_sync
        from selftaught.skill.trainer import SkillTrainer

        sub = self.run.path("skills", cluster.name)
        trainer = SkillTrainer(
            self.config,
            ClusterTask(self.task, cluster),
            self.targets.get(cluster.name, self.model),
            self.analyst_model,
            body,
            output_dir=sub,
            callbacks=self.callbacks,
            progress=self.progress,
            console=self.console,
        )
        r = trainer.train()
        own = r.best_version != "v0000"  # the gate made a candidate the new best
        check = None
        if own:
            after = {**served, cluster.name: r.best_skill}
            check = run_sync(whole.check(cluster.name, served, after))
            reason = check.reason()
        else:
            tally = ", ".join(f"{k} {v}" for k, v in sorted(r.decisions.items())) or "no step"
            reason = f"own gate: no candidate beat the starting skill on its val ({tally})"
        return SkillOutcome(
            cluster,
            body,
            r.best_skill,
            trained=True,
            accepted=own and check is not None and check.passed,
            reason=reason,
            own_before=_val_score(r.val_initial),
            own_after=_val_score(r.val_best),
            own_accepted=own,
            whole_val=check,
            run_dir=str(sub),
            usage=dict(r.usage),
        )
