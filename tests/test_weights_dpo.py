"""DPO as a trainer of its own: `DPOConfig` picks `DPOTrainer` (build_trainer, selftaught.train,
`train --method dpo --preferences FILE`), the preference file's errors name file:line, and a
prompt that duplicates a val / test item fails closed before anything runs. The last test trains
the real embedded model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.cli.train import check_method_options
from selftaught.errors import TaskError
from selftaught.tasks.jsonl import JsonlTask
from selftaught.trainers import build_trainer, check_method, trainer_for
from selftaught.weights.config import (
    BackendConfig,
    ConfigError,
    DPOConfig,
    SFTTrainConfig,
    default_train_config,
)
from selftaught.weights.dpo import DPOTrainer, PreferencePair, read_preferences

VAL_Q = "What is the capital of France?"


def write_task(tmp_path: Path) -> Path:
    rows = [
        {"id": "t1", "input": "What is 2 + 2?", "reference": "4", "split": "train"},
        {"id": "v1", "input": VAL_Q, "reference": "Paris", "split": "val"},
        {"id": "v2", "input": "What colour is the sky?", "reference": "blue", "split": "val"},
        {"id": "x1", "input": "What is 3 + 5?", "reference": "8", "split": "test"},
    ]
    path = tmp_path / "task.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_prefs(tmp_path: Path, rows: list, name: str = "prefs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def pairs(n: int) -> list[dict]:
    return [
        {"prompt": f"Say the number {i} as a word.", "chosen": f"word {i}", "rejected": "no"}
        for i in range(n)
    ]


def test_build_trainer_returns_a_dpo_trainer_for_a_dpo_config(tmp_path):
    task = JsonlTask(write_task(tmp_path))
    prefs = write_prefs(tmp_path, pairs(2))
    config = DPOConfig(train=SFTTrainConfig(batch_size=2))
    trainer = build_trainer(config, task, "local", preferences=prefs, output_dir=tmp_path / "r")
    assert type(trainer) is DPOTrainer and trainer_for(config) is DPOTrainer
    assert [p.example_id for p in trainer.pairs] == ["1", "2"]  # ids default to the line
    assert trainer.last_round == 1 and trainer.method == "dpo"
    assert isinstance(default_train_config("dpo"), DPOConfig)
    check_method(config, "dpo")
    with pytest.raises(ConfigError, match=r"method 'rest' needs a RestConfig"):
        check_method(config, "rest")
    with pytest.raises(ConfigError, match="DPO trains on preference pairs: give preferences="):
        build_trainer(config, task, "local", output_dir=tmp_path / "r2")
    with pytest.raises(ConfigError, match="--batch-size 8 can never be filled.*2 preference"):
        build_trainer(DPOConfig(), task, "local", preferences=prefs, output_dir=tmp_path / "r3")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DPOConfig(beta=0), r"beta \(--dpo-beta\) must be a finite number > 0"),
        (lambda: DPOConfig(beta=float("nan")), "must be a finite number > 0"),
        (lambda: DPOConfig(method="rest"), "DPOConfig runs method dpo"),
        (lambda: DPOConfig(backend=BackendConfig(backend="full")), "DPO trains a LoRA adapter"),
        (lambda: DPOConfig(max_tokens=0), "max_tokens must be >= 1"),
        (lambda: DPOConfig(report_to="tensorboard"), "report_to must be one of"),
        (lambda: DPOConfig(train=SFTTrainConfig(learning_rate=0)), "learning rate"),
    ],
)
def test_dpo_config_refuses_bad_values(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_dpo_config_defaults_are_what_dpo_train_used():
    config = DPOConfig()
    assert config.beta == 0.1 and config.lr() == 5e-5 and config.seed == 0
    assert DPOConfig(train=SFTTrainConfig(learning_rate=1e-3)).lr() == 1e-3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "prefs.jsonl:2: malformed JSON"),
        ('{"prompt": "hi", "chosen": "a"}', "prefs.jsonl:2: `rejected` must be a non-empty"),
        ('{"chosen": "a", "rejected": "b"}', "prefs.jsonl:2: missing `prompt`"),
        ('{"prompt": "hi", "chosen": "a", "rejected": "a"}', "prefs.jsonl:2: .*the same reply"),
        ('{"prompt": [{"role": "bot", "content": "x"}], "chosen": "a", "rejected": "b"}', "2:"),
        (
            '{"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],'
            ' "chosen": "a", "rejected": "b"}',
            "prefs.jsonl:2: `prompt` ends with an assistant turn",
        ),
        ('{"id": "1", "prompt": "q", "chosen": "a", "rejected": "b"}', "duplicate id '1'"),
    ],
)
def test_a_malformed_preference_line_names_its_file_and_line(tmp_path, line, message):
    path = write_prefs(tmp_path, [pairs(1)[0], line])
    with pytest.raises(TaskError, match=message):
        read_preferences(path)


def test_an_empty_or_missing_preference_file_is_a_clear_error(tmp_path):
    with pytest.raises(TaskError, match="no such preference file"):
        read_preferences(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TaskError, match="holds no preference pairs"):
        read_preferences(tmp_path / "empty.jsonl")


def test_chat_prompts_and_ids_are_read():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        row = {
            "id": "p-1",
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "q"},
            ],
            "chosen": "yes",
            "rejected": "no",
        }
        prefs = read_preferences(write_prefs(Path(d), [row]))
    (pair,) = prefs.pairs
    assert pair == PreferencePair("p-1", row["prompt"], "yes", "no")
    assert prefs.where("p-1").endswith("prefs.jsonl:1")


def test_a_preference_prompt_that_is_a_val_item_fails_closed_naming_it(tmp_path):
    task = JsonlTask(write_task(tmp_path))
    rows = [*pairs(1), {"prompt": VAL_Q, "chosen": "Paris", "rejected": "Lyon"}]
    prefs = write_prefs(tmp_path, rows)
    run = tmp_path / "run"
    config = DPOConfig(train=SFTTrainConfig(batch_size=1))
    with pytest.raises(TaskError, match=r"prefs.jsonl:2 duplicates val item 'v1'"):
        build_trainer(config, task, "local", preferences=prefs, output_dir=run)
    assert not run.exists()  # refused before the run directory was made
    chat = [{"role": "user", "content": "What is 3 + 5?"}]  # the test item, as chat
    in_memory = [PreferencePair("m", chat, "8", "9")]
    with pytest.raises(TaskError, match="duplicates test item 'x1'"):
        DPOTrainer(config, task, "local", preferences=in_memory, output_dir=run)


def test_dpo_refuses_options_it_would_ignore_and_others_refuse_its_own():
    with pytest.raises(ConfigError, match=r"--rounds, --samples-per-prompt are not for --method"):
        check_method_options("dpo", {"--rounds", "--samples-per-prompt"})
    with pytest.raises(ConfigError, match=r"--beta is not for --method dpo"):
        check_method_options("dpo", {"--beta"})
    with pytest.raises(ConfigError, match=r"--preferences is for --method dpo"):
        check_method_options("rest", {"--preferences"})
    check_method_options("dpo", {"--dpo-beta", "--preferences", "--epochs", "--batch-size"})


def test_train_method_dpo_parses_and_wires(monkeypatch, tmp_path):
    seen: dict = {}

    def stub(task, model, **kw):
        seen.update(kw, task=task, model=model)
        raise SystemExit(0)

    monkeypatch.setattr("selftaught.api.train", stub)
    task, prefs = write_task(tmp_path), write_prefs(tmp_path, pairs(4))
    args = ["train", "--task", str(task), "--method", "dpo", "--preferences", str(prefs)]
    flags = ["--dpo-beta", "0.2", "--epochs", "1", "--batch-size", "2", "--lr", "1e-4"]
    result = CliRunner().invoke(app, [*args, *flags, "--lora-r", "4", "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert isinstance(config, DPOConfig) and seen["method"] == "dpo"
    assert config.beta == 0.2 and config.lr() == 1e-4 and config.max_tokens == 8
    assert config.train.epochs == 1 and config.train.batch_size == 2
    assert config.backend.lora_r == 4 and seen["preferences"] == prefs
    seen.clear()
    result = CliRunner().invoke(app, [*args, "--rounds", "2"])
    assert result.exit_code == 2 and "--rounds is not for --method dpo" in result.output
    assert not seen


def test_dpo_runs_the_one_way_on_a_tiny_model_and_resumes(tmp_path):
    """Fast: a tiny random model trains a DPO adapter on 4 pairs; base (round 0) and adapter
    (round 1) are scored on val and test, the gate's choice ships, the result round-trips,
    callbacks see the run, and a second `train()` resumes without training again."""
    pytest.importorskip("trl")
    from selftaught.results import RunResult
    from selftaught.weights.dpo import DPOResult
    from tests.scripted import ToyTask
    from tests.test_contract import SMALL, Recorder, roundtrip
    from tests.tiny_model import save_tiny_model

    model = f"local:{save_tiny_model(tmp_path / 'tiny')}"
    config = DPOConfig(
        max_tokens=8,
        train=SFTTrainConfig(epochs=1, batch_size=2, max_length=64),
        backend=BackendConfig(lora_r=2, lora_alpha=4),
    )
    prefs = [
        PreferencePair(f"p{i}", [{"role": "user", "content": f"Add {i} and 1."}], f"{i + 1}", "7")
        for i in range(4)
    ]
    recorder = Recorder()
    run = tmp_path / "run"

    def trainer():
        return build_trainer(
            config, ToyTask(**SMALL), model, preferences=prefs, output_dir=run,
            callbacks=[recorder], progress=False,
        )  # fmt: skip

    result = trainer().train()
    assert isinstance(result, DPOResult) and result.method == "dpo" and result.train_pairs == 4
    assert result.best_round in (0, 1) and result.base_test.n == 2
    assert recorder.events[0] == ("start", "dpo") and recorder.events[-1] == ("end",)
    assert ("gate", 1, result.rounds[1].gate.decision) in recorder.events
    assert result.rounds[1].train.steps == 2
    assert (run / "rounds/1/adapter/adapter_config.json").is_file()
    assert type(roundtrip(result)) is DPOResult
    assert type(RunResult.from_dict(result.to_dict())) is DPOResult
    again = trainer().train()
    assert len(again.rounds) == 2 and again.best_round == result.best_round
    assert again.shipped_test.hard == result.shipped_test.hard
    changed = [*prefs[:3], PreferencePair("p9", prefs[0].prompt, "2", "5")]
    with pytest.raises(ConfigError, match=r"different config \(preferences\)"):
        DPOTrainer(config, ToyTask(**SMALL), model, preferences=changed, output_dir=run).train()


@pytest.mark.local
@pytest.mark.slow
def test_dpo_on_the_embedded_model_trains_gates_ships_and_resumes(tmp_path):
    """The real embedded model, tiny sizes: 4 pairs, 2 steps of DPO on a LoRA adapter, base and
    adapter scored on val and test, the gate's choice shipped; the same command again resumes
    (nothing retrained)."""
    pytest.importorskip("trl")
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    task, prefs = write_task(tmp_path), write_prefs(tmp_path, pairs(4))
    run = tmp_path / "run"
    args = ["train", "--task", str(task), "--method", "dpo", "--preferences", str(prefs)]
    small = ["--epochs", "1", "--batch-size", "2", "--lora-r", "4", "--max-tokens", "8"]
    cmd = [*args, *small, "--threads", "2", "--quiet", "--output", str(run)]
    result = CliRunner().invoke(app, cmd)
    assert result.exit_code == 0, result.output
    res = json.loads((run / "result.json").read_text())
    assert res["kind"] == "dpo" and res["method"] == "dpo"
    assert res["base_test"]["n"] == 1 and res["shipped"] in ("base model", "DPO adapter")
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [row["round"] for row in history] == [0, 1]
    trained = history[1]
    assert trained["train_pairs"] == 4 and trained["train"]["steps"] == 2
    assert abs(trained["train"]["loss_first"] - 0.6931) < 1e-2  # policy == reference at first
    assert trained["gate"]["decision"] in ("accept_new_best", "accept", "reject")
    assert (run / "rounds/1/adapter/adapter_config.json").is_file()
    assert len((run / "rounds/1/pairs.jsonl").read_text().splitlines()) == 4
    assert (run / "best" / "best.json").is_file()
    again = CliRunner().invoke(app, cmd)
    assert again.exit_code == 0, again.output
    assert len((run / "history.jsonl").read_text().splitlines()) == 2  # nothing redone
    other = write_prefs(tmp_path, pairs(5), "other.jsonl")
    changed = [*cmd[: cmd.index(str(prefs))], str(other), *cmd[cmd.index(str(prefs)) + 1 :]]
    refused = CliRunner().invoke(app, changed)
    said = " ".join(refused.output.split())  # the console may wrap a long path
    assert refused.exit_code == 2 and "different config (preferences)" in said


def test_a_nights_adapters_train_through_the_trainers_configs(monkeypatch, tmp_path):
    """The night's adapter phase builds `DPOConfig` / `SFTTrainConfig` from its own fields
    (validated at once) and trains DPO through the DPO trainer's `fit`, with the settings it
    used before (beta, DPO rate, the batch capped by the rows, the caps)."""
    from selftaught.sleep.night.weight_night import (
        LocalAdapterTrainer,
        WeightData,
        WeightNightConfig,
    )

    cfg = WeightNightConfig(adapter_max_steps=5, adapter_max_minutes=0.5, dpo_beta=0.3)
    seen: dict = {}

    def fake_fit(self, model, tok, **kw):
        seen.update(model=model, pairs=self.pairs, config=self.config, run=self.run.root, **kw)
        return {"steps": 1}

    monkeypatch.setattr(DPOTrainer, "fit", fake_fit)
    trainer = LocalAdapterTrainer("local", cfg)
    trainer._tok = "tok"
    pair = PreferencePair("e1", [{"role": "user", "content": "q"}], "a", "b")
    data = WeightData(pairs=[pair] * 3)
    assert trainer._train("dpo", "model", data, tmp_path / "dpo") == {"steps": 1}
    config = seen["config"]
    assert isinstance(config, DPOConfig) and config.beta == 0.3 and config.lr() == 5e-5
    assert (config.train.batch_size, config.train.max_steps) == (3, 5)
    assert seen["pairs"] == (pair,) * 3 and seen["run"] == tmp_path / "dpo"
    assert seen["deadline"].minutes == 0.5  # the night's --weight-max-minutes
    assert (config.backend.lora_r, config.backend.lora_alpha) == (8, 16) and config.seed == 0
    assert cfg.sft_config(10).lr_for("lora") == 1e-3  # the night's SFT rate, as before
    with pytest.raises(ConfigError, match="must be a finite number > 0"):
        WeightNightConfig(dpo_beta=0)
    with pytest.raises(ConfigError, match="max_length must be >= 16"):
        WeightNightConfig(max_length=8)


# ---- KTO: thumbs up / down without pairs ---------------------------------------------------


def thumbs(n: int) -> list[dict]:
    """Replies judged one by one: the even ones up, the odd ones down (no pairs)."""
    return [
        {"prompt": f"Say the number {i} as a word.", "completion": f"word {i}" if i % 2 == 0
         else "no", "label": i % 2 == 0}
        for i in range(n)
    ]  # fmt: skip


def test_a_preference_file_holds_pairs_or_thumbs_and_kto_reads_both(tmp_path):
    from selftaught.weights.dpo import Judged

    prefs = read_preferences(write_prefs(tmp_path, [*thumbs(2), *pairs(1)]))
    assert [j.desirable for j in prefs.judged] == [True, False] and len(prefs.pairs) == 1
    unpaired = prefs.unpaired()
    assert [(j.example_id, j.desirable) for j in unpaired] == [
        ("1", True), ("2", False), ("3:chosen", True), ("3:rejected", False)
    ]  # fmt: skip
    assert isinstance(unpaired[0], Judged) and unpaired[2].completion == "word 0"
    for row, message in [
        ({"prompt": "q", "completion": "a", "label": "up"}, r"`label` must be true"),
        ({"prompt": "q", "completion": "a", "label": True, "chosen": "b"}, "not both"),
        ({"prompt": "q", "completion": " ", "label": True}, "`completion` must be"),
    ]:
        with pytest.raises(TaskError, match=message):
            read_preferences(write_prefs(tmp_path, [row], "bad.jsonl"))


def test_kto_needs_thumbs_both_ways_and_dpo_needs_pairs(tmp_path):
    task = JsonlTask(write_task(tmp_path))
    small = SFTTrainConfig(batch_size=2)
    kto = DPOConfig(method="kto", train=small)
    ups = write_prefs(tmp_path, [r for r in thumbs(6) if r["label"]], "ups.jsonl")
    with pytest.raises(ConfigError, match="no reply judged down: KTO learns from thumbs up and"):
        build_trainer(kto, task, "local", preferences=ups, output_dir=tmp_path / "r1")
    mixed = write_prefs(tmp_path, thumbs(4), "mixed.jsonl")
    with pytest.raises(ConfigError, match="DPO trains on pairs.*--method kto trains on thumbs"):
        build_trainer(DPOConfig(train=small), task, "local", preferences=mixed,
                      output_dir=tmp_path / "r2")  # fmt: skip
    trainer = build_trainer(kto, task, "local", preferences=mixed, output_dir=tmp_path / "r3")
    assert type(trainer) is DPOTrainer and trainer.method == "kto"
    check_method(kto, "kto")
    assert default_train_config("kto").method == "kto"
    with pytest.raises(ConfigError, match="KTO's KL term.*--batch-size must be >= 2"):
        DPOConfig(method="kto", train=SFTTrainConfig(batch_size=1))
    with pytest.raises(ConfigError, match="desirable_weight weighs KTO's thumbs"):
        DPOConfig(desirable_weight=2.0)
    check_method_options("kto", {"--preferences", "--desirable-weight"})
    with pytest.raises(ConfigError, match="--desirable-weight is for --method dpo or kto"):
        check_method_options("rest", {"--desirable-weight"})


def test_kto_runs_on_a_tiny_model_without_pairs(tmp_path):
    """Fast: a tiny random model trains a KTO adapter on replies judged one by one; the base
    and the adapter are scored on val and test and the gate's choice ships."""
    pytest.importorskip("trl")
    from selftaught.weights.dpo import DPOResult, Judged
    from tests.scripted import ToyTask
    from tests.test_contract import SMALL
    from tests.tiny_model import save_tiny_model

    model = f"local:{save_tiny_model(tmp_path / 'tiny')}"
    config = DPOConfig(method="kto", max_tokens=8,
                       train=SFTTrainConfig(epochs=1, batch_size=2, max_length=64),
                       backend=BackendConfig(lora_r=2, lora_alpha=4))  # fmt: skip
    judged = [
        Judged(f"j{i}", [{"role": "user", "content": f"Add {i} and 1."}],
               f"{i + 1}" if i % 2 == 0 else "7", i % 2 == 0)
        for i in range(4)
    ]  # fmt: skip
    run = tmp_path / "run"
    result = build_trainer(config, ToyTask(**SMALL), model, preferences=judged, output_dir=run,
                           progress=False).train()  # fmt: skip
    assert isinstance(result, DPOResult) and result.method == "kto"
    assert result.shipped in ("base model", "KTO adapter")
    one = result.rounds[1]
    assert one.train_judged == {"up": 2, "down": 2} and one.train.steps == 2
    assert one.gate is not None and (run / "rounds/1/adapter/adapter_config.json").is_file()
    saved = [json.loads(line) for line in (run / "rounds/1/judged.jsonl").open()]
    assert [s["desirable"] for s in saved] == [True, False, True, False]


