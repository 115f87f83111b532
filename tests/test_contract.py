"""One trainer contract: the config's type picks the trainer, every trainer returns a
`RunResult` subclass that survives `to_dict` / `from_dict`, and callbacks see every run's
events in order (scripted models; the weight trainers' events are checked in their own tests,
which train a tiny model)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import selftaught
from selftaught.api import load_result
from selftaught.callbacks import RunInfo, TrainerCallback
from selftaught.evaluation import EvalResult
from selftaught.gate import GateResult
from selftaught.models.usage import UsageLedger
from selftaught.results import RunResult, SplitScore
from selftaught.skill import SkillOptConfig
from selftaught.skill.result import SkillRunResult
from selftaught.skill.trainer import SkillTrainer
from selftaught.sleep.night.cycle import (
    NightConfig,
    NightResult,
    NightTrainer,
    run_night,
)
from selftaught.trainers import build_trainer, check_method, trainer_for
from selftaught.weights.config import ConfigError, RestConfig, RLConfig, default_train_config
from selftaught.weights.rest import RestResult, RestTrainer
from selftaught.weights.rl import RLResult, RLTrainer
from selftaught.weights.rows import RestRound, RLStepRow
from tests.scripted import ToyTask, append, canned_analyst, edits_json, rule_target
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models


class Recorder(TrainerCallback):
    """Every event, in order, as a short tuple."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.results: list[RunResult] = []

    def on_start(self, run: RunInfo) -> None:
        self.events.append(("start", run.method))

    def on_evaluate(self, run, *, step, split, scores, label=""):
        assert isinstance(scores, SplitScore)
        self.events.append(("evaluate", step, split, label))

    def on_step(self, run, *, step, metrics):
        self.events.append(("step", step))

    def on_gate(self, run, *, step, decision, reason, details):
        self.events.append(("gate", step, decision))

    def on_end(self, run, result):
        self.events.append(("end",))
        self.results.append(result)


def roundtrip(result: RunResult) -> RunResult:
    back = RunResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert type(back) is type(result)
    assert back.to_dict() == result.to_dict()
    return back


def eval_result(hard: float, split: str = "test") -> EvalResult:
    return EvalResult.from_summary(
        {
            **{"task": "t", "model": "m", "split": split, "n": 4, "n_errors": 0},
            **{"n_scorer_errors": 0, "hard": hard, "hard_ci": [0.1, 0.9], "soft": hard},
            **{"soft_ci": [0.1, 0.9], "prompt_tokens": 1, "completion_tokens": 2},
            **{"truncated": 0, "retries": 0, "wall_s": 0.1, "skill_hash": "h"},
        }
    )


# ---- the config picks the trainer --------------------------------------------------------


def test_the_config_type_and_method_pick_the_trainer():
    assert trainer_for(SkillOptConfig()) is SkillTrainer
    assert trainer_for(RestConfig()) is RestTrainer
    assert trainer_for(RestConfig(method="sft")) is RestTrainer
    assert trainer_for(RLConfig(method="gspo")) is RLTrainer
    assert default_train_config("sft") == RestConfig(method="sft", rounds=1)
    with pytest.raises(ConfigError, match="SkillOptConfig, RestConfig, RLConfig or DPOConfig"):
        trainer_for({"method": "rest"})  # type: ignore[arg-type]
    built = build_trainer(RestConfig(method="sft"), ToyTask(), "local", output_dir="unused")
    assert isinstance(built, RestTrainer) and built.method == "sft" and built.model_path is None


def test_a_method_that_does_not_match_the_config_is_a_clear_config_error():
    with pytest.raises(ConfigError, match=r"grpo and gspo take an RLConfig"):
        RestConfig(method="grpo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rest and sft take a RestConfig"):
        RLConfig(method="sft")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--rounds must be 1"):
        RestConfig(method="sft", rounds=2)
    assert RestConfig(method="sft").rounds == 1 and RestConfig().rounds == 3
    with pytest.raises(ConfigError, match=r"method 'sft' needs a RestConfig\(method='sft'\)"):
        check_method(RestConfig(), "sft")
    with pytest.raises(ConfigError, match="needs an RLConfig"):
        selftaught.train("gym:basic_arithmetic", method="grpo", config=RestConfig())
    with pytest.raises(ConfigError, match="a SkillOptConfig runs with optimize"):
        selftaught.train("gym:basic_arithmetic", config=SkillOptConfig())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a RestConfig"):
        RestTrainer(RLConfig(), ToyTask())  # type: ignore[arg-type]
    check_method(RLConfig(method="gspo"), "gspo")  # a matching method is fine
    check_method(RestConfig(), None)


