"""Tracking: `report_to` sends a skill run or a night to trackio (local) or MLflow's file
store, read back through each tool's own reading API, with every non-loopback connection
refused (nothing reaches the network); the weight trainers hand `report_to` to TRL; a
missing package is a one-line error naming the extra. The trackio and MLflow tests skip when
the `tracking` extra is not installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from selftaught.skill import SkillOptConfig
from selftaught.skill.trainer import SkillTrainer
from selftaught.sleep.night.cycle import NightConfig, run_night
from selftaught.tracking import TrackingError, require, trl_report_to, with_tracker
from selftaught.weights.config import ConfigError, RestConfig, RLConfig
from tests.scripted import ToyTask, append, canned_analyst, edits_json, rule_target
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

ROOT = Path(__file__).resolve().parents[1]
QUIET = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
}


def no_network(monkeypatch) -> list:
    """Refuse (and record) every connection that is not to this machine."""
    tried: list = []
    real = socket.socket.connect

    def guard(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError(f"network refused in tests: {address}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", guard)
    return tried


def skill_run(tmp_path: Path, report_to: str):
    return SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8, report_to=report_to),
        ToyTask(),
        rule_target(),
        optimizer_model=canned_analyst(failure=edits_json(append("rule alpha"))),
        output_dir=tmp_path / "run",
        progress=False,
    ).train()


def test_report_to_is_validated_everywhere():
    for make in (
        lambda: RestConfig(report_to="tensorboard"),
        lambda: RLConfig(report_to="tensorboard"),
        lambda: SkillOptConfig(report_to="tensorboard"),
        lambda: NightConfig(report_to="tensorboard"),
    ):
        with pytest.raises(ValueError, match="report_to must be one of none, trackio, mlflow"):
            make()
    assert with_tracker("none", ()) == [] and trl_report_to("none") == {"report_to": "none"}


def test_a_missing_tracker_package_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(TrackingError, match=r'pip install "selftaught\[wandb\]"'):
        require("wandb")
    with pytest.raises(TrackingError, match="needs the wandb package"):
        skill_run(tmp_path, "wandb")  # refused when built, before any model call
    assert not (tmp_path / "run").exists()
    with pytest.raises(TrackingError, match="selftaught"):
        trl_report_to("wandb")
    assert issubclass(TrackingError, ValueError) and issubclass(ConfigError, ValueError)


def test_weight_trainers_hand_report_to_to_trl(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("mlflow")
    from selftaught.weights.rl import RLTrainer
    from tests.test_weights_rl import SumTask

    trainer = RLTrainer(RLConfig(report_to="mlflow"), SumTask(), output_dir=tmp_path / "rl")
    args = trainer.grpo_args(use_cpu=True)
    assert args.report_to == ["mlflow"] and args.run_name == "rl"
    plain = RLTrainer(RLConfig(), SumTask(), output_dir=tmp_path / "x").grpo_args(use_cpu=True)
    assert plain.report_to in ("none", [])


def test_a_skill_run_and_a_night_logged_to_mlflows_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.artifacts import load_text
    from mlflow.tracking import MlflowClient

    tried = no_network(monkeypatch)
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "selftaught-test")
    result = skill_run(tmp_path, "mlflow")

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("selftaught-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["task"] == "toy" and run.data.params["report_to"] == "mlflow"
    assert run.data.tags["selftaught.method"] == "skill"
    val = client.get_metric_history(run.info.run_id, "val/base/hard")
    assert [(m.step, m.value) for m in val] == [(0, result.val_initial.hard)]
    gates = client.get_metric_history(run.info.run_id, "gate/accepted")
    assert len(gates) == result.steps
    assert run.data.metrics["result/shipped_hard"] == result.shipped_score.hard
    assert run.data.metrics["usage/calls"] == sum(u["calls"] for u in result.usage.values())
    skill = load_text(f"{run.info.artifact_uri}/best_skill.md")
    assert skill == result.best_skill and "rule alpha" in skill
    decisions = json.loads(load_text(f"{run.info.artifact_uri}/gate_decisions.json"))
    assert [d["decision"] for d in decisions] == [
        json.loads(line)["gate"]["decision"]
        for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()[1:]
    ]

    # a night goes to the same store, through the same callback
    home = tmp_path / "home"
    home.mkdir()
    fill_log(home, ALPHA_NIGHT)
    (night,) = run_night(config(home, report_to="mlflow"), models=models())
    runs = client.search_runs([experiment.experiment_id], "tags.`selftaught.method` = 'night'")
    [night_run] = runs
    assert night_run.data.metrics["gate/new_best"] == 1.0  # staged
    assert night_run.data.metrics["val/after/hard"] == night.shipped_score.hard
    proposal = load_text(f"{night_run.info.artifact_uri}/proposal_skill.md")
    assert proposal.strip() == "rule alpha"
    assert tried == []


TRACKIO_SCRIPT = """
import json, socket, sys
tried = []
real = socket.socket.connect
def guard(self, address):
    if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
        tried.append(str(address))
        raise OSError("network refused in tests")
    return real(self, address)
