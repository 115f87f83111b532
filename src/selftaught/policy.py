"""Prompt assembly: skill (+ memory) + example → chat messages. Always conversational, so
chat models see their chat template (raw prompts make them ramble and zero every reward).
A skill's demonstrations (see `selftaught.demos`) become prior user/assistant turns or a
section of the system prompt, as the skill's demos block says."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from selftaught.demos import SkillParts, demo_section, demo_turns, split_skill
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

    def system_prompt(self) -> str:
        parts = []
        rules = self.parts.rules.strip()
        if rules:
            parts.append(rules)
        if self.parts.demos and self.parts.placement == "system":
            parts.append(demo_section(self.parts.demos))
        if self.memory.strip():
            parts.append("## Memory\n" + self.memory.strip())
        return "\n\n".join(parts)

    def skill_hash(self) -> str:
        """Names what the model reads: the system prompt, and demo turns when there are any
        (a skill without demos keeps the hash it had before demos existed)."""
        key = self.system_prompt()
        if self.parts.demos and self.parts.placement == "turns":
            key += "\n" + json.dumps([d.to_dict() for d in self.parts.demos], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def demo_messages(self, instructions: str = "") -> list[Message]:
        """The demos as prior turns ([] unless the skill places them as turns)."""
        if self.parts.placement != "turns":
            return []
        return demo_turns(self.parts.demos, instructions)

    def messages(self, task: Task, example: Example) -> list[Message]:
        msgs: list[Message] = []
        system = self.system_prompt()
        shots = self.demo_messages(task.instructions)
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
