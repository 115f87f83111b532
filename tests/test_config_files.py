"""`--config FILE` and `--print-config` (issue 64, item 5): a TOML or YAML file's keys are the
configs' fields, nested as the configs nest; a flag on the command line overrides the file;
an unknown key is refused naming the file, the key and the valid keys (exit 2); the printed
config reproduces the run (read back, it prints the same) and a run folder keeps it; --help
is grouped into panels (by method for `train`, by phase for `sleep run`). Scripted models and
captured library calls only: no model is loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

import selftaught.models
from selftaught.cli import app
from tests.scripted import ScriptedModel

if sys.version_info >= (3, 11):
    import tomllib
else:  # the `tomli` dependency on Python 3.10
    import tomli as tomllib

# every command that takes a config, with a few settings given as flags
COMMANDS = {
    "eval": "eval --task arith --limit 3 --concurrency 2 --seed 5",
    "optimize": "optimize -t arith --epochs 2 --gate-margin 0.5",
    "train rest": "train -t arith --rounds 2 --epochs 1 --lora-r 4",
    "train grpo": "train -t arith --method grpo --steps 3 --reward correctness=1 "
    "--reward format=0.5",
    "train dpo": "train -t arith --method dpo --dpo-beta 0.2",
    "sleep run": "sleep run --epochs 2 --gate-margin 0 --budget-calls 40 "
    "--target-skill-path AGENTS.md --documents skill",
    "sleep dry-run": "sleep dry-run --max-tasks 9 --weights lora",
    "sleep plan": "sleep plan --pseudo-k 3",
    "proxy": "proxy --upstream openai:gpt-x --port 8123 --min-outcomes 7",
    "serve": "serve --port 9001 --max-batch-size 4",
}


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    monkeypatch.chdir(tmp_path)


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def printed(*args: str) -> str:
    done = run(*args, "--print-config")
    assert done.exit_code == 0, done.output
    return str(done.stdout)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_printed_config_reads_back_to_the_same_config(command, tmp_path):
    text = printed(*COMMANDS[command].split())
    saved = tmp_path / "run.toml"
    saved.write_text(text)
    name = [w for w in COMMANDS[command].split() if not w.startswith("-")][:2]
    words = name if name[0] == "sleep" else name[:1]
    assert printed(*words, "--config", str(saved)) == text
    assert tomllib.loads(text)  # valid TOML


def test_the_printed_config_holds_the_flags_nested_as_the_configs_nest():
    train = tomllib.loads(printed(*COMMANDS["train grpo"].split()))
    assert train["method"] == "grpo" and train["rl"]["steps"] == 3
    assert train["reward"] == ["correctness=1", "format=0.5"]
    assert train["backend"]["lora_r"] == 16 and train["sft"]["epochs"] == 2.0  # the defaults
    night = tomllib.loads(printed(*COMMANDS["sleep run"].split()))
    assert night["training"]["epochs"] == 2 and night["documents"] == "skill"
    assert night["training"]["gate"] == {"margin": 0.0, "tag_alpha": 0.1}
    assert night["training"]["budget"] == {"calls": 40}
    assert night["target_skill_paths"] == [str(Path("AGENTS.md").absolute())]
    proxy = tomllib.loads(printed(*COMMANDS["proxy"].split()))
    assert proxy["port"] == 8123 and proxy["probation"]["min_outcomes"] == 7


def test_keys_and_passwords_are_never_printed():
    text = printed(
        "proxy",
        "--upstream",
        "openai:m",
        "--require-key",
        "client-s3cret",
        "--feedback-key",
        "op-s3cret",
        "--api-key",
        "sk-s3cret",
        "--log",
        "postgresql://me:pw-s3cret@db/log",
    )
    assert "s3cret" not in text and "log_path" not in text
    assert "s3cret" not in printed("eval", "-t", "arith", "--api-key", "sk-s3cret")


# ---- a file sets the run's config, a flag overrides it -------------------------------------


def qa_task(path: Path, n: int = 4) -> Path:
    rows = [{"id": f"q{i}", "input": f"What is {i}+1?", "reference": str(i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def scripted_eval(monkeypatch: pytest.MonkeyPatch) -> ScriptedModel:
    model = ScriptedModel(lambda messages: "2", "scripted")
    monkeypatch.setattr(selftaught.models, "load_model", lambda spec, **_: model)
    return model


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_eval_reads_its_settings_from_the_file_and_keeps_them(suffix, tmp_path, monkeypatch):
    model = scripted_eval(monkeypatch)
    task = qa_task(tmp_path / "qa.jsonl")
    settings = {
        ".toml": f'task = "{task}"\nmodel = "scripted"\nsplit = "train"\nlimit = 2\n'
        "[rollout.params]\ntemperature = 0.25\nmax_tokens = 17\n",
        ".yaml": f"task: {task}\nmodel: scripted\nsplit: train\nlimit: 2\n"
        "rollout:\n  params:\n    temperature: 0.25\n    max_tokens: 17\n",
    }[suffix]
    config = tmp_path / f"eval{suffix}"
    config.write_text(settings)
    done = run("eval", "--config", str(config), "--output", "out/qa.jsonl")
    assert done.exit_code == 0, done.output
    assert len(Path("out/qa.jsonl").read_text().splitlines()) == 2
    assert {(p.temperature, p.max_tokens) for p in model.params} == {(0.25, 17)}
    kept = Path("out/qa.config.toml").read_text()
    assert kept == printed("eval", "--config", str(config), "--output", "out/qa.jsonl")
    assert tomllib.loads(kept)["rollout"]["params"] == {"max_tokens": 17, "temperature": 0.25}


def test_a_flag_overrides_the_file(tmp_path, monkeypatch):
    model = scripted_eval(monkeypatch)
    task = qa_task(tmp_path / "qa.jsonl")
    config = tmp_path / "eval.toml"
    config.write_text(
        f'task = "{task}"\nmodel = "scripted"\nlimit = 3\nsplit = "train"\n'
        "[rollout.params]\ntemperature = 0.25\n"
    )
    done = run("eval", "--config", str(config), "--limit", "1", "--temperature", "0.5")
    assert done.exit_code == 0, done.output
    assert len(model.calls) == 1 and model.params[0].temperature == 0.5


class Captured(Exception):
    """What a command handed the library, instead of running it."""


def capture(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    def fake(*args: Any, **kwargs: Any) -> None:
        raise Captured(args, kwargs)

    monkeypatch.setattr(module, name, fake)


def captured(*args: str) -> dict[str, Any]:
    done = run(*args)
    assert isinstance(done.exception, Captured), done.output
    return dict(done.exception.args[1])


def test_optimize_and_train_build_their_configs_from_the_file(tmp_path, monkeypatch):
    import selftaught.api

    capture(monkeypatch, selftaught.api, "optimize")
    capture(monkeypatch, selftaught.api, "train")
    (tmp_path / "opt.toml").write_text(
        'task = "arith"\nepochs = 3\ndemo_sets_per_step = 5\n[gate]\nmargin = 0.5\n'
        "[budget]\ncalls = 99\n[task_options]\nseed = 11\n"
    )
    config = captured("optimize", "--config", "opt.toml", "--epochs", "4")["config"]
    assert (config.epochs, config.demo_sets_per_step, config.seed) == (4, 5, 11)
    assert config.gate.margin == 0.5 and config.budget.calls == 99
    (tmp_path / "train.yaml").write_text(
        "task: arith\nmethod: grpo\nlr: 0.001\nrl: {steps: 6, beta: 0.1}\n"
        "backend: {lora_r: 4}\nreward: [correctness=1]\n"
    )
    config = captured("train", "--config", "train.yaml")["config"]
    assert (config.method, config.steps, config.beta, config.learning_rate) == (
        "grpo",
        6,
        0.1,
        0.001,
    )
    assert config.backend.lora_r == 4 and config.rewards == {"correctness": 1.0}


def test_train_refuses_a_file_setting_for_another_method(tmp_path):
    (tmp_path / "mixed.toml").write_text('task = "arith"\nmethod = "grpo"\n[rest]\nrounds = 5\n')
    done = run("train", "--config", "mixed.toml")
    assert done.exit_code == 2 and "--rounds" in done.output and "grpo" in done.output


def test_sleep_run_and_proxy_build_their_configs_from_the_file(tmp_path, monkeypatch):
    import selftaught.sleep.intake.proxy
    import selftaught.sleep.night.cycle

    capture(monkeypatch, selftaught.sleep.night.cycle, "run_night")
    capture(monkeypatch, selftaught.sleep.intake.proxy, "run_proxy")
    (tmp_path / "night.toml").write_text(
        'project = "shop"\nmax_tasks = 30\ngate = "off"\n[training]\nepochs = 2\nseed = 4\n'
        '[training.gate]\nmargin = 0.0\nobjective = ["score", "tokens"]\n'
        "[weight_training]\nadapter_max_steps = 3\n[miner]\nread_followups = true\n"
    )
    done = run("sleep", "run", "--config", "night.toml", "--max-tasks", "12")
    assert isinstance(done.exception, Captured), done.output
    night = done.exception.args[0][0]
    assert (night.project, night.max_tasks, night.training.epochs) == ("shop", 12, 2)
    assert night.training.gate.accept_all and night.training.gate.objective == ("score", "tokens")
    assert (night.training.seed, night.weight_training.adapter_max_steps) == (4, 3)
    assert night.miner.read_followups
    (tmp_path / "proxy.toml").write_text(
        'upstream = "openai:m"\nport = 8999\ntimeout_s = 30.0\n[probation]\nmin_outcomes = 9\n'
    )
    done = run("proxy", "--config", "proxy.toml")
    assert isinstance(done.exception, Captured), done.output
    proxy = done.exception.args[0][0]
    assert (proxy.port, proxy.timeout_s, proxy.probation.min_outcomes) == (8999, 30.0, 9)


def test_an_older_files_renamed_keys_still_read_and_print_as_the_new_ones(tmp_path, monkeypatch):
    import selftaught.sleep.night.cycle

    capture(monkeypatch, selftaught.sleep.night.cycle, "run_night")
    (tmp_path / "old.toml").write_text(
        "[weight_training]\nmax_steps = 3\nmax_minutes = 2.5\n"
        "[weak]\nshare = 0.25\n[dream]\nshare = 0.75\n"
    )
    with pytest.warns(DeprecationWarning) as warned:
        done = run("sleep", "run", "--config", "old.toml")
    assert [str(w.message) for w in warned] == [
        "old.toml: weight_training.max_steps is now weight_training.adapter_max_steps",
        "old.toml: weight_training.max_minutes is now weight_training.adapter_max_minutes",
        "old.toml: weak.share is now weak.weak_share",
        "old.toml: dream.share is now dream.synthetic_share",
    ]
    night = done.exception.args[0][0]
    weights = night.weight_training
    assert (weights.adapter_max_steps, weights.adapter_max_minutes) == (3, 2.5)
    assert (night.weak.weak_share, night.dream.synthetic_share) == (0.25, 0.75)
    with pytest.warns(DeprecationWarning):
        text = tomllib.loads(printed("sleep", "run", "--config", "old.toml"))
    assert text["weight_training"] == {"adapter_max_steps": 3, "adapter_max_minutes": 2.5}
    assert (text["weak"]["weak_share"], text["dream"]["synthetic_share"]) == (0.25, 0.75)
    assert "share" not in text["weak"] and "share" not in text["dream"]
    # one setting under both names is refused, naming the old key
    both = "[weight_training]\nmax_steps = 3\nadapter_max_steps = 4\n"
    (tmp_path / "both.toml").write_text(both)
    with pytest.warns(DeprecationWarning):
        done = run("sleep", "run", "--config", "both.toml")
    assert done.exit_code == 2 and "set twice" in done.output


def test_a_night_folder_keeps_the_config_beside_its_report(tmp_path, monkeypatch):
    import selftaught.sleep.night.cycle

    night_dir = tmp_path / "nights" / "n1"
    night_dir.mkdir(parents=True)
    outcome = SimpleNamespace(
        project="default",
        status="staged",
        reason="r",
        stopped_by=None,
        failed=False,
        night_dir=night_dir,
    )
    monkeypatch.setattr(selftaught.sleep.night.cycle, "run_night", lambda *a, **k: [outcome])
    done = run("sleep", "run", "--max-tasks", "7")
    assert done.exit_code == 0, done.output
    kept = (night_dir / "config.toml").read_text()
    assert kept == printed("sleep", "run", "--max-tasks", "7")


# ---- refused -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "valid"),
    [
        ('task = "arith"\nconcurrence = 3\n', "'concurrence'", "rollout, skill, split"),
        (
            'task = "arith"\n[rollout]\nconcurrence = 3\n',
            "'rollout.concurrence'",
            "in [rollout] are concurrency, params",
        ),
        (
            'task = "arith"\n[rollout.params]\nmax_token = 3\n',
            "'rollout.params.max_token'",
            "max_tokens, temperature",
        ),
    ],
)
def test_an_unknown_key_is_refused_naming_the_file_the_key_and_the_valid_keys(text, key, valid):
    Path("bad.toml").write_text(text)
    done = run("eval", "--config", "bad.toml")
    assert done.exit_code == 2
    message = " ".join(done.output.split())
    assert f"error: bad.toml: unknown key {key}" in message and valid in message
    assert "Traceback" not in done.output


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("c.json", "{}", "a config file is .toml, .yaml or .yml"),
        ("c.toml", "task = \n", "is not valid TOML"),
        ("c.yaml", "task: [\n", "is not valid YAML"),
        ("c.yaml", "- a\n- b\n", "holds a list, not a mapping"),
        ("c.toml", "[task]\nx = 1\n", "task takes a value, not a table"),
        ("c.toml", 'task = "x"\nlimit = "many"\n', "Invalid value for '--limit'"),
        (
            "c.yaml",
            "task: x\nrollout: {params: {temperature: hot}}\n",
            "Invalid value for '--temperature'",
        ),
    ],
)
def test_an_unreadable_file_is_one_sentence_and_exit_2(name, text, says):
    Path(name).write_text(text)
    done = run("eval", "--config", name)
    assert done.exit_code == 2 and says in " ".join(done.output.split())
    assert "Traceback" not in done.output
    missing = run("eval", "--config", "nowhere.toml")
    assert missing.exit_code == 2 and "nowhere.toml" in missing.output


def test_print_systemd_writes_the_files_settings_as_flags(tmp_path):
    (tmp_path / "proxy.toml").write_text('upstream = "openai:m"\nport = 8124\ninject = false\n')
    done = run("proxy", "--config", "proxy.toml", "--print-systemd")
    assert done.exit_code == 0, done.output
    exec_line = next(line for line in done.stdout.splitlines() if line.startswith("ExecStart="))
    assert "--port 8124" in exec_line and "--no-inject" in exec_line
    assert "--config" not in exec_line


# ---- --help in panels --------------------------------------------------------------------------


def _panels(*command: str) -> list[str]:
    done = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert done.exit_code == 0, done.output
    return [
        line.strip("╭─ ").split(" ─")[0]
        for line in done.stdout.splitlines()
        if line.startswith("╭")
    ]


def test_help_is_grouped_by_method_for_train_and_by_phase_for_a_night():
    assert _panels("train")[:5] == [
        "Options",
        "ReST / SFT",
        "GRPO / GSPO",
        "DPO / KTO",
        "Fine-tune (ReST, SFT, DPO, KTO)",
    ]
    night = [
        "Options",
        "Window and mining",
        "Skill",
        "Memory",
        "Weights",
        "Gate",
        "Budget",
        "Output",
    ]
    assert _panels("sleep", "run") == night
    assert _panels("sleep", "dry-run") == night  # the same options, by construction
