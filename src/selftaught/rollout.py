"""Async rollout runner: bounded concurrency, per-call timeouts, progress, one record each.

A backend that fails transiently (after retries) gives a rollout with `error` set and no
score: it is not a wrong answer. A fatal backend error stops the whole batch at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.models.base import ChatModel, GenerationParams, Message, run_sync
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.policy import Policy
from selftaught.tasks.base import Example, Score, Task


@dataclass
class Rollout:
    example_id: str
    messages: list[Message]
    reply: str = ""
    score: Score | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    truncated: bool = False
    retries: int = 0
    cached: bool = False
    error: str | None = None
    skill_hash: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.score is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "example_id": self.example_id,
            "skill_hash": self.skill_hash,
            "messages": self.messages,
            "reply": self.reply,
            "score": self.score.to_dict() if self.score else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": round(self.latency_s, 4),
            "truncated": self.truncated,
            "retries": self.retries,
            "cached": self.cached,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        score = Score(**d["score"]) if d.get("score") else None
        fields = {k: v for k, v in d.items() if k != "score"}
        return cls(score=score, **fields)


@dataclass
class RolloutConfig:
    concurrency: int = 8
    timeout_s: float = 300.0  # per call, on top of the backend's own retries
    params: GenerationParams = field(default_factory=GenerationParams)
    progress: bool = True
    description: str = "rollout"


async def _one(
    model: ChatModel,
    policy: Policy,
    task: Task,
    example: Example,
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
) -> Rollout:
    messages = policy.messages(task, example)
    r = Rollout(example_id=example.id, messages=messages, skill_hash=policy.skill_hash())
    async with sem:
        t0 = time.perf_counter()
        try:
            c = await asyncio.wait_for(model.achat(messages, cfg.params), cfg.timeout_s)
        except FatalBackendError:
            raise
        except TransientBackendError as err:
            r.error = str(err)
            r.retries = err.retries
            r.latency_s = time.perf_counter() - t0
            return r
        except asyncio.TimeoutError:
            r.error = f"{model.name}: timed out after {cfg.timeout_s:.0f}s"
            r.latency_s = time.perf_counter() - t0
            return r
    r.reply = c.text
    r.prompt_tokens, r.completion_tokens = c.prompt_tokens, c.completion_tokens
    r.latency_s, r.truncated, r.retries, r.cached = c.latency_s, c.truncated, c.retries, c.cached
    score = await asyncio.to_thread(task.score, c.text, example)
    if r.truncated and score.hard == 0:
        score = Score(0.0, score.soft, f"{score.feedback} [reply truncated at max_tokens]".strip())
    r.score = score
    return r


async def arun_rollouts(
    model: ChatModel,
    policy: Policy,
    task: Task,
    examples: Sequence[Example],
    cfg: RolloutConfig | None = None,
) -> list[Rollout]:
    """Roll out `policy` on each example; results come back in input order."""
    cfg = cfg or RolloutConfig()
    sem = asyncio.Semaphore(max(1, cfg.concurrency))

    async def indexed(i: int, ex: Example) -> tuple[int, Rollout]:
        return i, await _one(model, policy, task, ex, cfg, sem)

    jobs = [asyncio.ensure_future(indexed(i, ex)) for i, ex in enumerate(examples)]
    results: list[Rollout | None] = [None] * len(jobs)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        disable=not cfg.progress,
        transient=True,
    )
    solved = done = 0
    try:
        with progress:
            bar = progress.add_task(cfg.description, total=len(jobs), acc="-")
            for fut in asyncio.as_completed(jobs):
                i, r = await fut
                done += 1
                if r.ok and r.score is not None:
                    solved += int(r.score.hard)
                progress.update(bar, advance=1, acc=f"{solved}/{done}")
                results[i] = r
    except BaseException:
        for j in jobs:
            j.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return [r for r in results if r is not None]


def run_rollouts(
    model: ChatModel,
    policy: Policy,
    task: Task,
    examples: Sequence[Example],
    cfg: RolloutConfig | None = None,
) -> list[Rollout]:
    return run_sync(arun_rollouts(model, policy, task, examples, cfg))
