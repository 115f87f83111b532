"""The CLI takes its defaults and help from the config dataclasses (one source): no default in
`cli/` repeats a config's, generated options carry the field's default and docstring, and the
method checks of `train` name options that exist."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import click
import pytest
import typer

from selftaught.cli import app
from selftaught.cli.common import BUDGET_FLAGS, GATE_FLAGS, SIZED_TASK_FLAGS, TASK_FLAGS
from selftaught.cli.optimize import SKILL_FLAGS, SKILL_GATE
from selftaught.cli.options import config_flags, field_default, field_docs, flag_default
from selftaught.cli.sleep import NIGHT_FLAGS, NIGHT_SKILL_FLAGS, NIGHT_TRAINING, WEIGHT_FLAGS
from selftaught.cli.train import (
    BACKEND_FLAGS,
    REST_FLAGS,
    RL_FLAGS,
    RL_ONLY_OPTIONS,
    SAMPLING_OPTIONS,
    SFT_ONLY_OPTIONS,
    TASK_GATE,
    TRAIN_BUDGET_FLAGS,
)
from selftaught.gate import GateConfig
from selftaught.models.base import GenerationParams
from selftaught.models.usage import Budget
from selftaught.rollout import RolloutConfig
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.intake.harvest import HarvestConfig
from selftaught.sleep.intake.proxy import ProxyConfig
from selftaught.sleep.night.cycle import NightConfig
from selftaught.sleep.night.demo_modes import DemoModeConfig
from selftaught.sleep.night.split import SplitConfig
from selftaught.sleep.night.weight_night import WeightNightConfig
from selftaught.tasks.options import TaskOptions
from selftaught.weights.config import BackendConfig, RestConfig, RLConfig, SFTTrainConfig

CLI = Path(__file__).resolve().parents[1] / "src" / "selftaught" / "cli"
CONFIGS = (
    SkillOptConfig,
    RestConfig,
    RLConfig,
    SFTTrainConfig,
    BackendConfig,
    GateConfig,
    RolloutConfig,
    NightConfig,
    SplitConfig,
    DemoModeConfig,
    WeightNightConfig,
    ProxyConfig,
    HarvestConfig,
    TaskOptions,
    Budget,
    GenerationParams,
)


def literal_defaults(source: str) -> list[tuple[str, str, object]]:
    """(function, parameter, value) for every literal default of a function parameter, but
    None and False."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults))
            defaults += node.args.defaults + node.args.kw_defaults
            for arg, default in zip(args, defaults, strict=True):
                # None and False: "unset" and "off", what a flag is unless given
                if isinstance(default, ast.Constant) and default.value not in (None, False):
                    found.append((node.name, arg.arg, default.value))
    return found


def repeated_config_defaults(source: str) -> list[str]:
    """Literal defaults that equal the default of a config field of the same name (`timeout`
    matches `timeout_s`): such a default must be read from the config instead."""
    clashes = []
    for fn, param, value in literal_defaults(source):
        for cls in CONFIGS:
            for f in dataclasses.fields(cls):
                if f.name not in (param, f"{param}_s"):
                    continue
                try:
                    default = field_default(cls, f.name)
                except TypeError:  # a required field
                    continue
                if type(default) is type(value) and default == value:
                    clashes.append(f"{fn}({param}={value!r}) repeats {cls.__name__}.{f.name}")
    return clashes


def test_the_scan_finds_a_repeated_default():
    source = "def optimize_cmd(epochs: int = 4, timeout: float = 600.0, model: str = 'local'): ..."
    assert repeated_config_defaults(source) == [
        "optimize_cmd(epochs=4) repeats SkillOptConfig.epochs",
        "optimize_cmd(timeout=600.0) repeats ProxyConfig.timeout_s",
    ]


def test_cli_holds_no_default_a_config_holds():
    clashes = [
        f"{path.name}: {clash}"
        for path in sorted(CLI.glob("*.py"))
        for clash in repeated_config_defaults(path.read_text())
    ]
    assert not clashes


def _command(path: str) -> click.Command:
    group = typer.main.get_command(app)
    for name in path.split():
        group = group.commands[name]  # type: ignore[attr-defined]
    return group


def _param(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if p.name == name)


@pytest.mark.parametrize(
    ("command", "cls", "flags", "defaults"),
    [
        ("optimize", SkillOptConfig, SKILL_FLAGS, None),
        ("train", BackendConfig, BACKEND_FLAGS, None),
        ("train", RLConfig, RL_FLAGS, None),
        ("sleep run", NightConfig, NIGHT_FLAGS, None),
        ("sleep run", SkillOptConfig, NIGHT_SKILL_FLAGS, NIGHT_TRAINING),
        ("sleep run", WeightNightConfig, WEIGHT_FLAGS, None),
        ("train", RestConfig, REST_FLAGS, None),
        ("optimize", GateConfig, GATE_FLAGS, SKILL_GATE),
        ("train", GateConfig, GATE_FLAGS, TASK_GATE),
        ("optimize", Budget, BUDGET_FLAGS, None),
        ("train", Budget, TRAIN_BUDGET_FLAGS, None),
        ("eval", TaskOptions, TASK_FLAGS, None),
        ("optimize", TaskOptions, SIZED_TASK_FLAGS, None),
        ("train", TaskOptions, SIZED_TASK_FLAGS, None),
        ("eval", RolloutConfig, ["concurrency"], None),
        ("eval", GenerationParams, ["max_tokens", "temperature"], None),
    ],
)
def test_generated_options_carry_the_fields_default_and_docstring(command, cls, flags, defaults):
    cmd = _command(command)
    names = flags if isinstance(flags, dict) else {f: f for f in flags}
    for field, param in names.items():
        option = _param(cmd, param if isinstance(param, str) else param[0])
        want = flag_default(cls, field, defaults)
        assert option.default == want, (command, param)
        assert option.help == field_docs(cls)[field], (command, param)


def test_the_task_gate_and_budget_flags_are_generated_where_a_task_is_loaded():
    for command in ("eval", "optimize", "train"):
        opts = {o for p in _command(command).params for o in getattr(p, "opts", [])}
        assert {"--seed", "--train-size", "--scorer", "--judge-model", "--unsafe-exec"} <= opts
        val_size = next(p for p in _command(command).params if "--val-size" in p.opts)
        assert val_size.help.startswith(field_docs(TaskOptions)["val_size"])  # or auto
    for command in ("optimize", "train"):
        opts = {o for p in _command(command).params for o in getattr(p, "opts", [])}
        assert {"--gate-metric", "--gate-margin", "--budget-calls", "--budget-tokens"} <= opts


def test_field_docs_read_attribute_docstrings_and_args_sections():
    assert field_docs(SkillOptConfig)["epochs"].startswith("Passes over the train split")
    assert field_docs(BackendConfig)["lora_alpha"] == "LoRA rank, scaling and dropout."
    assert "use_dora" in field_docs(BackendConfig)


def test_a_field_without_a_docstring_cannot_become_an_option():
    @dataclasses.dataclass
    class Bare:
        size: int = 3

    with pytest.raises(TypeError, match="Bare.size has no docstring"):
        config_flags(Bare, ["size"], into="fields")(lambda fields: None)


def test_the_method_checks_name_options_train_has():
    flags = {opt for p in _command("train").params for opt in getattr(p, "opts", [])}
    for table in (SFT_ONLY_OPTIONS, RL_ONLY_OPTIONS, SAMPLING_OPTIONS):
        assert set(table) <= flags, set(table) - flags