socket.socket.connect = guard

from pathlib import Path
from tests.test_tracking import skill_run
out = Path(sys.argv[1])
result = skill_run(out, "trackio")

import trackio
from trackio.sqlite_storage import SQLiteStorage
[run] = list(trackio.Api().runs("selftaught-test"))
logs = SQLiteStorage.get_logs("selftaught-test", run.name)
reader = trackio.init(project="selftaught-test", name="reader", embed=False,
                      auto_log_cpu=False, auto_log_gpu=False)
skill_dir = reader.use_artifact(f"{run.name}-best_skill").download(out / "artifact")
reader.finish()
print("RESULT " + json.dumps({
    "name": run.name, "config": run.config, "logs": logs, "tried": tried,
    "skill": (Path(skill_dir) / "best_skill.md").read_text(),
    "best_skill": result.best_skill, "val_initial": result.val_initial.hard,
    "shipped": result.shipped_score.hard, "steps": result.steps,
}))
"""


def test_a_skill_run_logged_to_trackio_locally(tmp_path):
    pytest.importorskip("trackio")
    env = {
        **os.environ,
        **QUIET,
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "TRACKIO_PROJECT": "selftaught-test",
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
    }
    env.pop("TRACKIO_SPACE_ID", None)
    env.pop("TRACKIO_SERVER_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRACKIO_SCRIPT), str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    got = json.loads(line.removeprefix("RESULT "))
    assert got["tried"] == []  # nothing left this machine
    assert got["name"] == "run" and got["config"]["task"] == "toy"
    base = [row for row in got["logs"] if "val/base/hard" in row]
    assert [(r["step"], r["val/base/hard"]) for r in base] == [(0, got["val_initial"])]
    assert sum("gate/accepted" in row for row in got["logs"]) == got["steps"]
    assert any(row.get("result/shipped_hard") == got["shipped"] for row in got["logs"])
    assert got["skill"] == got["best_skill"] and "rule alpha" in got["skill"]
    assert (tmp_path / "trackio").is_dir()  # stored where TRACKIO_DIR says, nowhere else


@pytest.mark.slow
def test_an_sft_run_of_the_embedded_model_logs_through_trls_report_to(tmp_path, monkeypatch):
    """The weight trainers hand report_to to TRL: a real SFT round of the embedded model
    lands in MLflow's file store as TRL's own run (its loss per step), and the run returns a
    RestResult whose events reached the callbacks."""
    pytest.importorskip("trl")
    pytest.importorskip("mlflow")
    import torch
    from mlflow.tracking import MlflowClient

    import selftaught
    from selftaught.weights.config import SFTTrainConfig
    from selftaught.weights.rest import RestResult
    from tests.test_contract import Recorder

    torch.set_num_threads(1)
    monkeypatch.setenv("SELFTAUGHT_THREADS", "1")  # the local model keeps to it too
    tried = no_network(monkeypatch)
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "selftaught-sft")
    recorder = Recorder()
    config = RestConfig(
        method="sft",
        max_tokens=8,
        gen_batch_size=8,
        sft=SFTTrainConfig(epochs=1, batch_size=2, max_length=128),
        report_to="mlflow",
    )
    result = selftaught.train(
        "gym:basic_arithmetic?max_terms=2&max_digits=1",
        "local",
        config=config,
        output_dir=tmp_path / "run",
        task_options={"train_size": 4, "val_size": 2, "test_size": 2},
        callbacks=[recorder],
        progress=False,
    )
    assert isinstance(result, RestResult) and result.method == "sft"
    kinds = ["start", "evaluate", "evaluate", "evaluate", "gate", "step", "end"]
    assert [e[0] for e in recorder.events] == kinds
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("selftaught-sft")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-round-1"
    losses = client.get_metric_history(run.info.run_id, "loss")
    steps = result.rounds[1].train.steps
    assert len(losses) == steps >= 1  # TRL logged every step (logging_steps=1)
    assert tried == []
