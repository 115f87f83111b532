"""The library entry points own the wiring: specs, ledgers, method dispatch, persistence."""

from __future__ import annotations

import json

import pytest

import selftaught
from selftaught.skill import SkillOptConfig
from selftaught.weights.config import ConfigError, RestConfig, RLConfig, default_train_config
from tests.scripted import ToyTask, canned_analyst, edits_json, rule_target


def test_evaluate_charges_every_call_and_persists_when_asked(tmp_path):
    out = tmp_path / "eval.jsonl"
    result = selftaught.evaluate(ToyTask(), rule_target(), skill="rule alpha", output=out)
    assert result.usage["target"]["calls"] == result.n == len(ToyTask().examples("test"))
    assert result.hard == pytest.approx(5 / 10)  # the alpha questions only
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["example_id"] for r in rows] == [e.id for e in ToyTask().examples("test")]
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["hard"] == result.hard and "rollouts" not in summary
    assert not (tmp_path / "other.jsonl").exists()


def test_evaluate_writes_nothing_without_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    selftaught.evaluate(ToyTask(), rule_target(), limit=2)
    assert list(tmp_path.iterdir()) == []


def test_optimize_runs_the_trainer_from_specs_and_objects(tmp_path):
    analyst = canned_analyst(failure=edits_json({"op": "append", "content": "rule alpha"}))
    result = selftaught.optimize(
        ToyTask(),
        rule_target(),
        optimizer_model=analyst,
        output_dir=tmp_path,
        progress=False,
        config=SkillOptConfig(epochs=1, batch_size=8),
    )
    assert result.run_dir == tmp_path and result.to_dict()["run_dir"] == str(tmp_path)
    assert "rule alpha" in result.best_skill
    assert result.usage["optimizer"]["calls"] == len(analyst.calls)


def test_train_dispatches_per_method_defaults_and_refuses_api_models():
    assert isinstance(default_train_config("rest"), RestConfig)
    assert default_train_config("sft").rounds == 1
    assert default_train_config("gspo").method == "gspo"
    assert isinstance(default_train_config("grpo"), RLConfig)
    assert default_train_config("dpo").method == "dpo"  # DPO is a trainer of its own
    with pytest.raises(ConfigError, match="one of rest, sft, grpo, gspo, dpo"):
        default_train_config("ppo")
    with pytest.raises(ConfigError, match="must be local"):
        selftaught.train("gym:basic_arithmetic", "openai:gpt-4o-mini")
    with pytest.raises(ConfigError, match="needs an RLConfig"):
        selftaught.train("gym:basic_arithmetic", method="grpo", config=RestConfig())


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        selftaught.fit  # noqa: B018