def test_a_weight_trainer_takes_a_local_model_as_a_spec_a_path_or_an_object(tmp_path):
    from selftaught.models.local import LocalModel

    task = ToyTask()
    for model in ("local:/m", Path("/m")):
        built = build_trainer(RestConfig(), task, model, output_dir=tmp_path / "a")
        assert isinstance(built, RestTrainer) and built.model_path == Path("/m")
    embedded = build_trainer(RLConfig(), task, LocalModel(), output_dir=tmp_path / "b")
    assert isinstance(embedded, RLTrainer) and embedded.model_path is None
    with pytest.raises(ConfigError, match="must be local"):
        RLTrainer(RLConfig(), task, "openai:gpt-4o-mini", output_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match="must be local or local:PATH, got 'scripted-target'"):
        build_trainer(RestConfig(), task, rule_target(), output_dir=tmp_path / "y")


def test_a_skill_trainer_takes_a_spec_string_too(tmp_path):
    """The README's own example: `build_trainer(SkillOptConfig(), task, "local", ...)`."""
    from selftaught.models.local import LocalModel
    from selftaught.models.usage import TrackedModel

    built = build_trainer(SkillOptConfig(), ToyTask(), "local", output_dir=tmp_path)
    assert isinstance(built, SkillTrainer)
    assert isinstance(built.target, TrackedModel) and isinstance(built.target.inner, LocalModel)
    assert built.optimizer.inner is built.target.inner  # the analyst defaults to the target
    with pytest.raises(ConfigError, match="a spec string or a ChatModel, got int"):
        build_trainer(SkillOptConfig(), ToyTask(), 3, output_dir=tmp_path)  # type: ignore


def test_no_legacy_constructor_remains(tmp_path):
    for trainer in (RestTrainer, RLTrainer):
        with pytest.raises(TypeError, match="model_path"):
            trainer(RestConfig(), ToyTask(), output_dir=tmp_path, model_path="local")  # type: ignore


# ---- every trainer kind, built and run the one way ---------------------------------------

SMALL = {"train": {"alpha": 2}, "val": {"alpha": 1, "beta": 1}, "test": {"alpha": 2}}


def tiny_configs() -> dict[str, SkillOptConfig | RestConfig | RLConfig]:
    """Each trainer kind with settings that finish in seconds on a small model (ReST keeps
    every sample: a model that solves nothing still has something to train on)."""
    from selftaught.weights.config import BackendConfig, SFTTrainConfig

    backend = BackendConfig(lora_r=2, lora_alpha=4)
    sft = SFTTrainConfig(epochs=1, batch_size=2)
    tokens = {"max_tokens": 8, "backend": backend, "sft": sft}
    return {
        "skill": SkillOptConfig(epochs=1, batch_size=2, max_tokens=8, analyst_max_tokens=64),
        "rest": RestConfig(
            rounds=1, samples_per_prompt=2, min_score=0.0, keep_truncated=True, **tokens
        ),  # fmt: skip
        "sft": RestConfig(method="sft", **tokens),
        "grpo": RLConfig(
            steps=1,
            num_generations=2,
            prompts_per_step=1,
            max_completion_length=8,
            eval_max_tokens=8,
            backend=backend,
        ),  # fmt: skip
    }


