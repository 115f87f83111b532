"""Evaluate a policy on a task split: hard and soft accuracy with 95% intervals, tokens, errors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from selftaught.gate import GateConfig, ValScores, metric_value
from selftaught.models.base import ChatModel, run_sync
from selftaught.policy import Policy
from selftaught.rollout import Rollout, RolloutConfig, arun_rollouts
from selftaught.stats import mean_interval, wilson_interval
from selftaught.tasks.base import Split, Task, TaskError


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
    soft_ci: tuple[float, float]
    prompt_tokens: int
    completion_tokens: int
    truncated: int
    retries: int
    wall_s: float
    skill_hash: str
    rollouts: list[Rollout] = field(default_factory=list, repr=False)
    usage: dict[str, Any] = field(default_factory=dict)  # per role, when a ledger was kept
    tool_use: dict[str, Any] | None = None  # episodes only (`tool_use`)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "rollouts"}

    @classmethod
    def from_summary(cls, d: dict[str, Any]) -> EvalResult:
        """Back from `summary()` (as stored in a run directory), without the rollouts."""
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for key in ("hard_ci", "soft_ci"):
            fields[key] = tuple(fields[key])
        return cls(**fields)

    def val_scores(self, gate: GateConfig) -> ValScores:
        """Per-example values of the gate's metric (None where the rollout errored), the
        input of `selftaught.gate.gate`."""
        return {
            r.example_id: (
                metric_value(r.score, gate.metric, gate.mixed_weight)
                if r.ok and r.score is not None
                else None
            )
            for r in self.rollouts
        }

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


def summarize(
    rollouts: list[Rollout], *, task: str, model: str, split: str, wall_s: float, skill_hash: str
) -> EvalResult:
    scored = [r for r in rollouts if r.ok and r.score is not None]
    hard = [r.score.hard for r in scored if r.score]
    soft = [r.score.soft for r in scored if r.score]
    n = len(scored)
    return EvalResult(
        task=task,
        model=model,
        split=split,
        n=n,
        n_errors=len(rollouts) - n,
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
    )


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
    t0 = time.perf_counter()
    rollouts = await arun_rollouts(model, policy, task, examples, cfg)
    return summarize(
        rollouts,
        task=task.name,
        model=model.name,
        split=split,
        wall_s=time.perf_counter() - t0,
        skill_hash=policy.skill_hash(),
    )


def evaluate_split(*args: Any, **kwargs: Any) -> EvalResult:
    return run_sync(aevaluate_split(*args, **kwargs))
