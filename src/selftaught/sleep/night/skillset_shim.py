"""# until skillset lands: the least of `selftaught.skill.skillset` a many-skills night needs.

The contract (helper "skillset" owns the real module): `SkillSetConfig`, `TaskCluster`,
`cluster_tasks(train, val, config, start=())`, `train_skill_set(...) -> SkillSetResult` with one
`SkillOutcome` per cluster (card, start body, trained body, accepted, own-val and whole-val
results). `night/skills.py` imports the real module when it is there and this one otherwise;
delete this file once `skill/skillset.py` is on main. Deliberately small: clusters are groups
of train inputs sharing a word that not nearly all inputs hold; each cluster is one
SkillOpt run gated on its own val, then its whole-val check serves every val item its route
picks (the new skill against none) and rejects a loss.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.results import Score
from selftaught.skill.routing import SkillCard, SkillRouter, slug_name
from selftaught.skill.skill_md import SkillFile
from selftaught.tasks.base import Example
from selftaught.text import words


@dataclass(frozen=True)
class SkillSetConfig:
    min_tasks: int = 8
    max_skills: int = 8
    seed: int = 0


@dataclass(frozen=True)
class TaskCluster:
    card: SkillCard
    train_ids: tuple[str, ...]
    val_ids: tuple[str, ...]
    test_ids: tuple[str, ...] = ()
    start: SkillFile | None = None

    @property
    def name(self) -> str:
        return self.card.name


@dataclass(frozen=True)
class WholeValCheck:
    before: Score
    after: Score


@dataclass
class SkillOutcome:
    cluster: TaskCluster
    start_body: str
    trained_body: str
    trained: bool
    accepted: bool
    reason: str
    own_before: Score | None = None
    own_after: Score | None = None
    own_accepted: bool = False
    whole_val: WholeValCheck | None = None


@dataclass
class SkillSetResult:
    outcomes: list[SkillOutcome] = field(default_factory=list)
    unrouted_train: list[str] = field(default_factory=list)
    unrouted_val: list[str] = field(default_factory=list)


def _common(examples: Sequence[Example]) -> set[str]:
    """Words (and numbers) that say nothing of an input's intent: held by 80% of them."""
    df = Counter(w for ex in examples for w in set(words(ex.prompt_text())))
    return {w for w, n in df.items() if n > 0.8 * len(examples) or w.isdigit()}


def _groups(examples: Sequence[Example]) -> list[list[Example]]:
    """Examples joined when they share a word that is not `_common`."""
    bags = {ex.id: set(words(ex.prompt_text())) for ex in examples}
    common = _common(examples)
    groups: list[tuple[set[str], list[Example]]] = []
    for ex in sorted(examples, key=lambda e: e.id):
        bag = bags[ex.id] - common
        home = next((g for g in groups if g[0] & bag), None)
        if home is None:
            groups.append((set(bag), [ex]))
        else:
            home[0].update(bag)
            home[1].append(ex)
    return [g[1] for g in groups]


def _card(members: Sequence[Example], taken: set[str], common: set[str]) -> SkillCard:
    bags = [set(words(ex.prompt_text())) - common for ex in members]
    top = Counter(w for bag in bags for w in bag)
    name = slug_name(" ".join(w for w, _ in top.most_common(3)))
    while name in taken:
        name = f"{name}-{len(taken)}"
    text = members[0].prompt_text()[:200]
    tasks = tuple(ex.prompt_text() for ex in members)
    return SkillCard(name, f"Tasks like: {text}", tasks)


