"""GRPO's reward functions. Each is one TRL reward function: TRL sums them with
`GRPOConfig.reward_weights` into the reward its advantages come from, and logs each one's
mean as `rewards/<name>/mean` (our history keeps it as `rewards/<name>`).

- `correctness`: the task's scorer (`TaskReward`; `EpisodeReward` for tasks with tools).
- `format`: 1 when the reply ended on its own (not cut by `max_completion_length`), holds
  text, and holds the answer in the form the task reads: for a game, a JSON strategy valid
  against the task's schema; for free text, a non-empty answer (`extract_answer`). Else 0.
  It never looks at the reference, so it tells nothing about the answer; an empty reply (the
  model stopping at once) scores 0.
- `judge`: an LLM judge's score of the reply (`LlmJudge`: score / 10, or 1 at 7/10 and up).

Every one of them is under the one error rule: a reward that cannot be computed (a scorer
or a format check that raises, a judge that fails) is an error, recorded with its message and
counted, never a 0. An errored completion gets the mean of that reward over the other
completions for its prompt, so it moves no advantage; a batch whose rewards are mostly errors
stops the run (`RewardError`) with the first cause."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from selftaught.errors import ConfigError, RunError
from selftaught.models.base import ChatModel, Completion
from selftaught.models.usage import UsageLedger
from selftaught.tasks.base import Example, Score, Task


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as a list of messages; plain ones as text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def final_reply(completion: Any) -> str:
    """The reply a completion ended on: its text, or for an episode the last assistant
    message when it calls no tool ("" when the episode ended on a tool call or result)."""
    if not isinstance(completion, list):
        return completion_text(completion)
    last = completion[-1] if completion else {}
    if not isinstance(last, dict) or last.get("role", "assistant") != "assistant":
        return ""
    if last.get("tool_calls"):
        return ""
    return str(last.get("content") or "")


class RewardError(RunError):
    """Most rewards of a generation batch could not be computed: the run stops with the cause
    instead of learning from made-up rewards."""


class Reward:
    """One reward function under the one error rule (see the module). Records, per call (= one
    generation batch), whether every reward was equal, and reports each batch's rewards to
    `on_batch` (the run's `RewardSet`)."""

    def __init__(
        self,
        name: str,
        examples: list[Example],
        *,
        max_error_share: float = 0.5,
        ledger: UsageLedger | None = None,
    ):
        self.__name__ = name  # TRL names the reward column (rewards/<name>/mean) after this
        self.ledger = ledger  # each scored completion is charged here (the run's budget)
        self.by_id = {ex.id: ex for ex in examples}
        self.max_error_share = max_error_share
        self.flat_batches = 0
        self.batches = 0
        self.errors = 0
        self.scored = 0
        self.error_messages: list[str] = []
        self.last_rewards: list[float] = []
        self.on_batch: Callable[[Reward, list[float]], None] | None = None

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        raise NotImplementedError

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        example_id: list[str],
        completion_ids: list[list[int]] | None = None,
        environments: list[Any] | None = None,
        **_: Any,
    ) -> list[float]:
        ids = completion_ids or [[] for _ in completions]
        if self.ledger is not None:
            _charge_completions(self.ledger, "local:grpo-policy", ids)
        envs = environments or [None] * len(completions)
        raw: list[float | None] = []
        for completion, eid, env, tokens in zip(completions, example_id, envs, ids, strict=True):
            value, error = self._score(completion, eid, env, len(tokens))
            raw.append(value)
            if error is not None:
                self.errors += 1
                if len(self.error_messages) < 20:
                    self.error_messages.append(error)
        self.batches += 1
        failed = sum(v is None for v in raw)
        self.scored += len(raw) - failed
        if raw and failed / len(raw) > self.max_error_share:
            raise RewardError(
                f"{failed} of {len(raw)} rewards of a step could not be computed "
                f"({self.__name__} errors), e.g. {self.error_messages[-1]}"
            )
        rewards = _neutral_fill(raw, example_id)
        self.last_rewards = rewards
        if len(set(rewards)) <= 1:
            self.flat_batches += 1
        if self.on_batch is not None:
            self.on_batch(self, rewards)
        return rewards


def _value(score: Score | None, error: str | None, kind: str) -> tuple[float | None, str | None]:
    if score is None:
        return None, error
    return float(score.soft if kind == "soft" else score.hard), None


class TaskReward(Reward):
    """`correctness`: the task's scorer as the reward (`kind`: its soft or hard score)."""

    def __init__(self, task: Task, examples: list[Example], kind: str = "soft", **kw: Any):
        super().__init__("correctness", examples, **kw)
        self.task = task
        self.kind = kind

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import score_reply

        score, error, _ = score_reply(
            self.task, completion_text(completion), self.by_id[eid], truncated=False
        )
        return _value(score, error, self.kind)