def run_the_one_way(method: str, model: Any, tmp_path: Path) -> RunResult:
    """Build the trainer of `method` from (config, task, model, keywords) and run it: every
    kind returns its typed result and its callbacks see the run start and end."""
    config = tiny_configs()[method]
    recorder = Recorder()
    trainer = build_trainer(
        config, ToyTask(**SMALL), model, output_dir=tmp_path / method, callbacks=[recorder],
        progress=False,
    )  # fmt: skip
    assert type(trainer) is trainer_for(config)
    result = trainer.train()
    assert isinstance(result, RunResult) and result.method == method, result
    assert (result.run_dir, result.task) == (tmp_path / method, "toy")
    assert result.base_score is not None and result.shipped_score is not None
    assert recorder.events[0] == ("start", method) and recorder.events[-1] == ("end",)
    assert recorder.results == [result]
    roundtrip(result)
    return result


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("trl")
    from tests.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def test_every_trainer_kind_is_built_and_run_the_one_way_fast(tmp_path, tiny_model):
    """Fast: the skill trainer on a scripted model, SFT on a tiny model given by spec; the
    other kinds are built from the same arguments (they run in the slow test below)."""
    target = rule_target()
    run_the_one_way("skill", target, tmp_path)
    sft = run_the_one_way("sft", f"local:{tiny_model}", tmp_path)
    assert isinstance(sft, RestResult) and sft.rounds
    for method in ("rest", "grpo"):
        built = build_trainer(tiny_configs()[method], ToyTask(**SMALL), f"local:{tiny_model}",
                              output_dir=tmp_path / method)  # fmt: skip
        assert built.model_path == tiny_model  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.local
def test_every_trainer_kind_runs_on_the_embedded_model_from_the_same_arguments(tmp_path):
    """The contract on the real embedded model: `build_trainer(config, task, "local", ...)`
    for every kind, the skill trainer's analyst included (run under the model lock)."""
    pytest.importorskip("trl")
    results = {m: run_the_one_way(m, "local", tmp_path) for m in tiny_configs()}
    assert isinstance(results["skill"], SkillRunResult)
    assert isinstance(results["rest"], RestResult) and isinstance(results["grpo"], RLResult)
    assert results["skill"].usage["optimizer"]["calls"] > 0


# ---- results --------------------------------------------------------------------------------


def skill_run(tmp_path, callbacks=()) -> SkillRunResult:
    analyst = canned_analyst(failure=edits_json({"op": "append", "content": "rule alpha"}))
    return SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8),
        ToyTask(),
        rule_target(),
        optimizer_model=analyst,
        output_dir=tmp_path,
        callbacks=callbacks,
        progress=False,
    ).train()


def test_a_skill_run_returns_a_typed_result_that_round_trips(tmp_path):
    result = skill_run(tmp_path)
    assert isinstance(result, SkillRunResult) and isinstance(result, RunResult)
    assert result.run_dir == tmp_path and result.method == "skill" and result.task == "toy"
    assert "rule alpha" in result.best_skill and result.document == "skill"
    with pytest.raises(TypeError):
        result["best_skill"]  # type: ignore[index]  # no dict underneath
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == result.to_dict() and summary["best_skill"] == result.best_skill
    assert result.val_best is not None and result.val_best.solved == summary["val_best"]["solved"]
    assert result.test is not None and result.test.paired.wins == summary["test"]["paired"]["wins"]
    # base and shipped are the test comparison, with their intervals
    assert result.base_score == SplitScore.from_summary(summary["test"]["initial"], "test")
    assert result.shipped_score is not None and result.shipped_score.split == "test"
    assert result.shipped_score.hard == result.test.best.hard == summary["test"]["best"]["hard"]
    assert result.gain == pytest.approx(result.test.gain)
    assert result.usage["optimizer"]["calls"] > 0 and result.analyst.calls > 0
    assert result.llm_calls == sum(u["calls"] for u in result.usage.values())
    back = roundtrip(result)  # to_dict() equal after from_dict
    assert isinstance(back, SkillRunResult) and back.analyst == result.analyst
    assert back.test is not None and back.test.paired == result.test.paired
    assert result.texts() == {"best_skill.md": result.best_skill}


