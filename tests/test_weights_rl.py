"""GRPO / GSPO: the task scorer as reward (free text scored as text, JSON only for games),
per-step metrics in history.jsonl, and loud warnings when a step has no signal or most
completions are truncated."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("trl")

from rich.console import Console  # noqa: E402

from selftaught.runs import RunDir  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402
from selftaught.weights.config import RLConfig  # noqa: E402
from selftaught.weights.rl import TaskReward, _make_callback, completion_text  # noqa: E402


class SumTask:
    name = "test:sum"
    kind = "agent"
    instructions = "Give the final answer only."

    def examples(self, split):
        return [
            Example(f"{split}-{i}", f"{split}: {i} + 1?", reference=str(i + 1)) for i in range(3)
        ]

    def score(self, output, example):
        ok = output.strip().rstrip(".").split()[-1:] == [example.reference] if output else False
        return Score(float(ok), float(ok), "")


def test_reward_scores_free_text_as_text():
    task = SumTask()
    reward = TaskReward(task, task.examples("train"))
    conv = [
        [{"role": "assistant", "content": "The answer is 1."}],
        [{"role": "assistant", "content": "7"}],
    ]
    assert reward([None, None], conv, ["train-0", "train-0"]) == [1.0, 0.0]
    assert reward.flat_batches == 0
    assert reward([None], ["no idea"], ["train-1"]) == [0.0]
    assert reward.flat_batches == 1 and reward.batches == 2
    assert completion_text([{"role": "assistant", "content": "a"}, {"content": "b"}]) == "ab"


def test_reward_plays_game_json_strategies():
    from selftaught.tasks.registry import load_task

    task = load_task("game:ctf", seed=0, train_size=2, val_size=1, test_size=1)
    reward = TaskReward(task, task.examples("train"))
    ex = task.examples("train")[0]
    good = json.dumps(
        {
            "aggression": 0.2,
            "defense": 0.2,
            "path_bias": "center",
            "retreat_threshold": 0.3,
            "formation": "column",
        }
    )
    values = reward([None, None], [f"Here: {good}", "attack!"], [ex.id, ex.id])
    assert values[1] == 0.0  # not JSON: no score
    assert values[0] == task.score(good, ex).soft


def _log(callback, step, logs):
    callback.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)


def test_callback_logs_metrics_and_warns_loudly(tmp_path):
    task = SumTask()
    reward = TaskReward(task, task.examples("train"))
    run = RunDir(tmp_path / "run")
    console = Console(record=True, width=200)
    cb = _make_callback(run, reward, RLConfig(max_completion_length=8), console)
    reward.last_rewards = [0.0, 0.0, 0.0, 0.0]
    _log(
        cb,
        1,
        {
            "reward": 0.0,
            "reward_std": 0.0,
            "kl": 0.0,
            "completions/mean_length": 8.0,
            "completions/clipped_ratio": 0.9,
            "frac_reward_zero_std": 1.0,
        },
    )
    reward.last_rewards = [1.0, 0.0, 0.0, 1.0]
    _log(
        cb,
        2,
        {
            "reward": 0.5,
            "reward_std": 0.5,
            "kl": 0.01,
            "completions/mean_length": 3.0,
            "completions/clipped_ratio": 0.0,
            "frac_reward_zero_std": 0.0,
        },
    )
    _log(cb, 2, {"reward": 0.5})  # the same step twice is not duplicated
    _log(cb, 3, {"loss": 0.1})  # rows without reward (e.g. the final summary) are skipped
    rows = run.history()
    assert [r["step"] for r in rows] == [1, 2]
    first, second = rows
    assert first["all_rewards_equal"] and len(first["warnings"]) == 2
    assert first["truncated"] == 0.9 and first["frac_groups_no_signal"] == 1.0
    assert not second["all_rewards_equal"] and second["warnings"] == []
    assert {"reward", "reward_std", "kl", "completion_length", "truncated"} <= set(second)
    text = console.export_text()
    assert "WARNING step 1" in text and "no learning signal" in text and "90%" in text
    assert "WARNING step 2" not in text


@pytest.mark.slow
def test_grpo_and_gspo_run_a_step_on_a_tiny_model(tmp_path):
    from selftaught.weights.config import BackendConfig
    from selftaught.weights.rl import RLTrainer
    from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer

    tok = scratch_tokenizer()
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=1, scratch_width=32, scratch_heads=2)
    )
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    for method in ("grpo", "gspo"):
        cfg = RLConfig(
            method=method,
            steps=1,
            num_generations=2,
            prompts_per_step=1,
            max_completion_length=4,
            eval_max_tokens=4,
            backend=BackendConfig(lora_r=2, lora_alpha=4),
        )
        result = RLTrainer(
            cfg, SumTask(), tmp_path / "tiny", output_dir=tmp_path / method, progress=False
        ).train()
        rows = RunDir(tmp_path / method).history()
        assert len(rows) == 1 and rows[0]["step"] == 1
        assert rows[0]["truncated"] == 1.0 and rows[0]["warnings"]  # a random model never stops
        assert result.shipped == "base"  # nothing learned: the start model is shipped
        assert result.gate["decision"] != "accept_new_best"
        assert (tmp_path / method / "best" / "config.json").exists()


class CrashyTask(SumTask):
    """The scorer raises on replies that contain 'boom'."""

    def score(self, output, example):
        if "boom" in output:
            raise RuntimeError("scorer broke")
        return super().score(output, example)


def test_a_crashing_scorer_is_never_a_zero_reward():
    task = CrashyTask()
    reward = TaskReward(task, task.examples("train"))
    # train-0's group: one right (1), one wrong (0), one error -> the group's mean (0.5)
    values = reward(
        [None] * 4, ["1", "7", "boom", "2"], ["train-0", "train-0", "train-0", "train-1"]
    )
    assert values == [1.0, 0.0, 0.5, 1.0]
    assert reward.errors == 1 and "scorer broke" in reward.error_messages[0]


def test_a_step_of_mostly_scorer_errors_stops_the_run_with_the_cause():
    from selftaught.weights.rl import RewardError

    task = CrashyTask()
    reward = TaskReward(task, task.examples("train"))
    with pytest.raises(RewardError, match="3 of 4 rewards.*scorer broke"):
        reward([None] * 4, ["boom", "boom", "boom", "1"], ["train-0"] * 4)


def test_vllm_server_and_options_reach_trls_config(tmp_path):
    from selftaught.weights.rl import RLTrainer

    cfg = RLConfig(method="gspo", steps=3, beta=0.02, vllm_server_url="http://10.0.0.5:8000")
    args = RLTrainer(cfg, SumTask(), output_dir=tmp_path / "run").grpo_args(use_cpu=True)
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.vllm_server_base_url == "http://10.0.0.5:8000"
    assert (args.max_steps, args.beta, args.importance_sampling_level) == (3, 0.02, "sequence")
    plain = RLTrainer(RLConfig(), SumTask(), output_dir=tmp_path / "other").grpo_args(use_cpu=True)
    assert not plain.use_vllm and plain.importance_sampling_level == "token"


def test_a_budget_charges_every_scored_completion_and_stops_training(tmp_path):
    from types import SimpleNamespace as NS

    from rich.console import Console

    from selftaught.models.usage import Budget, UsageLedger
    from selftaught.weights.rl import _budget_stop

    task = SumTask()
    ledger = UsageLedger(budget=Budget(calls=6))
    reward = TaskReward(task, task.examples("train"), ledger=ledger)
    saved: list[dict] = []
    stop = _budget_stop(ledger, Console(quiet=True), saved.append)
    reward([None] * 4, ["1", "2", "3", "4"], ["train-0"] * 4, completion_ids=[[1, 2]] * 4)
    control = NS(should_training_stop=False)
    stop.on_step_end(None, NS(global_step=1), control)
    assert not control.should_training_stop and saved[-1]["target"]["calls"] == 4
    assert saved[-1]["target"]["completion_tokens"] == 8
    reward([None] * 4, ["1", "2", "3", "4"], ["train-0"] * 4, completion_ids=[[1]] * 4)
    stop.on_step_end(None, NS(global_step=2), control)
    assert control.should_training_stop and stop.stopped_by.startswith("budget (8 of 6 calls")
