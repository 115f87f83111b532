"""Async rollout runner: bounded concurrency, per-call timeouts, progress, one record each.

One error rule: a backend that fails transiently (after retries), a call that times out and
a scorer that raises all give a rollout with `error` set (and `error_source` saying which)
and no score; so does a tool that crashes mid-episode. None of them is a wrong answer, and none
aborts the batch. Only a fatal backend error (bad key, unknown model, unreachable endpoint)
stops the whole batch at once.

A rollout is an episode (see `selftaught.tasks.episode`): for a task with tools, the model's
tool calls run against the episode's environment and it answers again, until a final answer or
a cap; tokens are summed over its turns and the whole trajectory is kept. A task without tools
is the one-step case and takes the plain path (one call per example, nothing added).

A CLI agent (`selftaught.models.agents`) runs its own episode inside one call: its tool calls
and results come back in the completion and become the rollout's trajectory, and what it ran
and changed is kept in `agent`. An example whose task gives it a workspace (`workspace_for`)
gets a fresh folder per attempt, handed to the model (`selftaught.workspace`) and scored after
it (`score_workspace`: a check on the files, not on the words)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.errors import ConfigError, TaskError
from selftaught.models.base import (
    ChatModel,
    Completion,
    GenerationParams,
    Message,
    params_for_sample,
    run_sync,
)
from selftaught.models.errors import BackendError, FatalBackendError, TransientBackendError
from selftaught.models.usage import BudgetExhausted
from selftaught.policy import Policy
from selftaught.progress_lines import ProgressLines, plain_lines_wanted
from selftaught.tasks.base import Example, Score, Task
from selftaught.tasks.episode import (
    DEFAULT_MAX_TURNS,
    Episode,
    StopReason,
    ToolCrash,
    ToolTask,
    answer_malformed,
    finish_score,
    is_tool_task,
    run_tool_calls,
    with_ids,
)
from selftaught.workspace import Workspace, WorkspaceSpec, using_workspace

ErrorSource = Literal["backend", "timeout", "scorer", "tool"]
EPISODE_FIELDS = ("turns", "tool_calls", "tool_errors", "stop", "trajectory")
RolloutStop = Literal[StopReason, "error"]


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
    # episodes (tasks with tools) only; a one-step rollout keeps the defaults
    turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0  # calls the model got wrong (unknown tool, bad arguments, refused)
    stop: RolloutStop | None = None  # why the episode ended; None for a one-step rollout
    trajectory: list[Message] = field(default_factory=list)
    """After the prompt (`messages`): assistant turns with their tool_calls, tool results,
    the final answer. Empty for a one-step rollout (its reply is `reply`)."""
    agent: dict[str, Any] | None = None
    """A CLI agent's run: its CLI and version, the files it changed, its own facts (session,
    cost); None for any other model."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.score is not None

    @property
    def is_episode(self) -> bool:
        return self.stop is not None

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
            # one-step rows keep the shape they always had
            **({k: getattr(self, k) for k in EPISODE_FIELDS} if self.is_episode else {}),
            **({"agent": self.agent} if self.agent is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        """Back from `to_dict`; rows written before episodes existed load as one-step ones."""
        score = Score(**d["score"]) if d.get("score") else None
        fields = {k: v for k, v in d.items() if k != "score"}
        return cls(score=score, **fields)


CALLS_PER_ROLLOUT = 10
"""A rollout's time limit counts this many model-call timeouts: the backend retries a failed
call, and an episode makes several calls."""


def rollout_timeout(call_timeout_s: float) -> float:
    """The one rule tying a rollout's limit to the per-call timeout the user sets."""
    return call_timeout_s * CALLS_PER_ROLLOUT


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
    max_turns: int | None = None
    """Episodes: model calls at most (None: the task's `max_turns`, else 8)."""
    max_episode_tokens: int | None = None
    """Episodes: completion tokens summed over turns at most (None: no cap but each turn's
    `params.max_tokens`); a turn is asked for no more than what is left."""

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ConfigError(f"samples must be >= 1, got {self.samples}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ConfigError(f"max_episode_tokens must be >= 1, got {self.max_episode_tokens}")


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
    if is_tool_task(task):
        await asyncio.gather(*(_episode(model, task, example, r, cfg, sem) for r in rollouts))
        return rollouts
    spec = workspace_spec(task, example)
    if spec is not None:  # each attempt in its own folder
        await asyncio.gather(
            *(_in_workspace(model, task, example, r, spec, cfg, sem) for r in rollouts)
        )
        return rollouts
    completions = await _call(model, messages, cfg.params, cfg, sem, rollouts)
    if completions is None:
        return rollouts
    for r, c in zip(rollouts, completions, strict=True):
        take_completion(r, c)
        r.score, r.error, r.error_source = await asyncio.to_thread(
            score_reply, task, c.text, example, r.truncated
        )
    return rollouts


async def _call(
    model: ChatModel,
    messages: list[Message],
    params: GenerationParams,
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
    rollouts: list[Rollout],
) -> list[Completion] | None:
    """One request for `len(rollouts)` completions under the semaphore and the timeout; None
    (each rollout carrying the error) when it failed transiently or timed out."""
    async with sem:
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(
                _complete(model, messages, params, len(rollouts)), cfg.timeout_s
            )
        except FatalBackendError:
            raise
        except TransientBackendError as err:
            for r in rollouts:
                r.error, r.error_source, r.retries = str(err), "backend", err.retries
                r.latency_s = time.perf_counter() - t0
            return None
        except asyncio.TimeoutError:
            for r in rollouts:
                r.error = f"{model.name}: timed out after {cfg.timeout_s:.0f}s"
                r.error_source = "timeout"
                r.latency_s = time.perf_counter() - t0
            return None


def take_completion(r: Rollout, c: Completion) -> None:
    """The completion's reply, tokens and timing into `r`; a CLI agent's run also becomes an
    episode: its own tool calls and results are the trajectory."""
    r.reply = c.text
    r.prompt_tokens, r.completion_tokens = c.prompt_tokens, c.completion_tokens
    r.latency_s, r.truncated, r.retries = c.latency_s, c.truncated, c.retries
    r.cached = c.cached
    agent = c.extra.get("agent")
    if not isinstance(agent, dict):
        return
    r.agent = agent
    r.trajectory = list(c.extra.get("trajectory") or [{"role": "assistant", "content": c.text}])
    r.stop = "turn_cap" if c.truncated else "answer"
    r.turns = sum(1 for m in r.trajectory if m.get("role") == "assistant")
    r.tool_calls = int(agent.get("tool_calls", 0))
    r.tool_errors = int(agent.get("tool_errors", 0))


def workspace_spec(task: Task, example: Example) -> WorkspaceSpec | None:
    """The workspace the task gives `example` (None: none; see `JsonlTask.workspace_for`)."""
    getter = getattr(task, "workspace_for", None)
    return getter(example) if callable(getter) else None


async def _in_workspace(
    model: ChatModel,
    task: Task,
    example: Example,
    r: Rollout,
    spec: WorkspaceSpec,
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
) -> None:
    """One attempt in a fresh workspace: the model works there (a CLI agent does; a chat model
    ignores it), then the task scores the reply with the files it left."""
    workspace = await asyncio.to_thread(Workspace.create, spec.source)
    try:
        with using_workspace(workspace):
            params = params_for_sample(cfg.params, r.sample)
            completions = await _call(model, r.messages, params, cfg, sem, [r])
        if completions is None:
            return
        take_completion(r, completions[0])
        r.score, r.error, r.error_source = await asyncio.to_thread(
            score_in_workspace, task, r.reply, example, r.truncated, workspace.path
        )
    finally:
        await asyncio.to_thread(workspace.remove)


def score_reply(
    task: Task, reply: str, example: Example, truncated: bool
) -> tuple[Score | None, str | None, ErrorSource | None]:
    """(score, None, None), or (None, why, source) when scoring failed: a crashed scorer (or
    its judge model failing transiently) is an error, recorded with its message, never a 0.
    A fatal judge error and an exhausted budget propagate. A truncated wrong reply says so in
    its feedback."""
    return guarded_score(lambda: task.score(reply, example), example, truncated)


@runtime_checkable
class WorkspaceScorer(Protocol):
    """A task whose attempts work in a workspace (`JsonlTask`, the night's agent replay):
    `score_workspace` checks the files an attempt left."""

    def score_workspace(self, output: str, example: Example, workspace: Path) -> Score: ...


def score_in_workspace(
    task: Task, reply: str, example: Example, truncated: bool, workspace: Path
) -> tuple[Score | None, str | None, ErrorSource | None]:
    """`score_reply` for an attempt that worked in `workspace`: the task's `score_workspace`
    (a check that cannot give a verdict is a scorer error, never a 0)."""
    if not isinstance(task, WorkspaceScorer):
        raise TaskError(f"task {task.name!r} gives workspaces but has no score_workspace")
    scorer = task.score_workspace
    return guarded_score(lambda: scorer(reply, example, workspace), example, truncated)


def score_episode(
    task: Task, episode: Episode, example: Example, truncated: bool
) -> tuple[Score | None, str | None, ErrorSource | None]:
    """`score_reply` for a whole episode: the task's `score_episode` (or its `score` of the
    final answer), with failed tool calls and caps counted against it (`finish_score`)."""

    def scored() -> Score:
        judge = getattr(task, "score_episode", None)
        score = judge(episode, example) if callable(judge) else task.score(episode.final, example)
        return finish_score(score, episode)

    return guarded_score(scored, example, truncated)


def guarded_score(
    scored: Any, example: Example, truncated: bool
) -> tuple[Score | None, str | None, ErrorSource | None]:
    """`scored()` under the one error rule (see `score_reply`): every scorer of a reply,
    a GRPO reward function's included, goes through here."""
    try:
        score = scored()
    except (FatalBackendError, BudgetExhausted):
        raise
    except BackendError as err:  # the judge's backend, after its retries
        return None, f"judge error on {example.id}: {err}", "backend"
    except Exception as err:  # any scorer bug; KeyboardInterrupt etc. still propagate
        return None, f"scorer error on {example.id}: {type(err).__name__}: {err}", "scorer"
    if truncated and score.hard == 0:
        score = Score(0.0, score.soft, f"{score.feedback} [reply truncated at max_tokens]".strip())
    return score, None, None


# ---- episodes (tasks with tools) --------------------------------------------------------


async def _episode(
    model: ChatModel,
    task: ToolTask,
    example: Example,
    r: Rollout,
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
) -> None:
    """Play one episode into `r`: each turn's call holds the semaphore and has the timeout;
    the tools run between calls, outside it. Errors follow the one-step rule, plus a crashed
    tool (error_source "tool"); the trajectory so far is kept either way."""
    r.turns, r.stop = 0, "error"
    t0 = time.perf_counter()
    try:
        env = task.environment(example)
    except Exception as err:  # the task could not build the episode's world
        r.error = f"tool error on {example.id}: environment: {type(err).__name__}: {err}"
        r.error_source = "tool"
        return
    params = dataclasses.replace(
        params_for_sample(cfg.params, r.sample), tools=env.schemas() or None
    )
    choice = getattr(env, "tool_choice", None)  # e.g. a replay sends the logged one
    if choice is not None and params.tools:
        params = dataclasses.replace(params, tool_choice=choice)
    max_turns = cfg.max_turns or getattr(task, "max_turns", None) or DEFAULT_MAX_TURNS
    failed: list[str] = []
    try:
        stop, final = await _play(model, r, env, params, max_turns, failed, cfg, sem)
    except FatalBackendError:
        raise
    except TransientBackendError as err:
        r.error, r.error_source = str(err), "backend"
        r.retries += err.retries
    except asyncio.TimeoutError:
        r.error = f"{model.name}: timed out after {cfg.timeout_s:.0f}s"
        r.error_source = "timeout"
    except ToolCrash as err:
        r.error, r.error_source = f"tool error on {example.id}: {err}", "tool"
    r.latency_s = time.perf_counter() - t0
    if r.error is not None:
        return
    r.stop, r.reply = stop, final
    r.truncated = r.truncated or stop in ("turn_cap", "token_cap")
    episode = Episode(env, r.trajectory, final, stop, r.turns, r.tool_calls, failed)
    r.score, r.error, r.error_source = await asyncio.to_thread(
        score_episode, task, episode, example, r.truncated
    )


async def _play(
    model: ChatModel,
    r: Rollout,
    env: Any,
    params: GenerationParams,
    max_turns: int,
    failed: list[str],
    cfg: RolloutConfig,
    sem: asyncio.Semaphore,
) -> tuple[StopReason, str]:
    """The turns: call the model, run its tool calls, until a reply without calls or a cap.
    Returns why it stopped and the final answer (the last reply's text)."""
    cap = cfg.max_episode_tokens
    while True:
        turn_params = params
        if cap is not None:
            turn_params = dataclasses.replace(
                params, max_tokens=max(1, min(params.max_tokens, cap - r.completion_tokens))
            )
        async with sem:
            c = await asyncio.wait_for(
                model.achat(r.messages + r.trajectory, turn_params), cfg.timeout_s
            )
        r.turns += 1
        r.prompt_tokens += c.prompt_tokens
        r.completion_tokens += c.completion_tokens
        r.retries += c.retries
        r.cached = c.cached if r.turns == 1 else r.cached and c.cached
        r.truncated = r.truncated or c.truncated
        if c.tool_call_errors:  # calls the backend could not parse: failed calls, not an answer
            turn, results, errors = answer_malformed(
                c.text, c.tool_call_errors, c.extra.get("malformed_tool_calls"), r.turns
            )
            r.trajectory.append(turn)
            r.tool_calls += len(errors)  # none ran: tool_calls - tool_errors = calls that ran
        else:
            calls = with_ids(c.tool_calls or [], r.turns)
            turn = {"role": "assistant", "content": c.text}
            if calls:
                turn["tool_calls"] = calls
            r.trajectory.append(turn)
            if not calls:
                return ("length" if c.truncated else "answer"), c.text
            results, errors = await asyncio.to_thread(run_tool_calls, env, calls, r.turns)
            r.tool_calls += len(calls)
        r.trajectory.extend(results)
        r.tool_errors += len(errors)
        failed.extend(errors)
        if r.turns >= max_turns:
            return "turn_cap", c.text
        if params.tool_choice not in (None, "auto", "none"):
            # a forcing tool_choice ("required", a named function) holds for the first turn:
            # held on every turn, the model could never answer
            params = dataclasses.replace(params, tool_choice="auto")
        if cap is not None and r.completion_tokens >= cap:
            return "token_cap", c.text


def trajectory_lines(r: Rollout, limit: int = 300) -> list[str]:
    """An episode's trajectory as short lines (each cut at `limit` characters): every call with
    its arguments and result, then the final answer. Empty for a one-step rollout."""

    def cut(text: str) -> str:
        text = " ".join(str(text).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."

    results = {
        m.get("tool_call_id"): m.get("content", "") for m in r.trajectory if m.get("role") == "tool"
    }
    lines = []
    for i, m in enumerate(r.trajectory):
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            args = args if isinstance(args, str) else json.dumps(args)
            lines.append(cut(f"call {fn.get('name')}({args}) -> {results.get(call.get('id'), '')}"))
        if m.get("tool_calls"):
            continue
        answered = _tool_turns_after(r.trajectory, i)
        if answered:  # calls written as text that could not be parsed: not an answer
            said = " | ".join(str(t.get("content", "")) for t in answered)
            lines.append(cut(f"malformed call: {m.get('content', '')} -> {said}"))
        else:
            lines.append(cut(f"answer: {m.get('content', '')}"))
    if r.stop in ("turn_cap", "token_cap"):
        lines.append(f"stopped: {r.stop} after {r.turns} turns")
    changed = (r.agent or {}).get("files_changed")
    if changed:  # before the last line: the answer (or why it stopped) stays last
        lines.insert(max(0, len(lines) - 1), cut("files changed: " + ", ".join(changed)))
    return lines


def _tool_turns_after(trajectory: list[Message], i: int) -> list[Message]:
    """The tool turns right after turn i."""
    out = []
    for m in trajectory[i + 1 :]:
        if m.get("role") != "tool":
            break
        out.append(m)
    return out


def attempt_text(r: Rollout, max_chars: int) -> str:
    """What the agent did, for a reader with a budget (the analyst): a one-step rollout's
    reply as it is, or an episode's calls with their results and its final answer, cut to
    about `max_chars` (the last line, the final answer or why it stopped, is always kept)."""
    if not r.is_episode:
        return r.reply
    lines = trajectory_lines(r, limit=max(60, max_chars // 4))
    shown: list[str] = []
    last, used = lines[-1:], len(lines[-1]) if lines else 0
    for line in lines[:-1]:
        if used + len(line) > max_chars:
            shown.append(f"... ({len(lines) - 1 - len(shown)} more steps)")
            break
        shown.append(line)
        used += len(line) + 1
    return "\n".join(shown + last)


def episode_row(r: Rollout) -> dict[str, Any]:
    """Diagnostics fields of an episode (turns, calls, failed calls, why it stopped, the
    trajectory as lines, and a CLI agent's run: its CLI, version, seconds, files changed);
    {} for a one-step rollout, whose row stays as it was."""
    if not r.is_episode:
        return {}
    return {
        "turns": r.turns,
        "tool_calls": r.tool_calls,
        "tool_errors": r.tool_errors,
        "stop": r.stop,
        "trajectory": trajectory_lines(r),
        **({"agent": r.agent} if r.agent is not None else {}),  # a CLI agent's own facts
    }


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
    # off a terminal the bar shows nothing: a plain line a minute instead
    lines = ProgressLines(
        cfg.description, len(jobs), enabled=plain_lines_wanted(cfg.progress, progress.console)
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
                generated = sum(r.completion_tokens for r in attempts if not r.cached)
                lines.advance(tokens=generated, note=f"acc {solved}/{done}")
                results[i] = attempts
        lines.finish()
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
