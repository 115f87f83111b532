"""Run directories for the report tests, produced by the real trainers' code paths:

- `optimize_run`: SkillTrainer with the scripted rule target and canned analyst (known gate
  decisions: accept, new best, reject, new best);
- `rest_run`: RestTrainer on a tiny random model (real sampling, elite and LoRA fine-tuning;
  only the val / test evaluation is scripted, as in test_weights_rest.py);
- `rl_run`: GRPO's history written by the real metrics callback from TRL-style logs, and
  state.json / result.json from the real EvalResult and RLResult (a real GRPO run takes
  minutes; test_weights_rl.py covers it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from tests.scripted import POISON, ToyTask, canned_analyst, rule_target, schedule_of_rules

RULES = ("rule delta", "rule alpha", POISON, "rule gamma")
DECISIONS = ["accept", "accept_new_best", "reject", "accept_new_best"]


def optimize_trainer(root: Path, initial_skill: str = "# Skill\n", **cfg: Any) -> SkillTrainer:
    # rules only: these scripts test the reflection loop (demos have their own tests)
    defaults = {
        "epochs": 2,
        "batch_size": 4,
        "concurrency": 4,
        "gate": GateConfig(),
        "demos_max": 0,
        "pool": False,
    }
    config = SkillOptConfig(**{**defaults, **cfg})
    return SkillTrainer(
        config,
        ToyTask(),
        rule_target(),
        canned_analyst(failure=schedule_of_rules(*RULES)),
        initial_skill,
        output_dir=root,
        progress=False,
    )


def optimize_run(root: Path, initial_skill: str = "# Skill\n", **cfg: Any) -> dict[str, Any]:
    return optimize_trainer(root, initial_skill, **cfg).train()


def rest_run(root: Path, model_dir: Path, monkeypatch: Any, val_by_round: list[float]) -> Any:
    """A finished 2-round ReST-EM run; val accuracies per round are scripted per example
    (test follows val), everything else runs for real."""
    from selftaught.weights.rest import RestTrainer
    from tests.test_weights_rest import EchoTask, config, scripted_eval

    scripted_eval(monkeypatch, val_by_round)
    cfg = config(len(val_by_round) - 1)
    cfg.eval_test_each_round = True
    return RestTrainer(cfg, EchoTask(), model_dir, output_dir=root, progress=False).train()


_SHARED: dict[str, Path] = {}


def shared_rest_run(tmp_path_factory: Any) -> Path:
    """One finished ReST run per test session (rounds val 0.25, 0.75, 0.5): several tests
    read it, none may change it (copy it first)."""
    import pytest

    if "rest" not in _SHARED:
        base = tmp_path_factory.mktemp("rest-run")
        with pytest.MonkeyPatch.context() as mp:
            rest_run(base / "run", tiny_model(base / "tiny"), mp, [0.25, 0.75, 0.5])
        _SHARED["rest"] = base / "run"
    return _SHARED["rest"]


def tiny_model(root: Path) -> Path:
    from selftaught.weights.config import BackendConfig
    from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer

    tok = scratch_tokenizer()
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=1, scratch_width=32, scratch_heads=2), seed=0
    )
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


RL_LOGS = [  # what TRL's GRPOTrainer logs per step (keys as TRL names them)
    {
        "reward": 0.0,
        "rewards/correctness/mean": 0.0,
        "rewards/correctness/std": 0.1,
        "rewards/format/mean": 0.0,
        "reward_std": 0.0,
        "kl": 0.0,
        "completions/mean_length": 64.0,
        "completions/clipped_ratio": 0.9,
        "frac_reward_zero_std": 1.0,
        "loss": 0.0,
    },
    {
        "reward": 0.25,
        "rewards/correctness/mean": 0.0,
        "rewards/correctness/std": 0.1,
        "rewards/format/mean": 0.5,
        "reward_std": 0.2,
        "kl": 0.004,
        "completions/mean_length": 40.0,
        "completions/clipped_ratio": 0.3,
        "frac_reward_zero_std": 0.5,
        "loss": 0.01,
    },
    {
        "reward": 0.5,
        "rewards/correctness/mean": 0.25,
        "rewards/correctness/std": 0.1,
        "rewards/format/mean": 0.5,
        "reward_std": 0.3,
        "kl": 0.011,
        "completions/mean_length": 31.5,
        "completions/clipped_ratio": 0.1,
        "frac_reward_zero_std": 0.0,
        "loss": 0.02,
    },
]
RL_WEIGHTS = {"correctness": 1.0, "format": 0.5}  # reward = correctness + 0.5 * format
RL_REWARDS = [[0.0] * 4, [0.0, 0.5, 0.0, 0.5], [1.0, 0.0, 0.5, 0.5]]


def scored(split: str, n: int, solved: int) -> Any:
    """An evaluation of n examples of which the first `solved` were solved."""
    from selftaught.evaluation import summarize
    from selftaught.rollout import Rollout
    from selftaught.tasks.base import Score

    rollouts = [
        Rollout(f"{split}-{i}", [], "x", score=Score(float(i < solved), float(i < solved)))
        for i in range(n)
    ]
    return summarize(rollouts, task="toy", model="tiny", split=split, wall_s=0.0, skill_hash="")


def rl_run(root: Path, *, finished: bool = True) -> None:
    """A GRPO run directory in the exact format rl.py writes (history by its callback)."""
    from rich.console import Console

    from selftaught.runs import RunDir, atomic_write_json
    from selftaught.weights.config import RLConfig
    from selftaught.weights.rl import RLResult, TaskReward, _make_callback
    from selftaught.weights.rows import RLStepRow

    task = ToyTask()
    cfg = RLConfig(steps=len(RL_LOGS), rewards=RL_WEIGHTS)
    run = RunDir(root)
    run.check_or_write_config(
        {
            "method": "grpo",
            "task": task.name,
            "model": "tiny",
            "sizes": [8, 11, 10],
            "rl": cfg.to_dict(),
        }
    )
    base_val = scored("val", 11, 2)
    base_test = scored("test", 10, 2)
    state: dict[str, Any] = {"base_val": base_val.summary(), "base_test": base_test.summary()}
    run.save_state(state)
    reward = TaskReward(task, task.examples("train"))
    callback = _make_callback(run, reward, cfg, Console(quiet=True))
    for step, (logs, rewards) in enumerate(zip(RL_LOGS, RL_REWARDS, strict=True), 1):
        reward.last_rewards = rewards
        callback.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)
    if not finished:
        return
    trained_val = scored("val", 11, 5)
    trained_test = scored("test", 10, 4)
    state.update(
        trained=True,
        trained_val=trained_val.summary(),
        trained_test=trained_test.summary(),
        step_seconds=1.5,
    )
    run.save_state(state)
    result = RLResult(
        shipped="trained",
        base_val=base_val,
        trained_val=trained_val,
        base_test=base_test,
        shipped_test=trained_test,
        steps=[RLStepRow.from_dict(row) for row in run.history()],
        step_seconds=1.5,
    )
    atomic_write_json(run.path("result.json"), result.to_dict())


def demo_optimize_run(root: Path, target: Any = None) -> dict[str, Any]:
    """An optimize run that finds a demo set (the scripted `format_learner` solves beta items
    only once a demo shows the format), with a pool, screening, a rules candidate the
    screening drops, and one train item copied from val that the leak check refuses."""
    from selftaught.tasks.base import Example
    from tests.scripted import ScriptedModel, edits_json
    from tests.test_skill_demos import format_learner

    class LeakyToy(ToyTask):
        def __init__(self) -> None:
            super().__init__()
            val0 = self.splits["val"][0]
            copy = val0.input.lower().replace(" + ", "+")
            self.splits["train"][0] = Example("train-copy", copy, val0.reference, val0.state)

    edit = edits_json(
        {"op": "add", "target": "", "content": "- Reply as Answer: N.", "rationale": "format"}
    )
    config = SkillOptConfig(
        epochs=2, batch_size=8, demos_max=2, screen_size=4, gate=GateConfig(), pool=True
    )
    return SkillTrainer(
        config,
        LeakyToy(),
        target or ScriptedModel(format_learner, "format-learner"),
        canned_analyst(failure=edit),
        "# Skill\n",
        output_dir=root,
        progress=False,
    ).train()
