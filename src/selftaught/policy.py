"""Prompt assembly: skill (+ memory) + example → chat messages. Always conversational, so
chat models see their chat template (raw prompts make them ramble and zero every reward)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from selftaught.models.base import Message
from selftaught.tasks.base import Example, Task


@dataclass(frozen=True)
class Policy:
    """What acts on an example: the skill document and memory the frozen model reads."""

    skill: str = ""
    memory: str = ""

    def system_prompt(self) -> str:
        parts = []
        if self.skill.strip():
            parts.append(self.skill.strip())
        if self.memory.strip():
            parts.append("## Memory\n" + self.memory.strip())
        return "\n\n".join(parts)

    def skill_hash(self) -> str:
        return hashlib.sha256(self.system_prompt().encode()).hexdigest()[:16]

    def messages(self, task: Task, example: Example) -> list[Message]:
        msgs: list[Message] = []
        system = self.system_prompt()
        if isinstance(example.input, str):
            user = example.input
            if task.instructions:
                user = f"{user}\n\n{task.instructions}"
            if system:
                msgs.append({"role": "system", "content": system})
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
        return msgs + given