class EpisodeReward(TaskReward):
    """The task's `score_episode` as the reward of an episode TRL played with its
    `environment_factory` (see `weights.trl_env`): failed calls cost soft score as in every
    other mode, and a crashed tool makes the completion an error (neutral), never a 0."""

    def __init__(
        self,
        task: Task,
        examples: list[Example],
        kind: str = "soft",
        *,
        max_iterations: int,
        max_completion_length: int,
        **kw: Any,
    ):
        super().__init__(task, examples, kind, **kw)
        self.max_iterations = max_iterations
        self.max_completion_length = max_completion_length

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import score_episode
        from selftaught.weights.trl_env import episode_from_completion

        if environment is None or getattr(environment, "env", None) is None:
            return None, f"{eid}: TRL gave no environment for this episode"
        if environment.crash:
            return None, f"tool error on {eid}: {environment.crash}"
        if not isinstance(completion, list):
            completion = [{"role": "assistant", "content": str(completion)}]
        episode, truncated = episode_from_completion(
            completion,
            environment,
            max_iterations=self.max_iterations,
            truncated=n_tokens >= self.max_completion_length,
        )
        score, error, _ = score_episode(self.task, episode, self.by_id[eid], truncated)
        return _value(score, error, self.kind)


def format_score(task: Task, reply: str, truncated: bool) -> Score:
    """The `format` reward of one reply (see the module): 0/1, never from the reference."""
    if truncated:
        return Score(0.0, 0.0, "cut by the length cap")
    if not reply.strip():
        return Score(0.0, 0.0, "no text")
    schema = getattr(task, "schema", None) if task.kind == "game" else None
    if schema is not None:
        from jsonschema.validators import validator_for

        from selftaught.errors import InputError
        from selftaught.tasks.extract import extract_json

        try:
            strategy = extract_json(reply)
        except InputError:
            return Score(0.0, 0.0, "no JSON strategy")
        if not validator_for(schema)(schema).is_valid(strategy):
            return Score(0.0, 0.0, "the strategy does not match the task's schema")
        return Score(1.0, 1.0, "a JSON strategy valid against the schema")
    from selftaught.tasks.extract import extract_answer

    if not extract_answer(reply):
        return Score(0.0, 0.0, "an empty answer")
    return Score(1.0, 1.0, "an answer the task can read")


class FormatReward(Reward):
    """`format`: `format_score` of the reply the completion ended on (0/1). A completion that
    reached `max_completion_length` tokens counts as cut."""

    def __init__(
        self, task: Task, examples: list[Example], *, max_completion_length: int, **kw: Any
    ):
        super().__init__("format", examples, **kw)
        self.task = task
        self.max_completion_length = max_completion_length

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import guarded_score

        reply = final_reply(completion)
        cut = n_tokens >= self.max_completion_length
        score, error, _ = guarded_score(
            lambda: format_score(self.task, reply, cut), self.by_id[eid], truncated=False
        )
        return _value(score, error, "hard")


class JudgeReward(Reward):
    """`judge`: an LLM judge (`LlmJudge` with its packaged prompt and default rubric; an
    example's own `rubric` wins) scores the reply the completion ended on. A judge that fails
    is an error, never a 0; a fatal judge error or an exhausted budget stops the run."""

    def __init__(
        self, examples: list[Example], judge_model: ChatModel, kind: str = "soft", **kw: Any
    ):
        from selftaught.tasks.scorers import LlmJudge

        super().__init__("judge", examples, **kw)
        self.judge = LlmJudge(judge_model)
        self.kind = kind

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import guarded_score

        example = self.by_id[eid]
        reply = final_reply(completion)
        score, error, _ = guarded_score(lambda: self.judge(reply, example), example, False)
        return _value(score, error, self.kind)


class RewardSet:
    """The run's reward functions in TRL's order with their weights. After each generation
    batch, `last_rewards` is the weighted sum per completion (the reward TRL's advantages
    come from), and `flat_batches` counts the batches where it was the same for all."""

    def __init__(self, funcs: list[Reward], weights: list[float]):
        if len(funcs) != len(weights) or not funcs:
            raise ConfigError("one weight per reward function, at least one function")
        self.funcs = funcs
        self.weights = weights
        self.last_rewards: list[float] = []
        self.batches = 0
        self.flat_batches = 0
        self._pending: dict[str, list[float]] = {}
        for func in funcs:
            func.on_batch = self._scored

    def _scored(self, func: Reward, rewards: list[float]) -> None:
        self._pending[func.__name__] = rewards
        if len(self._pending) < len(self.funcs):
            return
        columns = [self._pending[f.__name__] for f in self.funcs]
        self._pending = {}
        self.last_rewards = [
            sum(w * r for w, r in zip(self.weights, row, strict=True))
            for row in zip(*columns, strict=True)
        ]
        self.batches += 1
        if len(set(self.last_rewards)) <= 1:
            self.flat_batches += 1

    @property
    def errors(self) -> int:
        return sum(f.errors for f in self.funcs)

    @property
    def names(self) -> list[str]:
        return [f.__name__ for f in self.funcs]


def _charge_completions(ledger: UsageLedger, name: str, completion_ids: list[list[int]]) -> None:
    for ids in completion_ids:
        ledger.record("target", name, Completion(text="", completion_tokens=len(ids)))


def _neutral_fill(raw: list[float | None], group_of: list[str]) -> list[float]:
    """Errored rewards become their group's mean over the scored ones (advantage zero)."""
    groups: dict[str, list[float]] = {}
    for value, group in zip(raw, group_of, strict=True):
        if value is not None:
            groups.setdefault(group, []).append(value)
    filled = []
    for value, group in zip(raw, group_of, strict=True):
        if value is None:
            scored = groups.get(group, [])
            value = sum(scored) / len(scored) if scored else 0.0
        filled.append(value)
    return filled
