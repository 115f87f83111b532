"""Prompt assembly: skill (+ memory) + example → chat messages. Always conversational, so
chat models see their chat template (raw prompts make them ramble and zero every reward).
A skill's demonstrations (see `selftaught.demos`) become prior user/assistant turns or a
section of the system prompt, as the skill's demos block says; a block marked `retrieve=K`
is a pool from which each example gets its K most similar demos (`selftaught.retrieval`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from selftaught.demos import Demo, SkillParts, demo_section, demo_turns, split_skill
from selftaught.models.base import Message
from selftaught.tasks.base import Example, Task


@dataclass(frozen=True)
class Policy:
    """What acts on an example: the skill document and memory the frozen model reads."""

    skill: str = ""
    memory: str = ""

    @cached_property
    def parts(self) -> SkillParts:
        return split_skill(self.skill)

    def demos_for(self, example: Example | None = None) -> tuple[Demo, ...]:
        """The demos shown with `example`: the whole block, or (a retrieval pool) the K most
        similar to it, never the example itself; none for a pool without an example."""
        parts = self.parts
        if not parts.retrieve or not parts.demos:
            return parts.demos
        if example is None:
            return ()
        from selftaught.retrieval import retriever_for

        return retriever_for(parts.demos).pick(
            example.prompt_text(), parts.retrieve, exclude={example.id}
        )

    def system_prompt(self, demos: Sequence[Demo] | None = None) -> str:
        """Rules, the demos (`demos`, default `demos_for()`) when placed in the system prompt,
        then the memory."""
        demos = self.demos_for() if demos is None else demos
        parts = []
        rules = self.parts.rules.strip()
        if rules:
            parts.append(rules)
        if demos and self.parts.placement == "system":
            parts.append(demo_section(demos))
        if self.memory.strip():
            parts.append("## Memory\n" + self.memory.strip())
        return "\n\n".join(parts)

    def skill_hash(self) -> str:
        """Names what the model reads: the system prompt, and demo turns when there are any
        (a skill without demos keeps the hash it had before demos existed); a retrieval pool
        adds the pool, its K and placement."""
        key = self.system_prompt()
        if self.parts.demos and (self.parts.placement == "turns" or self.parts.retrieve):
            key += "\n" + json.dumps([d.to_dict() for d in self.parts.demos], sort_keys=True)
        if self.parts.retrieve and self.parts.demos:
            key += f"\nretrieve={self.parts.retrieve} placement={self.parts.placement}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def demo_messages(
        self, instructions: str = "", demos: Sequence[Demo] | None = None
    ) -> list[Message]:
        """The demos (`demos`, default `demos_for()`) as prior turns ([] unless the skill
        places them as turns)."""
        if self.parts.placement != "turns":
            return []
        return demo_turns(self.demos_for() if demos is None else demos, instructions)

    def messages(self, task: Task, example: Example) -> list[Message]:
        msgs: list[Message] = []
        demos = self.demos_for(example)
        system = self.system_prompt(demos)
        shots = self.demo_messages(task.instructions, demos)
        if isinstance(example.input, str):
            user = example.input
            if task.instructions:
                user = f"{user}\n\n{task.instructions}"
            if system:
                msgs.append({"role": "system", "content": system})
            msgs += shots
            msgs.append({"role": "user", "content": user})
            return msgs
        given = [dict(m) for m in example.input]
        if system:
            if given and given[0].get("role") == "system":
                given[0]["content"] = f"{system}\n\n{given[0]['content']}"
            else:
                msgs.append({"role": "system", "content": system})
        if task.instructions and given and given[-1].get("role") == "user":
            given[-1]["content"] = f"{given[-1]['content']}\n\n{task.instructions}"
        if shots:  # after the system turn, before the conversation
            head = 1 if given and given[0].get("role") == "system" else 0
            given = given[:head] + shots + given[head:]
        return msgs + given
