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

from selftaught.models.base import ChatModel, Completion, GenerationParams, Message, run_sync
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
    sample: int = 0  # which of the `samples` attempts at this example

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
            "sample": self.sample,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        score = Score(**d["score"]) if d.get("score") else None
        fields = {k: v for k, v in d.items() if k != "score"}
        return cls(score=score, **fields)


@dataclass
class RolloutConfig:
    concurrency: int = 8
    """Requests in flight at once (a request for `samples` completions counts once)."""
    timeout_s: float = 300.0
    """Per request, on top of the backend's own retries."""
    params: GenerationParams = field(default_factory=GenerationParams)
    samples: int = 1
    """Attempts per example, asked as one request for n completions (sample at temperature
    > 0 for them to differ)."""
    progress: bool = True
    description: str = "rollout"

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")


async def _complete(
    model: ChatModel, messages: list[Message], params: GenerationParams, n: int
) -> list[Completion]:
    if n == 1:
        return [await model.achat(messages, params)]
    return list(await model.achat_n(messages, params, n))


async def _attempts(
    model: ChatModel,
    policy: Policy,
    task: Task,
    example: Example,
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
) -> list[Rollout]:
    """The `cfg.samples` rollouts of one example (all carrying the error if the call failed)."""
    messages = policy.messages(task, example)
    rollouts = [
        Rollout(example_id=example.id, messages=messages, skill_hash=policy.skill_hash(), sample=i)
        for i in range(cfg.samples)
    ]
    async with sem:
        t0 = time.perf_counter()
        try:
            completions = await asyncio.wait_for(
                _complete(model, messages, cfg.params, cfg.samples), cfg.timeout_s
            )
        except FatalBackendError:
            raise
        except TransientBackendError as err:
            for r in rollouts:
                r.error, r.error_source, r.retries = str(err), "backend", err.retries
                r.latency_s = time.perf_counter() - t0
            return rollouts
        except asyncio.TimeoutError:
            for r in rollouts:
                r.error = f"{model.name}: timed out after {cfg.timeout_s:.0f}s"
                r.error_source = "timeout"
                r.latency_s = time.perf_counter() - t0
            return rollouts
    for r, c in zip(rollouts, completions, strict=True):
        r.reply = c.text
        r.prompt_tokens, r.completion_tokens = c.prompt_tokens, c.completion_tokens
        r.latency_s, r.truncated, r.retries = c.latency_s, c.truncated, c.retries
        r.cached = c.cached
        r.score, r.error, r.error_source = await asyncio.to_thread(
            score_reply, task, c.text, example, r.truncated
        )
    return rollouts


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
    """Roll out `policy` on each example (`cfg.samples` times each); results come back in
    input order, an example's samples together."""
    cfg = cfg or RolloutConfig()
    sem = asyncio.Semaphore(max(1, cfg.concurrency))

    async def indexed(i: int, ex: Example) -> tuple[int, list[Rollout]]:
        return i, await _attempts(model, policy, task, ex, cfg, sem)

    jobs = [asyncio.ensure_future(indexed(i, ex)) for i, ex in enumerate(examples)]
    results: list[list[Rollout] | None] = [None] * len(jobs)
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
                i, attempts = await fut
                done += len(attempts)
                solved += sum(int(r.score.hard) for r in attempts if r.ok and r.score is not None)
                progress.update(bar, advance=1, acc=f"{solved}/{done}")
                results[i] = attempts
    except BudgetExhausted:
        # the calls already sent are paid for: let them finish (the jobs still waiting are
        # refused by the budget at once), so what is charged is what the backend served
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    except BaseException:
        for j in jobs:
            j.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return [r for attempts in results if attempts is not None for r in attempts]


def run_rollouts(
    model: ChatModel,
    policy: Policy,
    task: Task,
    examples: Sequence[Example],
    cfg: RolloutConfig | None = None,
) -> list[Rollout]:
    return run_sync(arun_rollouts(model, policy, task, examples, cfg))
