"""The base every trainer shares (`selftaught.trainer_base.BaseTrainer`), enforced once for the
four trainers: the config's type, callbacks checked before anything is written, the resume
check that names a changed setting, on_start first and on_end last (in the order the callbacks
were given), and a val / test item that is also in train failing closed. The skill trainer
runs on scripted models; the weight trainers stop before their model is loaded, except in the
callbacks test, which trains a tiny random model."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from selftaught.callbacks import RunInfo, TrainerCallback
from selftaught.errors import ConfigError, TaskError
from selftaught.stops import Stops
from selftaught.trainer_base import BaseTrainer
from selftaught.trainers import build_trainer, trainer_for
from selftaught.weights.config import BackendConfig, DPOConfig, RestConfig, RLConfig, SFTTrainConfig
from selftaught.weights.dpo import PreferencePair
from tests.scripted import ToyTask, rule_target
from tests.test_contract import SMALL, tiny_configs

KINDS = ("skill", "sft", "grpo", "dpo")
# what the resume check names when the seed changes: the skill run's settings are flat in
# config.json; a weight run's are under its method's key
SEED_NAMED = {"skill": "seed", "sft": "rest", "grpo": "rl", "dpo": "dpo"}
PAIRS = [
    PreferencePair(f"p{i}", [{"role": "user", "content": f"Add {i} and 1."}], f"{i + 1}", "7")
    for i in range(4)
]


class Halt(Exception):
    """Raised by a callback: the run stops there (a callback's error stops the run)."""


class HaltAtStart(TrainerCallback):
    def on_start(self, run: RunInfo) -> None:
        raise Halt(run.run_dir)


class Journal(TrainerCallback):
    """Writes (its name, the event) into a log shared by several callbacks."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log
        self.results: list[Any] = []

    def on_start(self, run: RunInfo) -> None:
        self.log.append((self.name, "start"))

    def on_evaluate(self, run, *, step, split, scores, label=""):
        self.log.append((self.name, "evaluate"))

    def on_gate(self, run, *, step, decision, reason, details):
        self.log.append((self.name, "gate"))

    def on_step(self, run, *, step, metrics):
        self.log.append((self.name, "step"))

    def on_end(self, run, result):
        self.log.append((self.name, "end"))
        self.results.append(result)


def config_of(kind: str, **changes: Any) -> Any:
    if kind == "dpo":
        config: Any = DPOConfig(
            max_tokens=8,
            train=SFTTrainConfig(epochs=1, batch_size=2, max_length=64),
            backend=BackendConfig(lora_r=2, lora_alpha=4),
        )
    else:
        config = tiny_configs()[kind]
    return replace(config, **changes) if changes else config


def make(
    kind: str,
    output: Path,
    *,
    model: Any = None,
    task: Any = None,
    callbacks: list[TrainerCallback] | tuple[()] = (),
    **changes: Any,
) -> Any:
    """The trainer of `kind` built the one way; a weight trainer's model defaults to a path
    that is never loaded (every check here runs before the model is)."""
    extra: dict[str, Any] = {"preferences": PAIRS} if kind == "dpo" else {}
    return build_trainer(
        config_of(kind, **changes),
        task or ToyTask(**SMALL),
        model or (rule_target() if kind == "skill" else "local:/never-loaded"),
        output_dir=output,
        callbacks=callbacks,
        progress=False,
        **extra,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_trainer_is_built_on_the_base_and_refuses_a_wrong_config_the_same_way(kind, tmp_path):
    trainer = make(kind, tmp_path / kind)
    assert isinstance(trainer, BaseTrainer) and type(trainer) is trainer_for(trainer.config)
    assert trainer.run.root == trainer.info.run_dir == tmp_path / kind
    assert trainer.info.method == trainer.method == {"sft": "sft"}.get(kind, kind)
    assert trainer.info.config == trainer.config.to_dict()
    assert trainer.ledger.budget == trainer.config.budget  # one ledger, the config's budget
    assert trainer.test_ledger is not trainer.ledger  # test stands outside the budget
    assert trainer.result_type.kind in ("skill", "rest", "rl", "dpo")

    cls, wrong = type(trainer), (RestConfig() if kind == "grpo" else RLConfig())
    extra: dict[str, Any] = {"preferences": PAIRS} if kind == "dpo" else {}
    model = rule_target() if kind == "skill" else "local:/never-loaded"
    want = f"{cls.__name__} needs an? {type(trainer.config).__name__}, got {type(wrong).__name__}"
    with pytest.raises(ConfigError, match=f"^{want}$"):
        cls(wrong, ToyTask(**SMALL), model, output_dir=tmp_path / "wrong", **extra)
    with pytest.raises(TypeError, match="callbacks must be TrainerCallback instances"):
        make(kind, tmp_path / "bad-callback", callbacks=[print])  # type: ignore[list-item]
    assert not (tmp_path / "wrong").exists() and not (tmp_path / "bad-callback").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_resume_with_changed_settings_is_refused_naming_them(kind, tmp_path):
    run = tmp_path / kind
    with pytest.raises(Halt):  # config.json is written, then on_start stops the run
        make(kind, run, callbacks=[HaltAtStart()]).train()
    recorded = json.loads((run / "config.json").read_text())
    named = SEED_NAMED[kind]
    assert named in recorded

    seen: list[tuple[str, str]] = []
    message = (
        f"{re.escape(str(run))} holds a run with a different config \\({named}\\); use "
        "another --output directory or the same settings to resume"
    )
    with pytest.raises(ConfigError, match=message):
        make(kind, run, seed=1, callbacks=[Journal("j", seen)]).train()
    assert seen == []  # refused before on_start
    assert json.loads((run / "config.json").read_text()) == recorded  # left as it was

    # the stops are this invocation's: a resume with other ones passes the check
    with pytest.raises(Halt):
        make(kind, run, stops=Stops(max_minutes=5.0), callbacks=[HaltAtStart()]).train()


NEWER_SETTING = ("seed", 5)  # a setting at its default in `config_of`, and another value


def _drop(config: dict[str, Any], key: str) -> bool:
    """Remove `key` wherever it is in a saved config (flat, or under a method's key)."""
    found = config.pop(key, None) is not None
    for value in config.values():
        if isinstance(value, dict):
            found = _drop(value, key) or found
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_saved_before_a_setting_existed_resumes_at_its_default(kind, tmp_path):
    run = tmp_path / kind
    with pytest.raises(Halt):
        make(kind, run, callbacks=[HaltAtStart()]).train()
    key, other = NEWER_SETTING
    saved = json.loads((run / "config.json").read_text())
    assert _drop(saved, key)  # as a version without that setting wrote it
    (run / "config.json").write_text(json.dumps(saved))

    with pytest.raises(Halt):  # the same settings: the missing one reads as its default
        make(kind, run, callbacks=[HaltAtStart()]).train()
    with pytest.raises(ConfigError, match="holds a run with a different config"):
        make(kind, run, **{key: other}).train()  # not at its default: a changed setting


@pytest.mark.parametrize("kind", KINDS)
def test_val_overlapping_train_fails_closed_naming_the_item(kind, tmp_path):
    run = tmp_path / kind
    target = rule_target()
    with pytest.raises(
        TaskError,
        match=(
            "task 'toy': example 'val-000' in split 'val' also appears in split 'train'; "
            "validation that overlaps training is refused"
        ),
    ):
        model = target if kind == "skill" else None
        make(kind, run, task=ToyTask(**SMALL, overlap=True), model=model).train()
    assert target.calls == [] and not (run / "config.json").exists()  # nothing ran


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("trl")
    from tests.tiny_model import save_tiny_model

    return f"local:{save_tiny_model(tmp_path_factory.mktemp('tiny-model'))}"


@pytest.mark.parametrize("kind", KINDS)
def test_callbacks_see_on_start_first_and_on_end_last_in_the_order_given(kind, tmp_path, request):
    model = rule_target() if kind == "skill" else request.getfixturevalue("tiny_model")
    log: list[tuple[str, str]] = []
    first, second = Journal("first", log), Journal("second", log)
    trainer = make(kind, tmp_path / kind, model=model, callbacks=[first, second])
    result = trainer.train()
    assert isinstance(result, trainer.result_type)
    assert log[:2] == [("first", "start"), ("second", "start")]
    assert log[-2:] == [("first", "end"), ("second", "end")]
    assert [e for n, e in log if n == "first"] == [e for n, e in log if n == "second"]
    assert log[0::2] == [("first", e) for n, e in log if n == "first"]  # each event: first, second
    assert first.results == second.results == [result]
    on_disk = json.loads((tmp_path / kind / trainer.result_file).read_text())
    assert on_disk == json.loads(json.dumps(result.to_dict(), default=str))