def cluster_tasks(
    train: Sequence[Example],
    val: Sequence[Example],
    config: SkillSetConfig | None = None,
    start: Sequence[SkillFile] = (),
) -> list[TaskCluster]:
    config = config or SkillSetConfig()
    joined: dict[str, list[Example]] = {f.card.name: [] for f in start}
    rest = list(train)
    if start:
        router = SkillRouter([f.card for f in start])
        rest = []
        for ex in train:
            skill = router.route(ex.prompt_text()).skill
            (joined[skill] if skill else rest).append(ex)
    clusters = [(f.card, joined[f.card.name], f) for f in start if joined[f.card.name]]
    taken = {c.name for c, _, _ in clusters}
    fresh = [g for g in _groups(rest) if len(g) >= config.min_tasks]
    for members in sorted(fresh, key=len, reverse=True):
        card = _card(members, taken, _common(rest))
        taken.add(card.name)
        clusters.append((card, members, None))
    clusters = clusters[: config.max_skills]
    cards = [SkillCard(c.name, c.description, tuple(ex.prompt_text() for ex in m))
             for c, m, _ in clusters]  # fmt: skip
    routed: dict[str, list[str]] = {c.name: [] for c in cards}
    if cards:
        router = SkillRouter(cards)
        for ex in val:
            skill = router.route(ex.prompt_text()).skill
            if skill:
                routed[skill].append(ex.id)
    return [
        TaskCluster(card, tuple(ex.id for ex in m), tuple(routed[card.name]), start=f)
        for (_, m, f), card in zip(clusters, cards, strict=True)
    ]


class _ClusterTask:
    """A task restricted to one cluster's train and val examples."""

    def __init__(self, task: Any, cluster: TaskCluster):
        self._task = task
        self.name = f"{task.name}#{cluster.name}"
        self._ids = {"train": set(cluster.train_ids), "val": set(cluster.val_ids)}

    def examples(self, split: str) -> list[Example]:
        want = self._ids.get(split, set())
        return [ex for ex in self._task.examples(split) if ex.id in want]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._task, attr)


def _whole_val(task: Any, target: Any, config: Any, cluster: TaskCluster, body: str) -> Score:
    from selftaught.evaluation import ascore
    from selftaught.models.base import run_sync
    from selftaught.policy import Policy

    mine = set(cluster.val_ids)
    val = task.examples("val")
    served = [ex for ex in val if ex.id in mine]
    other = [ex for ex in val if ex.id not in mine]
    solved, n = 0.0, 0
    for skill, examples in ((body, served), ("", other)):
        if examples:
            result = run_sync(ascore(task, target, Policy(skill=skill), examples, split="val"))
            summary = result.summary()
            solved += float(summary["hard"]) * int(summary["n"])
            n += int(summary["n"])
    mean = solved / n if n else 0.0
    return Score("val", n, mean, (mean, mean), mean, (mean, mean))


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
    progress: bool = False,
    console: Any = None,
) -> SkillSetResult:
    from selftaught.skill.config import SkillOptConfig
    from selftaught.trainers import build_trainer

    config = config or SkillOptConfig()
    train, val = task.examples("train"), task.examples("val")
    if clusters is None:
        clusters = cluster_tasks(train, val, set_config, start)
    result = SkillSetResult()
    used = {i for c in clusters for i in c.train_ids}
    result.unrouted_train = [ex.id for ex in train if ex.id not in used]
    seen = {i for c in clusters for i in c.val_ids}
    result.unrouted_val = [ex.id for ex in val if ex.id not in seen]
    for cluster in clusters:
        body = cluster.start.body if cluster.start is not None else ""
        sub = _ClusterTask(task, cluster)
        training = dataclasses.replace(config, evaluate_test=False)
        trainer = build_trainer(training, sub, model, optimizer_model=optimizer_model,
                                initial_skill=body, document="skill",
                                output_dir=Path(output_dir) / "skills" / cluster.name,
                                progress=progress, console=console)  # fmt: skip
        run = trainer.train()
        summary = run.to_dict()
        before = Score.from_summary(summary["val_initial"], "val")
        after = Score.from_summary(summary["val_best"], "val")
        trained = run.best_skill.strip() != body.strip()
        outcome = SkillOutcome(cluster, body, run.best_skill, trained, False, "", before, after)
        outcome.own_accepted = trained
        if not trained:
            outcome.reason = "its own val gate kept the starting skill"
        else:
            whole = WholeValCheck(
                _whole_val(task, model, config, cluster, body),
                _whole_val(task, model, config, cluster, run.best_skill),
            )
            outcome.whole_val = whole
            outcome.accepted = whole.after.hard >= whole.before.hard or config.gate.accept_all
            outcome.reason = (
                "accepted on its own val and the whole val"
                if outcome.accepted
                else "the whole val lost with it"
            )
        result.outcomes.append(outcome)
    return result
