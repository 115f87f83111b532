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
