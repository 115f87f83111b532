"""GRPO / GSPO: the task scorer as reward (free text scored as text, JSON only for games),
per-step metrics in history.jsonl, and loud warnings when a step has no signal or most
completions are truncated."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("trl")

from rich.console import Console  # noqa: E402

from selftaught.runs import RunDir  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402
from selftaught.weights.config import ConfigError, RLConfig  # noqa: E402
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
        assert result.gate.decision != "accept_new_best"
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


def test_trls_vllm_modes_reach_its_config_and_are_checked(tmp_path):
    """`vllm_mode`: colocate hands TRL its GPU share; server needs a URL, colocate none."""
    from selftaught.weights.config import ConfigError
    from selftaught.weights.rl import RLTrainer

    cfg = RLConfig(vllm_mode="colocate", vllm_gpu_memory_utilization=0.45)
    args = RLTrainer(cfg, SumTask(), output_dir=tmp_path / "run").grpo_args(use_cpu=True)
    assert args.use_vllm and args.vllm_mode == "colocate"
    assert args.vllm_gpu_memory_utilization == 0.45 and args.vllm_server_base_url is None
    cfg = RLConfig(vllm_mode="server", vllm_server_url="http://10.0.0.5:8000")
    args = RLTrainer(cfg, SumTask(), output_dir=tmp_path / "other").grpo_args(use_cpu=True)
    assert args.vllm_mode == "server" and args.vllm_server_base_url == "http://10.0.0.5:8000"
    with pytest.raises(ConfigError, match="needs the server's URL: --vllm-server"):
        RLConfig(vllm_mode="server")
    with pytest.raises(ConfigError, match="drop --vllm-server"):
        RLConfig(vllm_mode="colocate", vllm_server_url="http://10.0.0.5:8000")


def test_grpo_on_vllm_without_vllm_installed_is_refused_before_anything_runs(tmp_path):
    from selftaught.errors import MissingDependency
    from selftaught.weights.rl import RLTrainer

    pytest.importorskip("accelerate")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    trainer = RLTrainer(RLConfig(vllm_mode="colocate"), SumTask(), output_dir=tmp_path / "run")
    with pytest.raises(MissingDependency, match="--vllm-mode colocate needs vLLM"):
        trainer.train()
    assert not (tmp_path / "run" / "config.json").exists()


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
    assert control.should_training_stop and str(stop.stopped_by).startswith("budget (8 of 6 calls")


# ---- GRPO's variants: weighted rewards, TRL's loss types -----------------------------------


def test_our_loss_types_and_default_are_trls():
    """The pinned TRL's own list (its GRPOConfig help) and default: a TRL upgrade that adds,
    drops or changes one fails here, and RLConfig / docs/train.md follow."""
    import re
    from dataclasses import fields

    from trl import GRPOConfig

    from selftaught.weights.config import LOSS_TYPES

    [field] = [f for f in fields(GRPOConfig) if f.name == "loss_type"]
    listed = field.metadata["help"].split("Supported values are", 1)[1].split(". ", 1)[0]
    assert tuple(re.findall(r"'(\w+)'", listed)) == LOSS_TYPES
    assert field.default == RLConfig().loss_type == "dapo"


def test_loss_type_and_reward_weights_reach_trls_config(tmp_path):
    from selftaught.weights.rl import RLTrainer

    cfg = RLConfig(loss_type="bnpo", rewards={"correctness": 1.0, "format": 0.25})
    trainer = RLTrainer(cfg, SumTask(), output_dir=tmp_path / "run")
    args = trainer.grpo_args(use_cpu=True)
    assert args.loss_type == "bnpo" and args.reward_weights == [1.0, 0.25]
    rewards = trainer.rewards()
    assert rewards.names == ["correctness", "format"] and rewards.weights == [1.0, 0.25]
    # the first reward charges the sampled completions to the budget, once
    assert rewards.funcs[0].ledger is trainer.ledger and rewards.funcs[1].ledger is None
    plain = RLTrainer(RLConfig(), SumTask(), output_dir=tmp_path / "plain").grpo_args(use_cpu=True)
    assert plain.loss_type == "dapo" and plain.reward_weights == [1.0]


def _turn(text):
    return [{"role": "assistant", "content": text}]


def test_format_reward_scores_ended_replies_that_hold_an_answer():
    from selftaught.weights.rewards import FormatReward

    task = SumTask()
    reward = FormatReward(task, task.examples("train"), max_completion_length=8)
    replies = [_turn("The answer is 41."), _turn("The answer is"), _turn(""), "<answer></answer>"]
    ids = [[1, 2, 3], [1] * 8, [2], [1, 2]]  # the second reached the cap: cut
    # a wrong but complete answer still has the format; a cut or empty one does not
    assert reward([None] * 4, replies, ["train-0"] * 4, ids) == [1.0, 0.0, 0.0, 0.0]
    assert reward.errors == 0 and reward.__name__ == "format"


def test_format_reward_on_a_game_wants_a_strategy_valid_against_its_schema():
    from selftaught.tasks.registry import load_task
    from selftaught.weights.rewards import FormatReward

    task = load_task("game:ctf", seed=0, train_size=2, val_size=1, test_size=1)
    ex = task.examples("train")[0]
    valid = {
        "aggression": 0.2,
        "defense": 0.2,
        "path_bias": "center",
        "retreat_threshold": 0.3,
        "formation": "column",
    }
    invalid = {**valid, "formation": "phalanx"}
    reward = FormatReward(task, task.examples("train"), max_completion_length=256)
    replies = [f"Here: {json.dumps(valid)}", json.dumps(invalid), "attack!"]
    assert reward([None] * 3, replies, [ex.id] * 3, [[1]] * 3) == [1.0, 0.0, 0.0]


def test_a_crashing_format_check_is_an_error_never_a_score(monkeypatch):
    from selftaught.weights import rewards as mod
    from selftaught.weights.rewards import FormatReward, RewardError

    task = SumTask()
    reward = FormatReward(task, task.examples("train"), max_completion_length=8)

    def check(task, reply, truncated):
        if "boom" in reply:
            raise RuntimeError("format check broke")
        return real(task, reply, truncated)

    real = mod.format_score
    monkeypatch.setattr(mod, "format_score", check)
    values = reward([None] * 3, ["1", "boom", ""], ["train-0"] * 3, [[1]] * 3)
    assert values == [1.0, 0.5, 0.0]  # the error gets its group's mean: advantage zero
    assert reward.errors == 1 and "format check broke" in reward.error_messages[0]
    with pytest.raises(RewardError, match="2 of 3 rewards .*format errors.*broke"):
        reward([None] * 3, ["boom", "boom", "1"], ["train-0"] * 3, [[1]] * 3)


def _judge_says(score):
    from tests.scripted import ScriptedModel

    return ScriptedModel(lambda messages: json.dumps({"score": score(messages), "reason": "ok"}))


def test_judge_reward_scores_with_the_judge_model():
    from selftaught.weights.rewards import JudgeReward

    task = SumTask()

    def score(messages):  # the judge reads the reply and the reference
        prompt = messages[0]["content"]
        return 9 if "Reply to grade\n\nthe sum is 1" in prompt and "answer\n\n1" in prompt else 2

    judge = _judge_says(score)
    reward = JudgeReward(task.examples("train"), judge)
    values = reward([None] * 2, [_turn("the sum is 1"), _turn("no idea")], ["train-0"] * 2)
    assert values == [0.9, 0.2] and len(judge.calls) == 2 and reward.__name__ == "judge"
    hard = JudgeReward(task.examples("train"), _judge_says(score), "hard")
    assert hard([None] * 2, ["the sum is 1", "no idea"], ["train-0"] * 2) == [1.0, 0.0]


def test_a_failing_judge_is_an_error_and_a_fatal_one_stops_the_run():
    from selftaught.models.errors import FatalBackendError, TransientBackendError
    from selftaught.weights.rewards import JudgeReward

    task = SumTask()
    judge = _judge_says(lambda messages: 6)
    judge.fail_at[1] = TransientBackendError("judge", "503")
    reward = JudgeReward(task.examples("train"), judge)
    assert reward([None] * 3, ["a", "b", "c"], ["train-0"] * 3) == [0.6, 0.6, 0.6]
    assert reward.errors == 1 and "judge error on train-0" in reward.error_messages[0]
    judge.fail_at[3] = FatalBackendError("judge", "401 unauthorized")
    with pytest.raises(FatalBackendError, match="401"):
        reward([None], ["a"], ["train-0"])


def test_the_judge_reward_needs_a_judge_model_and_charges_its_calls(tmp_path):
    from selftaught.models.usage import UsageLedger
    from selftaught.weights.rl import RLTrainer

    judged = RLConfig(rewards={"correctness": 1.0, "judge": 0.5})
    with pytest.raises(ConfigError, match="the judge reward needs a judge model: --judge-model"):
        RLTrainer(judged, SumTask(), output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="add --reward judge=WEIGHT"):
        RLTrainer(RLConfig(), SumTask(), output_dir=tmp_path / "b", judge_model=_judge_says(len))
    ledger = UsageLedger()
    trainer = RLTrainer(
        judged,
        SumTask(),
        output_dir=tmp_path / "c",
        ledger=ledger,
        judge_model=_judge_says(lambda m: 5),
    )
    assert trainer.run_config()["judge_model"] == "scripted"
    rewards = trainer.rewards()
    for func in rewards.funcs:
        func([None] * 2, ["1", "2"], ["train-0"] * 2, [[1, 2]] * 2)
    assert ledger.to_dict()["judge"]["calls"] == 2 and ledger.to_dict()["target"]["calls"] == 2
    # what TRL trains on: 1 * correctness + 0.5 * judge, per completion
    assert rewards.last_rewards == [1.0 + 0.25, 0.0 + 0.25] and rewards.batches == 1


def test_history_keeps_each_reward_functions_mean(tmp_path):
    from selftaught.weights.rewards import FormatReward, RewardSet

    task = SumTask()
    funcs = [
        TaskReward(task, task.examples("train")),
        FormatReward(task, [], max_completion_length=8),
    ]
    rewards = RewardSet(funcs, [1.0, 0.5])
    run = RunDir(tmp_path / "run")
    console = Console(record=True, width=200)
    cb = _make_callback(run, rewards, RLConfig(), console)
    rewards.last_rewards = [1.5, 0.5]
    logs = {"reward": 1.0, "rewards/correctness/mean": 0.5, "rewards/correctness/std": 0.7}
    _log(cb, 1, {**logs, "rewards/format/mean": 1.0, "rewards/format/std": 0.0})
    [row] = run.history()
    assert row["rewards/correctness"] == 0.5 and row["rewards/format"] == 1.0
    assert not any(k.endswith("/std") for k in row) and not row["all_rewards_equal"]
    assert "reward 1.000 (correctness 0.500 format 1.000)" in console.export_text()


def test_a_tiny_grpo_step_logs_each_reward_and_uses_the_loss_type(tmp_path, monkeypatch):
    """One real TRL step on a random 1-layer model: the loss type and the weights reach TRL,
    and each reward function's mean lands in history.jsonl."""
    from trl import GRPOTrainer

    from selftaught.weights.config import BackendConfig
    from selftaught.weights.rl import RLTrainer
    from tests.tiny_model import save_tiny_model

    seen: dict = {}
    train = GRPOTrainer.train

    def recording(self, *args, **kw):
        seen.update(loss=self.loss_type, names=self.reward_func_names)
        seen["weights"] = self.reward_weights.tolist()
        return train(self, *args, **kw)

    monkeypatch.setattr(GRPOTrainer, "train", recording)
    cfg = RLConfig(
        steps=1,
        num_generations=2,
        prompts_per_step=1,
        max_completion_length=4,
        eval_max_tokens=4,
        loss_type="dr_grpo",
        rewards={"correctness": 1.0, "format": 0.5, "judge": 0.25},
        backend=BackendConfig(lora_r=2, lora_alpha=4),
    )
    judge = _judge_says(lambda messages: 6)
    model = save_tiny_model(tmp_path / "tiny")
    RLTrainer(
        cfg, SumTask(), model, output_dir=tmp_path / "run", progress=False, judge_model=judge
    ).train()
    assert seen == {"loss": "dr_grpo", "names": ["correctness", "format", "judge"],
                    "weights": [1.0, 0.5, 0.25]}  # fmt: skip
    [row] = RunDir(tmp_path / "run").history()
    # a random model never stops: every reply is cut, so no format and no right answer
    assert row["truncated"] == 1.0 and row["rewards/format"] == 0.0
    assert row["rewards/correctness"] == 0.0 and row["rewards/judge"] == pytest.approx(0.6)
    assert row["reward"] == pytest.approx(0.25 * 0.6) and len(judge.calls) == 2