def test_every_result_kind_is_frozen(tmp_path):
    """A result is what its run returned: a change after it is a new one (`replace`)."""
    from tests.test_docs_reference import api_types

    kinds = {k.__name__: k for k in api_types()["results"]}
    names = {"SkillRunResult", "SkillSetResult", "RestResult", "DPOResult", "RLResult"}
    assert names | {"NightResult"} <= set(kinds)
    assert [name for name, k in kinds.items() if not k.__dataclass_params__.frozen] == []
    result = skill_run(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.best_skill = "edited"
    edited = dataclasses.replace(result, best_skill="edited")
    assert edited.best_skill == "edited" and edited.shipped_score == result.shipped_score


def test_a_summary_written_before_typed_results_still_loads(tmp_path):
    """An older run's summary.json (no kind, `elapsed_s` only, `soft_ci95` in its scores)."""
    result = skill_run(tmp_path)
    old = {k: v for k, v in result.to_dict().items() if k not in RESULT_ONLY}
    back = SkillRunResult.from_dict(old)
    assert back.best_skill == result.best_skill and back.seconds == round(result.seconds, 2)
    assert back.shipped_score == result.shipped_score and back.analyst == result.analyst
    assert SplitScore.from_summary({"hard": 0.5, "hard_ci95": [0.1, 0.9], "soft_ci95": [0.2, 0.8]})\
        .soft_ci == (0.2, 0.8)  # fmt: skip


RESULT_ONLY = ("kind", "method", "base_score", "shipped_score", "seconds")


def test_weight_results_round_trip_with_their_own_fields(tmp_path):
    rest = RestResult(
        best_round=2,
        base_test=eval_result(0.25),
        shipped_test=eval_result(0.5),
        rounds=[RestRound(0), RestRound(1), RestRound(2)],
        best_dir=tmp_path / "best",
        run_dir=tmp_path,
        method="sft",
        usage={"target": {"calls": 3}},
        stopped_by="budget (calls)",
    )
    assert rest.base_score.hard == 0.25 and rest.shipped_score.hard_ci == (0.1, 0.9)
    back = roundtrip(rest)
    assert back.best_round == 2 and back.shipped_test.hard == 0.5 and back.method == "sft"
    assert rest.to_dict()["shipped"] == "round 2" and rest.to_dict()["gain"] == 0.25
    rl = RLResult(
        shipped="trained",
        base_val=eval_result(0.1, "val"),
        trained_val=eval_result(0.3, "val"),
        base_test=eval_result(0.2),
        shipped_test=eval_result(0.4),
        gate=GateResult.from_dict({"decision": "accept_new_best"}),
        steps=[RLStepRow(1, {"reward": 0.5})],
        method="grpo",
    )
    back_rl = roundtrip(rl)
    assert back_rl.trained_val.hard == 0.3 and back_rl.steps == rl.steps
    assert load_result(rl.to_dict()).shipped == "trained"


def test_a_night_returns_night_results_that_round_trip(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    recorder = Recorder()
    (night,) = run_night(config(tmp_path), models=models(), callbacks=[recorder])
    assert isinstance(night, NightResult) and isinstance(night, RunResult)
    assert night.status == "staged" and night.run_dir == night.night_dir
    proposal = night.proposal
    assert night.base_score == proposal.val_before.score
    assert night.shipped_score.hard == proposal.val_after.score.hard > night.base_score.hard
    assert night.usage == night.usage and night.stopped_by is None
    assert night.texts()["proposal_skill.md"].strip() == "rule alpha"
    roundtrip(night)
    assert recorder.events == [
        ("start", "night"),
        ("step", 1),
        ("step", 2),
        ("evaluate", 0, "val", "before"),
        ("evaluate", 2, "val", "after"),
        ("gate", 2, "staged"),
        ("end",),
    ]
    assert recorder.results == [night]


def test_the_night_is_a_trainer_built_by_build_trainer(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    cfg = config(tmp_path, project="demo")
    assert cfg.budget is cfg.training.budget
    recorder = Recorder()
    trainer = build_trainer(cfg, tmp_path / "log.db", models(), callbacks=[recorder])
    assert isinstance(trainer, NightTrainer) and trainer.result_type is NightResult
    night = trainer.train()
    assert isinstance(night, NightResult) and night.status == "staged"
    assert night.night_dir is not None and night.night_dir.parent.name == "nights"
    assert recorder.events[0] == ("start", "night") and recorder.results == [night]
    assert json.loads(json.dumps(cfg.to_dict()))["training"]["epochs"] == 1
    with pytest.raises(ConfigError, match="one project"):
        build_trainer(config(tmp_path), None, models()).train()
    with pytest.raises(ConfigError, match="task log"):
        build_trainer(cfg, ToyTask(), models())  # type: ignore[call-overload]


def test_a_night_given_a_ledger_charges_its_calls_to_it(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    ledger = UsageLedger()
    trainer = NightTrainer(config(tmp_path, project="demo"), tmp_path / "log.db", models(),
                           ledger=ledger)  # fmt: skip
    night = trainer.train()
    assert night.status == "staged" and trainer.ledger is ledger
    assert ledger.roles["optimizer"].calls > 0 and ledger.roles["target"].calls > 0
    assert night.usage == ledger.to_dict()


def test_the_night_trainer_is_a_base_trainer_and_run_night_loops_over_build_trainer(
    tmp_path, monkeypatch
):
    # issue 64: the night is on the trainer contract all through (task, run, info), and
    # `run_night` (what `sleep run` calls) is `build_trainer(...).train()` per project, through
    # the night's builder that build_trainer calls (the night sits below `trainers`)
    import selftaught.sleep.night.cycle as cycle
    from selftaught.trainer_base import BaseTrainer

    fill_log(tmp_path, ALPHA_NIGHT)
    built: list[NightTrainer] = []
    real = cycle.build_night_trainer

    def recording(*args: Any, **kw: Any) -> Any:
        trainer = real(*args, **kw)
        built.append(trainer)
        return trainer

    monkeypatch.setattr(cycle, "build_night_trainer", recording)
    (night,) = run_night(config(tmp_path), models=models())
    (trainer,) = built
    assert isinstance(trainer, BaseTrainer) and isinstance(trainer, NightTrainer)
    assert trainer.task.name == trainer.task.project == "demo" == trainer.info.task
    assert trainer.run.root == night.night_dir == trainer.info.run_dir
    assert trainer.info.method == trainer.method == "night" and trainer.config.project == "demo"


def test_sleep_night_is_the_library_entry_point(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    recorder = Recorder()
    nights = selftaught.sleep_night(config(tmp_path), model=models(), callbacks=[recorder])
    (night,) = nights
    assert isinstance(night, NightResult) and night.status == "staged"
    assert night.proposal is not None and night.proposal.val_after is not None
    assert night.shipped_score == night.proposal.val_after.score
    assert recorder.results == [night]
    again = selftaught.sleep_night(config(tmp_path, project="demo"), model=models(), dry_run=True)
    assert [n.status for n in again] == ["too_few_tasks"]  # nothing new since the night


# ---- callbacks ------------------------------------------------------------------------------


def test_callbacks_see_a_skill_run_in_order(tmp_path):
    recorder = Recorder()
    result = skill_run(tmp_path, [recorder])
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    steps = [h["step"] for h in history if h["stage"] == "step"]
    assert steps  # the run made steps
    expected: list[tuple[Any, ...]] = [("start", "skill"), ("evaluate", 0, "val", "base")]
    expected.append(("step", 0))
    for h in history[1:]:
        if h["val"]:
            expected.append(("evaluate", h["step"], "val", "candidate"))
        expected += [("gate", h["step"], h["gate"]["decision"]), ("step", h["step"])]
    last = steps[-1]
    expected += [("evaluate", last, "test", "initial"), ("evaluate", last, "test", "best")]
    expected.append(("end",))
    assert recorder.events == expected
    assert recorder.results == [result]


def test_callbacks_must_be_trainer_callbacks(tmp_path):
    with pytest.raises(TypeError, match="TrainerCallback"):
        skill_run(tmp_path, [object()])


def test_optimize_passes_callbacks_and_returns_the_result(tmp_path):
    recorder = Recorder()
    result = selftaught.optimize(
        ToyTask(),
        rule_target(),
        optimizer_model=canned_analyst(failure=edits_json(append("rule alpha"))),
        output_dir=tmp_path,
        progress=False,
        config=SkillOptConfig(epochs=1, batch_size=8),
        callbacks=[recorder],
    )
    assert isinstance(result, SkillRunResult) and recorder.results == [result]
    assert recorder.events[0] == ("start", "skill") and recorder.events[-1] == ("end",)


def test_sleep_config_the_old_name_still_reads_as_night_config_with_a_warning():
    """`SleepConfig` was NightConfig's name (and the docs said so): both modules that had it
    still hand it out, with a DeprecationWarning that names the new name; nothing else."""
    from selftaught.sleep.night import config as night_config
    from selftaught.sleep.night import cycle

    for module in (cycle, night_config):
        with pytest.warns(DeprecationWarning, match="SleepConfig is now NightConfig"):
            assert module.SleepConfig is NightConfig
        with pytest.raises(AttributeError, match="NoSuchName"):
            module.NoSuchName  # noqa: B018
