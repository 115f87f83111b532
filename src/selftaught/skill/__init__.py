"""Text-space optimization (SkillOpt): the model stays frozen; the trainable state is a skill
document. rollout → reflect → aggregate → select (edit budget) → apply → gate on val."""

from selftaught.gate import GateConfig, GateResult, gate
from selftaught.skill.budget_schedule import edit_budget
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit, EditReport, Patch, SkillDocument, apply_edits
from selftaught.skill.persist import default_output_dir
from selftaught.skill.select import select_edits
from selftaught.skill.trainer import SkillTrainer

__all__ = [
    "Edit",
    "EditReport",
    "GateConfig",
    "GateResult",
    "Patch",
    "SkillDocument",
    "SkillOptConfig",
    "SkillTrainer",
    "apply_edits",
    "default_output_dir",
    "edit_budget",
    "gate",
    "select_edits",
]
