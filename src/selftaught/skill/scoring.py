"""How a skill run scores the trained document: rollouts of the frozen target reading it, val
scores cached per item by policy hash (an item already scored for an unchanged document is never
scored again), and test scores on a ledger of their own (outside every budget)."""

from __future__ import annotations

from selftaught.evaluation import (
    EvalResult,
    ItemCost,
    ScoreCache,
    ascore,
    metric_scores,
    summarize,
)
from selftaught.gate import ValScores
from selftaught.models.base import GenerationParams
from selftaught.models.usage import TrackedModel
from selftaught.rollout import Rollout, RolloutConfig, arun_rollouts
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.documents import TrainedDocument
from selftaught.skill.state import SkillVersion
from selftaught.tasks.base import Example, Task


class SkillScorer:
    """Rollouts and scores of `document` versions on `task` with the frozen `target` (val and
    train) or `test_target` (test, on its own ledger). `val_set` is set once the splits are
    known; `val_cache` is replaced by the one a resumed run saved."""

    def __init__(
        self,
        config: SkillOptConfig,
        task: Task,
        document: TrainedDocument,
        target: TrackedModel,
        test_target: TrackedModel,
        val_cache: ScoreCache,
    ):
        self.config = config
        self.task = task
        self.document = document
        self.target = target
        self.test_target = test_target
        self.val_cache = val_cache
        self.val_set: list[Example] = []
        self.val_tags: dict[str, tuple[str, ...]] = {}  # the per-tag veto's (gate_tags)
        # the pooled val (`pooled_val`): held-out train items the gate reads with val
        self.pool_set: list[Example] = []
        self.pool_cache = ScoreCache(dtype=val_cache.dtype)
        self.params = GenerationParams(max_tokens=config.max_tokens, temperature=config.temperature)

    def metric(self, scores: dict[str, list[float] | None]) -> ValScores:
        """Per-item scores as the gate's metric (hard, soft or mixed)."""
        gate = self.config.gate
        return metric_scores(scores, gate.metric, gate.mixed_weight)

    def val_cost(self, skill_hash: str) -> ItemCost | None:
        """What a version spent per val item when it was scored (None: nothing measured)."""
        ids = (ex.id for ex in self.val_set)
        return self.val_cache.cost(skill_hash, ids, self.target.name)

    def val_metric(self, skill_hash: str) -> ValScores:
        """The gate's metric of a version already scored on val (read from the cache)."""
        return self.metric(self.val_cache[skill_hash])

    def is_failure(self, r: Rollout) -> bool:
        assert r.score is not None
        return r.score.soft < 1.0 if self.config.gate.metric == "soft" else not r.score.hard

    async def rollouts(
        self,
        text: str,
        examples: list[Example],
        desc: str,
        *,
        params: GenerationParams | None = None,
        samples: int = 1,
    ) -> list[Rollout]:
        cfg = self.rollout_config(desc, params or self.params, samples)
        policy = self.document.policy(text)
        return await arun_rollouts(self.target, policy, self.task, examples, cfg)

    def rollout_config(self, desc: str, params: GenerationParams, samples: int) -> RolloutConfig:
        return RolloutConfig(
            concurrency=self.config.concurrency,
            timeout_s=self.config.timeout_s,
            params=params,
            samples=samples,
            progress=False,
            description=desc,
        )

    async def val(self, skill: SkillVersion, ids: set[str] | None = None) -> EvalResult:
        """`skill` on `ids` (default: the whole val split), cached per item by skill hash: an
        item already scored for an unchanged skill is never scored again."""
        want = [ex for ex in self.val_set if ids is None or ex.id in ids]
        if not self.val_set:  # no held-out val (a night's --no-val): nothing scored, recorded
            self.val_cache.add(skill.hash, {})
        return await self.score(skill.text, want, "val", "val", cache=self.val_cache)

    async def score(
        self,
        text: str,
        examples: list[Example],
        split: str,
        desc: str,
        cache: ScoreCache | None = None,
    ) -> EvalResult:
        """Score through `selftaught.evaluation` (test: on its own ledger, outside the budget)."""
        cfg = self.rollout_config(desc, self.params, 1)
        model = self.target if split != "test" else self.test_target
        policy = self.document.policy(text)
        return await ascore(
            self.task, model, policy, examples, split=split, rollout=cfg, cache=cache
        )

    async def pool(self, skill: SkillVersion) -> EvalResult:
        """`skill` on the pooled val's items, cached per item by skill hash (pool_cache.json)."""
        return await self.score(skill.text, self.pool_set, "val", "pool", cache=self.pool_cache)

    def pool_metric(self, skill_hash: str) -> ValScores:
        return self.metric(self.pool_cache[skill_hash])

    def val_summary(self, skill: SkillVersion) -> EvalResult:
        """The whole-val summary of `skill`, read from the cache (so the same on resume; the
        tokens spent are in the row's usage)."""
        items = {ex.id: self.val_cache[skill.hash][ex.id] for ex in self.val_set}
        return self.summarize([], "val", skill.hash, items)

    def summarize(
        self,
        rollouts: list[Rollout],
        split: str,
        skill_hash: str,
        items: dict[str, list[float] | None] | None = None,
    ) -> EvalResult:
        return summarize(
            rollouts,
            task=self.task.name,
            model=self.target.name,
            split=split,
            wall_s=0.0,
            skill_hash=skill_hash,
            items=items,
        )
