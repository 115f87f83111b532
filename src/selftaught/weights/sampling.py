"""Samples for weight training, made from rollouts.

Sampling goes through the one engine every other mode uses: a `ChatModel` (the in-process
model being trained, wrapped by `LocalModel.from_pretrained_model`, or any OpenAI-compatible
server that serves the round's model), `selftaught.rollout` (k completions per prompt in one
`achat_n` request) and the task's scorer. Here a scored rollout becomes a `Sample`: the prompt
it was scored on, the prompt it is trained on, and the training target. A rollout that
errored (backend, timeout, scorer) is no sample: it is counted, never scored as 0."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.policy import Policy
from selftaught.rollout import Rollout
from selftaught.tasks.base import Example, Task
from selftaught.tasks.episode import is_tool_task
from selftaught.tasks.extract import extract_json


@dataclass
class Sample:
    """One scored completion. `messages` is the prompt it was sampled and scored on;
    `train_messages` is the prompt it is trained on (the same, except under skill
    distillation, where the teacher skill is dropped); `target` is what is trained on: the
    reply verbatim for agent tasks, the canonical JSON strategy for games."""

    example_id: str
    messages: list[Message]
    train_messages: list[Message]
    completion: str
    target: str
    score: float
    hard: float
    truncated: bool = False
    feedback: str = ""
    completion_tokens: int = 0
    trajectory: list[Message] = field(default_factory=list)
    """Episodes only: the assistant turns (with their tool calls) and tool results after the
    prompt, trained on the assistant turns alone (tool results are masked out of the loss)."""
    tools: list[dict[str, Any]] | None = None
    """Episodes only: the OpenAI tools schema the episode was offered (rendered in training)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(**d)


def episode_target(trajectory: list[Message]) -> str:
    """An episode's whole trajectory as one string: what elite selection dedupes and ranks
    by length (the fewer and shorter the turns, the better among equal scores)."""
    return json.dumps(trajectory, sort_keys=True, separators=(",", ":"))


def training_target(task: Task, text: str) -> str:
    """Agent tasks train the raw text verbatim; games train the JSON strategy alone."""
    if task.kind != "game":
        return text
    try:
        return json.dumps(extract_json(text), separators=(",", ":"))
    except ValueError:
        return text


def samples_from_rollouts(
    task: Task, examples: list[Example], rollouts: list[Rollout], train_policy: Policy
) -> list[Sample]:
    """The scored rollouts as samples (errored ones are left out), each trained on
    `train_policy`'s prompt for its example."""
    by_id = {ex.id: ex for ex in examples}
    tools: dict[str, list[dict[str, Any]] | None] = {}
    samples = []
    for r in rollouts:
        if not r.ok or r.score is None:
            continue
        example = by_id[r.example_id]
        sample = Sample(
            example_id=r.example_id,
            messages=r.messages,
            train_messages=train_policy.messages(task, example),
            completion=r.reply,
            target=training_target(task, r.reply),
            score=float(r.score.soft),
            hard=float(r.score.hard),
            truncated=r.truncated,
            feedback=r.score.feedback,
            completion_tokens=r.completion_tokens,
        )
        if r.is_episode and is_tool_task(task):
            if r.example_id not in tools:  # the schema the episode was offered
                tools[r.example_id] = task.environment(example).schemas() or None
            sample.trajectory = r.trajectory
            sample.tools = tools[r.example_id]
            sample.target = episode_target(r.trajectory)
        samples.append(sample)
    return samples


def reference_samples(task: Task, examples: list[Example], policy: Policy) -> list[Sample]:
    """Plain SFT: each example's reference answer as the target."""
    out = []
    for ex in examples:
        if ex.reference is None:
            from selftaught.weights.config import ConfigError

            raise ConfigError(f"method 'sft' needs reference answers; {ex.id} has none")
        msgs = policy.messages(task, ex)
        ref = str(ex.reference)
        out.append(Sample(ex.id, msgs, msgs, ref, ref, 1.0, 1.0))
    return out


class RandomStrategyModel(AsyncChatModel):
    """Round 0 of a from-scratch model on a game: the game's own random strategies, answered
    through the chat protocol (a random-init transformer cannot write valid JSON, so there
    would be nothing to keep). Seeded: the same seed gives the same strategies."""

    def __init__(self, task: Any, seed: int = 0):
        import sys

        # a method of the task, or a function of the module that defines it (ctf's)
        fn = getattr(task, "random_strategy", None) or getattr(
            sys.modules.get(type(task).__module__), "random_strategy", None
        )
        if fn is None:
            from selftaught.weights.config import ConfigError

            raise ConfigError(
                f"backend 'scratch' needs a game task with random_strategy(rng); "
                f"{task.name!r} has none"
            )
        self.random_strategy = fn
        self.rng = random.Random(seed)
        self.name = "random-strategies"

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        return Completion(text=json.dumps(self.random_strategy(self.rng)), model=self.name)
