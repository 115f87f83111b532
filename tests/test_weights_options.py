"""Option checks: configs refuse bad values with clear messages, methods refuse options they
would silently ignore, and the CLI turns both into one line and exit code 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.cli.train import check_method_options
from selftaught.weights.config import (
    BackendConfig,
    ConfigError,
    RestConfig,
    RLConfig,
    SFTTrainConfig,
    parse_rewards,
)
from selftaught.weights.sft import check_batch

TASK = "gym:basic_arithmetic?max_terms=2&max_digits=1"


def test_rl_rejects_sft_only_options():
    with pytest.raises(ConfigError, match=r"--elite-fraction.*rest, sft"):
        check_method_options("grpo", {"--elite-fraction", "--task"})
    check_method_options("gspo", {"--beta", "--steps", "--temperature"})


def test_rest_rejects_rl_only_options_and_sft_rejects_sampling():
    with pytest.raises(ConfigError, match=r"--beta, --num-generations.*grpo, gspo"):
        check_method_options("rest", {"--beta", "--num-generations"})
    with pytest.raises(ConfigError, match=r"--samples-per-prompt.*reference answers"):
        check_method_options("sft", {"--samples-per-prompt"})
    with pytest.raises(ConfigError, match="method must be one of"):
        check_method_options("ppo", set())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RestConfig(temperature=0.0), "temperature must be > 0"),
        (lambda: RestConfig(elite_fraction=1.5), "elite_fraction"),
        (lambda: RestConfig(min_score=2), "min_score"),
        (lambda: SFTTrainConfig(batch_size=0), "batch_size"),
        (lambda: BackendConfig(backend="qlora"), "backend must be one of lora, full, scratch"),
        (lambda: BackendConfig(backend="full", use_dora=True), "use_dora"),
        (lambda: BackendConfig(scratch_width=130, scratch_heads=4), "divisible"),
        (lambda: RLConfig(num_generations=1), "num_generations must be >= 2"),
        (lambda: RLConfig(backend=BackendConfig(backend="scratch")), "scratch"),
    ],
)
def test_configs_validate_on_construction(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_defaults_are_the_documented_ones():
    rl = RLConfig(method="gspo")
    assert rl.beta == 0.04 and rl.importance_sampling_level == "sequence"
    assert RLConfig().importance_sampling_level == "token"
    rest = RestConfig()
    assert rest.resolved_filter("agent") == (1.0, 1.0)
    assert rest.resolved_filter("game") == (0.01, 0.25)
    assert BackendConfig(target_modules="q_proj, v_proj").target_modules == ["q_proj", "v_proj"]


def test_batch_size_checked_against_data():
    check_batch(8, 8)
    with pytest.raises(ConfigError, match="--batch-size 16 is larger than the 5 val examples"):
        check_batch(5, 16, "val examples")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "grpo", "--elite-fraction", "0.5"], "--elite-fraction"),
        (["--method", "rest", "--beta", "0.1"], "--beta"),
        (["--method", "sft", "--temperature", "0.7"], "--temperature"),
        (["--model", "openai:gpt-4o-mini"], "must be local"),
        (["--backend", "scratch"], "not a game"),
        (
            ["--batch-size", "16", "--train-size", "4", "--max-per-prompt", "2"],
            "--batch-size 16 can never be filled: 4 train prompts give at most 8",
        ),
    ],
)
def test_cli_rejects_bad_combinations_before_any_training(args, message, tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        app, ["train", "--task", TASK, "--output", str(tmp_path / "run"), "--quiet", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


# ---- GRPO's variants: TRL's loss types, weighted rewards ------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss_type": "ppo"}, "loss_type must be one of grpo, dr_grpo, dapo, bnpo, cispo"),
        ({"loss_type": "luspo"}, "luspo is a sequence-level loss: it needs --method gspo"),
        ({"method": "gspo", "loss_type": "vespo"}, "vespo .* needs --method grpo"),
        ({"rewards": {"bleu": 1.0}}, "unknown reward 'bleu'; valid rewards: correctness, format"),
        ({"rewards": {"correctness": -1.0}}, "'correctness': the weight must be a finite number"),
        ({"rewards": {"format": float("inf")}}, "'format': the weight must be a finite number"),
        ({"rewards": {"format": float("nan")}}, "'format': the weight must be a finite number"),
        ({"rewards": {"format": True}}, "'format': the weight must be a finite number"),
        ({"rewards": {"correctness": 0, "format": 0.0}}, "at least one reward needs a weight > 0"),
        ({"rewards": {}}, "rewards must name at least one of correctness, format, judge"),
    ],
)
def test_rl_config_refuses_bad_losses_and_rewards(fields, message):
    with pytest.raises(ConfigError, match=message):
        RLConfig(**fields)


def test_rl_defaults_leave_grpo_as_it_was():
    rl = RLConfig()
    assert rl.loss_type == "dapo" and rl.rewards == {"correctness": 1.0}
    weighted = RLConfig(method="gspo", loss_type="luspo", rewards={"correctness": 1, "format": 0})
    assert weighted.rewards == {"correctness": 1.0, "format": 0.0}  # a weight 0 is only logged
    assert isinstance(weighted.rewards["correctness"], float)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["format"], "--reward takes NAME=WEIGHT"),
        (["=1"], "--reward takes NAME=WEIGHT"),
        (["format=lots"], "the weight 'lots' is not a number"),
        (["format=1", "format=2"], "--reward format is given twice"),
        (["style=1"], "unknown reward 'style'; valid rewards: correctness, format, judge"),
    ],
)
def test_reward_flags_are_parsed_with_clear_errors(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_rewards(items)
    assert parse_rewards(["judge=0.5", "correctness=1"]) == {"judge": 0.5, "correctness": 1.0}


@pytest.fixture
def captured_train(monkeypatch):
    """`selftaught.api.train` replaced by a stub that records what the CLI handed it."""
    seen: dict = {}

    def stub(task, model, **kw):
        seen.update(kw, task=task)
        raise SystemExit(0)

    monkeypatch.setattr("selftaught.api.train", stub)
    return seen


def test_loss_type_and_rewards_flags_reach_the_config(captured_train, tmp_path):
    args = ["train", "--task", TASK, "--method", "grpo", "--output", str(tmp_path / "run")]
    result = CliRunner().invoke(
        app,
        [*args, "--loss-type", "dr_grpo", "--reward", "correctness=1", "--reward", "format=0.2"],
    )
    assert result.exit_code == 0, result.output
    config = captured_train["config"]
    assert isinstance(config, RLConfig) and config.loss_type == "dr_grpo"
    assert list(config.rewards.items()) == [("correctness", 1.0), ("format", 0.2)]
    assert captured_train["judge_model"] is None
    captured_train.clear()
    assert CliRunner().invoke(app, args).exit_code == 0  # no flags: the defaults
    assert captured_train["config"].rewards == {"correctness": 1.0}
    assert captured_train["config"].loss_type == "dapo"


def test_judge_model_scores_the_judge_reward(captured_train, tmp_path):
    args = ["train", "--method", "gspo", "--output", str(tmp_path / "run")]
    judge = ["--reward", "correctness=1", "--reward", "judge=0.5", "--judge-model", "openai:j"]
    assert CliRunner().invoke(app, [*args, "--task", TASK, *judge]).exit_code == 0
    # a built-in task scores by rule: the judge model is the reward's alone
    assert captured_train["judge_model"] == "openai:j"
    assert captured_train["task_options"].judge_model is None
    captured_train.clear()
    rows = tmp_path / "mine.jsonl"
    rows.write_text('{"input": "2+2?", "reference": "4"}\n')
    assert CliRunner().invoke(app, [*args, "--task", str(rows), *judge]).exit_code == 0
    # a JSONL task's llm_judge lines use it too, as without the judge reward
    assert captured_train["judge_model"] == "openai:j"
    assert captured_train["task_options"].judge_model == "openai:j"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "rest", "--reward", "format=1"], "--reward is for online RL"),
        (["--method", "sft", "--loss-type", "bnpo"], "--loss-type is for online RL"),
        (["--method", "grpo", "--reward", "bleu=1"], "valid rewards: correctness, format, judge"),
        (["--method", "grpo", "--loss-type", "ppo"], "loss_type must be one of grpo, dr_grpo"),
        (["--method", "grpo", "--reward", "judge=1"], "the judge reward needs a judge model"),
    ],
)
def test_cli_refuses_bad_rewards_and_losses_before_any_training(args, message, tmp_path):
    result = CliRunner().invoke(
        app, ["train", "--task", TASK, "--output", str(tmp_path / "run"), "--quiet", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
