"""Weight space: a local model learns from its own best attempts.

- `rest.RestTrainer`: expert iteration / ReST-EM (sample k → score → elite → fine-tune →
  val; ship the best round, the base model being round 0), or one SFT round on references.
- `rl.RLTrainer`: GRPO / GSPO through TRL's GRPOTrainer with the task scorer as reward
  (`rewards`: beside it, a format and an LLM-judge reward with weights).
- `dpo.DPOTrainer`: DPO on preference pairs (a preference JSONL file) with a LoRA adapter;
  the base model is round 0, the gate on val decides what ships.
- `sft`: TRL SFTTrainer with a peft LoRA / DoRA adapter, full fine-tuning, or `scratch`
  (a small transformer from random init, for game strategies).

Nothing here imports torch until a trainer runs, so `import selftaught` stays light."""

from selftaught.weights.config import (
    BackendConfig,
    ConfigError,
    DPOConfig,
    RestConfig,
    RLConfig,
    SFTTrainConfig,
)
from selftaught.weights.elite import EliteStats, select_elite
from selftaught.weights.sampling import Sample

__all__ = [
    "BackendConfig",
    "ConfigError",
    "DPOConfig",
    "EliteStats",
    "RLConfig",
    "RestConfig",
    "SFTTrainConfig",
    "Sample",
    "select_elite",
]
