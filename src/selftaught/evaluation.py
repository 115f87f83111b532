"""Score a policy on examples: hard and soft accuracy with 95% intervals, tokens, errors.

The one scoring path: `evaluate`, ReST, GRPO, the skill trainer and a sleep night all score
through `ascore` and write `EvalResult.summary()`. The skill trainer and a night keep per-item
scores by skill hash (`ScoreCache`), so an item already scored for an unchanged policy is never
scored again."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.gate import GateConfig, Metric, ValScores, metric_value
from selftaught.models.base import ChatModel, run_sync
from selftaught.policy import Policy
from selftaught.results import SplitScore, one_shape
from selftaught.rollout import Rollout, RolloutConfig, arun_rollouts, episode_row
from selftaught.runs import atomic_write_json, read_json
from selftaught.stats import mean_interval, wilson_interval
from selftaught.tasks.base import Example, Split, Task, TaskError

# example id -> [hard, soft]; None where the rollout errored (an error is never a score)
ItemScores = dict[str, list[float] | None]
ItemCosts = dict[str, list[float]]  # example id -> [prompt tokens, completion tokens, seconds]


@dataclass(frozen=True)
class ItemCost:
    """What one policy spent per val item, averaged over the items whose rollouts were
    measured (a reply read from the response cache measured nothing): prompt and completion
    tokens, seconds, and USD where the model's price is known (None: unknown)."""

    items: int
    prompt_tokens: float
    completion_tokens: float
    latency_s: float
    usd: float | None

    @property
    def tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens

    def value(self, objective: str) -> float | None:
        """The cost a gate objective names: tokens, latency or usd (None: not known)."""
        return {"tokens": self.tokens, "latency": self.latency_s, "usd": self.usd}[objective]

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "prompt_tokens": round(self.prompt_tokens, 1),
            "completion_tokens": round(self.completion_tokens, 1),
            "latency_s": round(self.latency_s, 3),
            "usd": None if self.usd is None else round(self.usd, 8),
        }


def item_costs(rollouts: Iterable[Rollout]) -> ItemCosts:
    """[prompt tokens, completion tokens, seconds] per example id, for the rollouts that ran
    (not read from the response cache) and did not error."""
    return {
        r.example_id: [float(r.prompt_tokens), float(r.completion_tokens), float(r.latency_s)]
        for r in rollouts
        if r.ok and not r.cached
    }


def mean_cost(costs: ItemCosts, ids: Iterable[str], model: str) -> ItemCost | None:
    """The mean cost per item over `ids` that were measured (None: none was); USD from the
    model's public price (`models.usage`)."""
    from selftaught.models.usage import LOCAL_PREFIX, PRICES_PER_MTOK, price_name

    rows = [costs[i] for i in ids if i in costs]
    if not rows:
        return None
    n = len(rows)
    prompt, completion, seconds = (sum(r[k] for r in rows) / n for k in range(3))
    price = (0.0, 0.0) if model.startswith(LOCAL_PREFIX) else PRICES_PER_MTOK.get(price_name(model))
    usd = None if price is None else (prompt * price[0] + completion * price[1]) / 1e6
    return ItemCost(n, prompt, completion, seconds, usd)