@pytest.mark.local
@pytest.mark.slow
def test_kto_on_the_embedded_model_from_thumbs(tmp_path):
    """The real embedded model: `train --method kto` on 4 replies judged one by one (2 up, 2
    down, no pair), 2 steps on a LoRA adapter, gated on val; the adapter or the base ships."""
    pytest.importorskip("trl")
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    task, prefs = write_task(tmp_path), write_prefs(tmp_path, thumbs(4))
    run = tmp_path / "run"
    cmd = ["train", "--task", str(task), "--method", "kto", "--preferences", str(prefs),
           "--epochs", "1", "--batch-size", "2", "--lora-r", "4", "--max-tokens", "8",
           "--threads", "2", "--quiet", "--output", str(run)]  # fmt: skip
    result = CliRunner().invoke(app, cmd)
    assert result.exit_code == 0, result.output
    res = json.loads((run / "result.json").read_text())
    assert res["method"] == "kto" and res["shipped"] in ("base model", "KTO adapter")
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    trained = history[1]
    assert trained["train_judged"] == {"up": 2, "down": 2} and trained["train"]["steps"] == 2
    assert trained["train"]["train_judged"] == 4
    assert trained["gate"]["decision"] in ("accept_new_best", "accept", "reject")
    assert (run / "rounds/1/adapter/adapter_config.json").is_file()
