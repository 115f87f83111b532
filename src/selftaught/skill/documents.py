"""The trained document (the skill, or the memory with the skill held fixed) and its saved
versions in the run directory (`skills/vNNNN[-J].md`, or `memorys/` for a memory)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from selftaught.demos import Demo, SkillParts, join_skill, split_skill
from selftaught.policy import Policy
from selftaught.runs import RunDir, atomic_write_text
from selftaught.skill.reflect import DocumentKind
from selftaught.skill.state import SkillVersion


@dataclass(frozen=True)
class TrainedDocument:
    """What is trained (`kind`) and the other document, held fixed (`other`): the policy a
    text makes, its hash, and its rules and demos (a memory has no demos)."""

    kind: DocumentKind
    other: str
    demo_placement: str

    def policy(self, text: str) -> Policy:
        """The policy reading `text` as the trained document, the other one fixed."""
        if self.kind == "memory":
            return Policy(skill=self.other, memory=text)
        return Policy(skill=text, memory=self.other)

    def hash(self, text: str) -> str:
        return self.policy(text).skill_hash()

    def parts(self, text: str) -> SkillParts:
        """Rules and demos of a trained document (a memory has no demos)."""
        return SkillParts(text) if self.kind == "memory" else split_skill(text)

    def join(self, rules: str, demos: Sequence[Demo]) -> str:
        if self.kind == "memory":
            return rules
        return join_skill(rules, demos, self.demo_placement)


class VersionStore:
    """Every version of the trained document, one Markdown file each, in the run directory."""

    def __init__(self, run: RunDir, document: TrainedDocument):
        self.run = run
        self.document = document

    def save_step(self, step: int, text: str) -> SkillVersion:
        return self.save(f"v{step:04d}", text)

    def save(self, version: str, text: str) -> SkillVersion:
        atomic_write_text(self.run.path(f"{self.document.kind}s", f"{version}.md"), text)
        return SkillVersion(version, text, self.document.hash(text))

    def load(self, step_or_version: int | str) -> SkillVersion:
        version = step_or_version if isinstance(step_or_version, str) else f"v{step_or_version:04d}"
        path = self.run.path(f"{self.document.kind}s", f"{version}.md")
        text = path.read_text(encoding="utf-8")
        return SkillVersion(version, text, self.document.hash(text))