@dataclass
class EvalResult:
    task: str
    model: str
    split: str
    n: int  # rollouts scored (errors excluded: they are not wrong answers)
    n_errors: int  # backend, timeout and scorer errors together
    n_scorer_errors: int
    hard: float
    hard_ci: tuple[float, float]
    soft: float
    soft_ci: tuple[float, float] | None  # None: read from an older summary that stored none
    prompt_tokens: int
    completion_tokens: int
    truncated: int
    retries: int
    wall_s: float
    skill_hash: str
    rollouts: list[Rollout] = field(default_factory=list, repr=False)
    usage: dict[str, Any] = field(default_factory=dict)  # per role, when a ledger was kept
    tool_use: dict[str, Any] | None = None  # episodes only (`tool_use`)
    n_cached: int = 0  # items read from a ScoreCache (their tokens were spent before)
    items: ItemScores = field(default_factory=dict, repr=False)  # per example, not summarized

    @property
    def solved(self) -> int:
        return round(self.hard * self.n)

    def summary(self) -> dict[str, Any]:
        """The one accuracy summary every run directory stores (the report reads it)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("rollouts", "items")}
        # JSON-shaped (intervals as lists), so a summary equals itself read back from disk
        out["hard_ci"] = list(self.hard_ci)
        out["soft_ci"] = list(self.soft_ci) if self.soft_ci is not None else None
        return {**out, "solved": self.solved}

    def score(self, split: str | None = None) -> SplitScore:
        """The accuracy part of the summary, as the one summary type."""
        return SplitScore(
            split or self.split, self.n, self.hard, self.hard_ci, self.soft, self.soft_ci
        )

    @classmethod
    def from_summary(cls, d: Mapping[str, Any]) -> EvalResult:
        """Back from `summary()` (as stored in a run directory), without the rollouts. The
        accuracy is read by the one decoder (`SplitScore.from_dict`), so a summary of an older
        shape reads too; a count it did not store reads as 0."""
        s, score = one_shape(d), SplitScore.from_dict(d)
        return cls(
            task=str(s.get("task") or ""),
            model=str(s.get("model") or ""),
            split=score.split,
            n=score.n,
            n_errors=int(s.get("n_errors") or 0),
            n_scorer_errors=int(s.get("n_scorer_errors") or 0),
            hard=score.hard,
            hard_ci=score.hard_ci,
            soft=score.soft,
            soft_ci=score.soft_ci,
            prompt_tokens=int(s.get("prompt_tokens") or 0),
            completion_tokens=int(s.get("completion_tokens") or 0),
            truncated=int(s.get("truncated") or 0),
            retries=int(s.get("retries") or 0),
            wall_s=float(s.get("wall_s") or 0.0),
            skill_hash=str(s.get("skill_hash") or ""),
            usage=dict(s.get("usage") or {}),
            tool_use=s.get("tool_use"),
            n_cached=int(s.get("n_cached") or 0),
        )

    def metric_scores(self, metric: Metric = "hard", mixed_weight: float = 0.5) -> ValScores:
        """Per-example values of `metric` (None where the rollout errored)."""
        return metric_scores(self.items, metric, mixed_weight)

    def val_scores(self, gate: GateConfig) -> ValScores:
        """Per-example values of the gate's metric (None where the rollout errored), the
        input of `selftaught.gate.gate`."""
        return self.metric_scores(gate.metric, gate.mixed_weight)

    @property
    def all_cached(self) -> bool:
        """Every item came from the cache: nothing was rolled out."""
        return self.n_cached == len(self.items)

    def line(self) -> str:
        """One human line: hard accuracy with its interval, truncation and errors."""
        lo, hi = self.hard_ci
        solved = round(self.hard * self.n)
        text = (
            f"{self.split}: {self.hard:.3f} ({solved}/{self.n}, 95% CI {lo:.3f}-{hi:.3f}), "
            f"truncated {self.truncated}"
        )
        if self.n_errors:
            text += f", errors {self.n_errors} (scorer {self.n_scorer_errors})"
        return text


def tool_use(rollouts: list[Rollout]) -> dict[str, Any] | None:
    """How the scored episodes used their tools: the share that called one (malformed calls
    included), the share where at least one call ran, and calls / failed calls per episode.
    None when no rollout is an episode (one-step tasks keep their summary as it was)."""
    episodes = [r for r in rollouts if r.is_episode and r.ok]
    if not any(r.is_episode for r in rollouts):
        return None
    n = len(episodes)
    return {
        "episodes": n,
        "call_share": round(sum(r.tool_calls > 0 for r in episodes) / n, 4) if n else 0.0,
        "ran_share": round(sum(r.tool_calls > r.tool_errors for r in episodes) / n, 4)
        if n
        else 0.0,
        "calls_per_episode": round(sum(r.tool_calls for r in episodes) / n, 3) if n else 0.0,
        "failed_per_episode": round(sum(r.tool_errors for r in episodes) / n, 3) if n else 0.0,
    }


def item_scores(rollouts: Iterable[Rollout]) -> ItemScores:
    """[hard, soft] per example id; None where the rollout errored (with K samples of an
    example, the last one)."""
    return {
        r.example_id: ([r.score.hard, r.score.soft] if r.ok and r.score else None) for r in rollouts
    }


def metric_scores(
    items: ItemScores, metric: Metric = "hard", mixed_weight: float = 0.5
) -> ValScores:
    """Per-item values of a gate metric from [hard, soft] pairs (None stays None)."""
    return {
        k: None if v is None else metric_value({"hard": v[0], "soft": v[1]}, metric, mixed_weight)
        for k, v in items.items()
    }


def summarize(
    rollouts: list[Rollout],
    *,
    task: str,
    model: str,
    split: str,
    wall_s: float,
    skill_hash: str,
    items: ItemScores | None = None,
) -> EvalResult:
    """The summary of `rollouts`; with `items`, accuracy is over those per-item scores (some
    read from a cache) while tokens, truncation and retries count the rollouts run now."""
    if items is None:
        scored = [r for r in rollouts if r.ok and r.score is not None]
        hard = [r.score.hard for r in scored if r.score]
        soft = [r.score.soft for r in scored if r.score]
        n_all, n_cached, per_item = len(rollouts), 0, item_scores(rollouts)
    else:
        done = [v for v in items.values() if v is not None]
        hard, soft = [v[0] for v in done], [v[1] for v in done]
        fresh = {r.example_id for r in rollouts}
        n_all, n_cached, per_item = len(items), sum(k not in fresh for k in items), items
    n = len(hard)
    return EvalResult(
        task=task,
        model=model,
        split=split,
        n=n,
        n_errors=n_all - n,
        n_scorer_errors=sum(r.error_source == "scorer" for r in rollouts),
        hard=sum(hard) / n if n else 0.0,
        hard_ci=wilson_interval(sum(hard), n),
        soft=sum(soft) / n if n else 0.0,
        soft_ci=mean_interval(soft),
        prompt_tokens=sum(r.prompt_tokens for r in rollouts),
        completion_tokens=sum(r.completion_tokens for r in rollouts),
        truncated=sum(r.truncated for r in rollouts),
        retries=sum(r.retries for r in rollouts),
        wall_s=wall_s,
        skill_hash=skill_hash,
        rollouts=rollouts,
        tool_use=tool_use(rollouts),
        n_cached=n_cached,
        items=per_item,
    )


class ScoreCache:
    """Per-item scores by skill hash, saved to `path` (JSON, atomically) after each change
    when one is given: an item already scored for an unchanged policy is never scored again,
    and a resumed run reads what it had scored. What each item's rollout spent (`costs`) is
    kept beside it (`<name>_costs.json`), so a cached item keeps its measured cost.

    `dtype`: the dtype the scoring model answers in when it is not float32 (`answer_dtype`);
    its scores and costs are kept under `<hash>@<dtype>`, so a run resumed in another dtype
    (bf16 replies differ from float32's) scores again instead of reading them. float32 and
    models that do not say (API models) keep the bare hash, as before."""

    def __init__(
        self,
        path: Path | None = None,
        data: dict[str, ItemScores] | None = None,
        costs: dict[str, ItemCosts] | None = None,
        dtype: str | None = None,
    ):
        self.path = path
        self.data: dict[str, ItemScores] = data if data is not None else {}
        self.costs: dict[str, ItemCosts] = costs if costs is not None else {}
        self.dtype = dtype

    @classmethod
    def load(cls, path: Path, dtype: str | None = None) -> ScoreCache:
        costs = _costs_path(path)
        return cls(
            path,
            read_json(path) if path.exists() else {},
            read_json(costs) if costs.exists() else {},
            dtype,
        )

    def key(self, skill_hash: str) -> str:
        return skill_hash if self.dtype is None else f"{skill_hash}@{self.dtype}"

    def __getitem__(self, skill_hash: str) -> ItemScores:
        return self.data[self.key(skill_hash)]

    def get(self, skill_hash: str) -> ItemScores:
        return self.data.get(self.key(skill_hash), {})

    def complete(self, skill_hash: str, ids: Iterable[str]) -> bool:
        hit = self.data.get(self.key(skill_hash))
        return hit is not None and all(i in hit for i in ids)

    def add(self, skill_hash: str, scores: ItemScores, costs: ItemCosts | None = None) -> None:
        self.data.setdefault(self.key(skill_hash), {}).update(scores)
        if costs:
            self.costs.setdefault(self.key(skill_hash), {}).update(costs)
        if self.path is not None:
            atomic_write_json(self.path, self.data)
            if costs:
                atomic_write_json(_costs_path(self.path), self.costs)

    def cost(self, skill_hash: str, ids: Iterable[str], model: str) -> ItemCost | None:
        """What `skill_hash` spent per item of `ids` (`mean_cost`; None: nothing measured)."""
        return mean_cost(self.costs.get(self.key(skill_hash), {}), ids, model)

    def merged(self, *others: ScoreCache) -> ScoreCache:
        """One in-memory view of several caches of one dtype (no file)."""
        out = ScoreCache(None, {h: dict(v) for h, v in self.data.items()}, dtype=self.dtype)
        out.costs = {h: dict(v) for h, v in self.costs.items()}
        for other in others:
            for h, v in other.data.items():
                out.data.setdefault(h, {}).update(v)
            for h, c in other.costs.items():
                out.costs.setdefault(h, {}).update(c)
        return out


def _costs_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}_costs.json")


def answer_dtype(model: Any) -> str | None:
    """The dtype `model` answers in, for a `ScoreCache`'s key: a local model's
    (`LocalModel.answer_dtype`, found through wrappers' `inner`) when it is not float32;
    None for float32 and for models that do not say."""
    seen = 0
    while model is not None and seen < 16:  # wrappers of wrappers, never a cycle
        dtype = getattr(model, "answer_dtype", None)
        if isinstance(dtype, str):
            return None if dtype == "float32" else dtype
        model, seen = getattr(model, "inner", None), seen + 1
    return None


async def ascore(
    task: Task,
    model: ChatModel,
    policy: Policy,
    examples: Sequence[Example],
    *,
    split: str,
    rollout: RolloutConfig | None = None,
    cache: ScoreCache | None = None,
) -> EvalResult:
    """Score `policy` on `examples`. With a `cache`, items it holds for the policy's hash are
    read, the others rolled out and added; accuracy covers every example, tokens the rollouts
    run now. Without one, every example is rolled out (`rollout.samples` times each)."""
    skill_hash = policy.skill_hash()
    hit = cache.get(skill_hash) if cache is not None else {}
    missing = [ex for ex in examples if ex.id not in hit]
    t0 = time.perf_counter()
    rollouts = await arun_rollouts(model, policy, task, missing, rollout) if missing else []
    items = None
    if cache is not None:
        fresh = item_scores(rollouts)
        if missing:
            cache.add(skill_hash, fresh, item_costs(rollouts))
        items = {ex.id: fresh[ex.id] if ex.id in fresh else hit[ex.id] for ex in examples}
    return summarize(
        rollouts,
        task=task.name,
        model=model.name,
        split=split,
        wall_s=time.perf_counter() - t0,
        skill_hash=skill_hash,
        items=items,
    )


def _head(text: str, n: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= n else text[:n] + "…"


def rollout_row(r: Rollout) -> dict[str, Any]:
    """One rollout as a diagnostics row: reply head, scores, why it failed, errors."""
    return {
        "id": r.example_id,
        "reply_head": _head(r.reply),
        "hard": r.score.hard if r.score else None,
        "soft": r.score.soft if r.score else None,
        "why": (r.score.feedback if r.score and not r.score.hard else "") or None,
        "truncated": r.truncated,
        "error": r.error,
        **episode_row(r),  # episodes: turns, calls, results, final answer; {} otherwise
    }


def error_rows(rollouts: Iterable[Rollout]) -> list[dict[str, Any]]:
    """The rollouts that errored: id and error."""
    return [{"id": r.example_id, "error": r.error} for r in rollouts if r.error]


async def aevaluate_split(
    task: Task,
    model: ChatModel,
    policy: Policy | None = None,
    *,
    split: Split = "test",
    limit: int | None = None,
    rollout: RolloutConfig | None = None,
) -> EvalResult:
    policy = policy or Policy()
    examples = task.examples(split)
    if limit is not None:
        if limit <= 0:
            raise TaskError(f"--limit must be positive, got {limit}")
        examples = examples[:limit]
    if not examples:
        raise TaskError(f"task {task.name!r} has no {split} examples")
    cfg = rollout or RolloutConfig(description=f"eval {split}")
    return await ascore(task, model, policy, examples, split=split, rollout=cfg)


def evaluate_split(*args: Any, **kwargs: Any) -> EvalResult:
    return run_sync(aevaluate_split(*args, **kwargs))
