"""Teacher demos: worked replies the optimizer model writes for train items the target failed,
kept only when the task's own scorer passes them (`SkillOptConfig.teacher_demos`).

Where the target solves too few train items there is nothing to bootstrap a demo from
(gym:chain_sum, Qwen2.5-Coder-0.5B: 1 of 30 val items at the start). DSPy's BootstrapFewShot
runs a teacher (the same program, often a stronger model) on train inputs without their
labels, shows it labelled train examples other than the one it answers, and keeps a trace
only when the metric passes it; an error is counted, never a pass. The same here:

- asked only when the pool holds fewer than `demos_max` demos beyond bare references, about
  at most `teacher_demos` train items of the step's batch that the target failed, each item
  once per run (`DemoPool.teacher_asked`, saved with the pool);
- never an item marked `no_demo` (sleep: checked by an end user, whose words must not reach
  the skill), never one whose input nearly copies a val / test input, and never an item of
  a tool or workspace task (one reply is not an episode);
- the teacher sees the parent's rules, up to `SHOWN_REFERENCES` other train items with their
  references (the pool's reference demos: scorer-passed, leak-checked), and the item's input
  as the target sees it, never the item's own reference;
- its reply is scored by `rollout.score_reply`, the path every rollout takes: only hard == 1
  makes a demo (source "teacher"); a crashed scorer is an error, a reply cut off at
  max_tokens (the target's own cap) or left empty is no demo. Its calls are the optimizer's
  (charged to the optimizer role of the ledger and the budget)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from selftaught.demos import Demo, LeakCheck
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.rollout import Rollout, score_reply, workspace_spec
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import DemoPool, no_demo
from selftaught.skill.reflect import clip, load_prompt, render
from selftaught.tasks.base import Example, Task
from selftaught.tasks.episode import is_tool_task

AttemptStatus = Literal[
    "demo", "failed", "truncated", "unreadable", "scorer_error", "backend_error"
]

SHOWN_REFERENCES = 3  # other train items shown with their references (DSPy: labelled demos)

_REPLY = re.compile(r"<reply>(.*?)</reply>", re.DOTALL)


@dataclass(frozen=True)
class TeacherAttempt:
    """One train item the teacher was asked about, and what became of its reply."""

    example_id: str
    status: AttemptStatus
    reply: str = ""  # as read (clipped in diagnostics)
    why: str = ""  # the scorer's feedback, or the error

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.example_id,
            "status": self.status,
            "reply": clip(self.reply, 600),
            "why": clip(self.why, 300),
        }


def read_reply(text: str) -> str | None:
    """The reply between the last <reply> and </reply>; a reply without the tags is taken
    whole; an opened tag never closed (cut off) or an empty reply is unreadable (None)."""
    tagged = _REPLY.findall(text)
    if tagged:
        return tagged[-1].strip() or None
    if "<reply>" in text:
        return None
    return text.strip() or None


def wants_teacher(pool: DemoPool, config: SkillOptConfig) -> bool:
    """The teacher is asked only while the pool holds fewer than `demos_max` demos beyond
    bare references."""
    return config.teacher_demos > 0 and config.demos_max > 0 and pool.own() < config.demos_max


def teacher_items(
    pool: DemoPool,
    rollouts: Sequence[Rollout],
    examples: dict[str, Example],
    task: Task,
    check: LeakCheck,
    n: int,
) -> list[Example]:
    """At most `n` train items of `rollouts` the target failed (every scored attempt failed),
    in batch order: none marked `no_demo`, none already with a demo beyond a reference, none
    asked before, none whose input leaks, none of a tool or workspace task."""
    if is_tool_task(task):
        return []
    scored: dict[str, bool] = {}
    for r in rollouts:
        if r.score is not None and r.error is None:
            scored[r.example_id] = scored.get(r.example_id, False) or bool(r.score.hard)
    out: list[Example] = []
    for ex_id, solved in scored.items():
        ex = examples.get(ex_id)
        if solved or ex is None or no_demo(ex) or ex_id in pool.teacher_asked:
            continue
        held = pool.demos.get(ex_id)
        if held is not None and held.source != "reference":
            continue
        if workspace_spec(task, ex) is not None:
            continue
        if check.find(Demo.of(ex.id, ex.input, "", "teacher")) is not None:
            continue
        out.append(ex)
        if len(out) == n:
            break
    return out


def task_text(ex: Example, instructions: str) -> str:
    """The item's input as the target reads it: its turns (a chat input's system turns are
    the policy's to give), then the task's instructions."""
    if isinstance(ex.input, str):
        text = ex.input.strip()
    else:
        text = "\n\n".join(
            f"{m.get('role', 'user')}: {m.get('content', '')}"
            for m in ex.input
            if m.get("role") != "system"
        )
    return f"{text}\n\n{instructions.strip()}" if instructions.strip() else text


class Teacher:
    """The optimizer model writing replies for failed train items; the task's scorer decides."""

    def __init__(self, model: ChatModel, task: Task, config: SkillOptConfig):
        self.model = model
        self.task = task
        self.config = config
        self.prompt = load_prompt("teacher_demo")
        # the target's own cap: a reply the target could not finish teaches truncation
        self.params = GenerationParams(
            max_tokens=config.max_tokens, temperature=config.analyst_temperature
        )

    def render(self, ex: Example, rules: str, shown: Sequence[Demo]) -> str:
        refs = [d for d in shown if d.id != ex.id][:SHOWN_REFERENCES]
        examples = "".join(
            f"### Example {i}\nInput:\n{clip(d.input_text(), self.config.max_input_chars)}\n"
            f"Expected answer: {clip(d.reply, self.config.max_reply_chars)}\n\n"
            for i, d in enumerate(refs, 1)
        )
        if examples:
            examples = f"## Solved examples of this task (their expected answers)\n{examples}"
        return render(
            self.prompt,
            rules=rules.strip() or "(none)",
            examples=examples,
            task=task_text(ex, self.task.instructions),
        )

    async def write(
        self, items: Sequence[Example], rules: str, shown: Sequence[Demo]
    ) -> list[tuple[TeacherAttempt, Demo | None]]:
        """Each item's attempt, and its demo when the scorer passed the reply."""
        sem = asyncio.Semaphore(self.config.concurrency)

        async def one(ex: Example) -> tuple[TeacherAttempt, Demo | None]:
            async with sem:
                return await self._attempt(ex, rules, shown)

        return list(await asyncio.gather(*(one(ex) for ex in items)))

    async def _attempt(
        self, ex: Example, rules: str, shown: Sequence[Demo]
    ) -> tuple[TeacherAttempt, Demo | None]:
        messages = [{"role": "user", "content": self.render(ex, rules, shown)}]
        try:
            c = await asyncio.wait_for(
                self.model.achat(messages, self.params), self.config.timeout_s
            )
        except FatalBackendError:
            raise
        except (TransientBackendError, asyncio.TimeoutError) as err:
            return TeacherAttempt(ex.id, "backend_error", why=str(err) or "timed out"), None
        reply = read_reply(c.text)
        if c.truncated:
            return TeacherAttempt(ex.id, "truncated", c.text, "cut off at max_tokens"), None
        if reply is None:
            return TeacherAttempt(ex.id, "unreadable", c.text, "no reply to read"), None
        score, error, _ = await asyncio.to_thread(score_reply, self.task, reply, ex, False)
        if score is None:  # a crashed scorer (or its judge): an error, never a score
            return TeacherAttempt(ex.id, "scorer_error", reply, error or ""), None
        if not score.hard:
            return TeacherAttempt(ex.id, "failed", reply, score.feedback), None
        return TeacherAttempt(ex.id, "demo", reply, score.feedback), Demo.of(
            ex.id, ex.input, reply, "teacher"
        )


async def teach(
    teacher: Teacher,
    pool: DemoPool,
    rollouts: Sequence[Rollout],
    examples: dict[str, Example],
    check: LeakCheck,
    rules: str,
) -> tuple[list[TeacherAttempt], int]:
    """One step's teacher demos: (the attempts, how many demos joined the pool). Nothing is
    asked when the pool already holds enough demos beyond references."""
    config = teacher.config
    if not wants_teacher(pool, config):
        return [], 0
    items = teacher_items(pool, rollouts, examples, teacher.task, check, config.teacher_demos)
    if not items:
        return [], 0
    shown = [d for d in pool.demos.values() if d.source == "reference"]
    done = await teacher.write(items, rules, shown)
    pool.teacher_asked += [ex.id for ex in items]
    new = pool.add([d for _, d in done if d is not None], check)
    return [a for a, _ in done], len(new)
