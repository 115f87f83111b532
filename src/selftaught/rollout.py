"""Async rollout runner: bounded concurrency, per-call timeouts, progress, one record each.

One error rule: a backend that fails transiently (after retries), a call that times out and
a scorer that raises all give a rollout with `error` set (and `error_source` saying which)
and no score. None of them is a wrong answer, and none aborts the batch. Only a fatal backend
error (bad key, unknown model, unreachable endpoint) stops the whole batch at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.models.base import ChatModel, GenerationParams, Message, run_sync
from selftaught.models.errors import BackendError, FatalBackendError, TransientBackendError
from selftaught.models.usage import BudgetExhausted
from selftaught.policy import Policy
from selftaught.tasks.base import Example, Score, Task

ErrorSource = Literal["backend", "timeout", "scorer"]


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
    error_source: ErrorSource | None = None
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
            "error_source": self.error_source,
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
            r.error, r.error_source, r.retries = str(err), "backend", err.retries
            r.latency_s = time.perf_counter() - t0
            return r
        except asyncio.TimeoutError:
            r.error = f"{model.name}: timed out after {cfg.timeout_s:.0f}s"
            r.error_source = "timeout"
            r.latency_s = time.perf_counter() - t0
            return r
    r.reply = c.text
    r.prompt_tokens, r.completion_tokens = c.prompt_tokens, c.completion_tokens
    r.latency_s, r.truncated, r.retries, r.cached = c.latency_s, c.truncated, c.retries, c.cached
    r.score, r.error, r.error_source = await asyncio.to_thread(
        score_reply, task, c.text, example, r.truncated
    )
    return r


def score_reply(
    task: Task, reply: str, example: Example, truncated: bool
) -> tuple[Score | None, str | None, ErrorSource | None]:
    """(score, None, None), or (None, why, source) when scoring failed: a crashed scorer (or
    its judge model failing transiently) is an error, recorded with its message, never a 0.
    A fatal judge error and an exhausted budget propagate. A truncated wrong reply says so in
    its feedback."""
    try:
        score = task.score(reply, example)
    except (FatalBackendError, BudgetExhausted):
        raise
    except BackendError as err:  # the judge's backend, after its retries
        return None, f"judge error on {example.id}: {err}", "backend"
    except Exception as err:  # any scorer bug; KeyboardInterrupt etc. still propagate
        return None, f"scorer error on {example.id}: {type(err).__name__}: {err}", "scorer"
    if truncated and score.hard == 0:
        score = Score(0.0, score.soft, f"{score.feedback} [reply truncated at max_tokens]".strip())
    return score, None, None


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
