"""ReST-EM loop on a tiny random model: the best round on val is shipped (not the last), a
run that never improves ships the base model, and a killed run resumes without redoing a
finished round. Also the scratch backend on the grid game."""

from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.errors import ConfigError  # noqa: E402
from selftaught.evaluation import summarize  # noqa: E402
from selftaught.rollout import Rollout  # noqa: E402
from selftaught.runs import read_json  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402
from selftaught.weights import rest as rest_mod  # noqa: E402
from selftaught.weights.config import BackendConfig, RestConfig, SFTTrainConfig  # noqa: E402
from selftaught.weights.rest import RestTrainer  # noqa: E402
from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer  # noqa: E402


class EchoTask:
    """Every reply is 'solved', so the elite is never empty; ids differ per split."""

    name = "test:echo"
    kind = "agent"
    instructions = "Answer."

    def examples(self, split):
        return [Example(f"{split}-{i}", f"{split} question {i}?", reference="x") for i in range(4)]

    def score(self, output, example):
        return Score(1.0, 1.0, "ok")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = scratch_tokenizer()
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=1, scratch_width=32, scratch_heads=2), seed=0
    )
    d = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def config(rounds: int) -> RestConfig:
    return RestConfig(
        rounds=rounds,
        samples_per_prompt=2,
        max_tokens=4,
        keep_truncated=True,  # a random model never stops
        sft=SFTTrainConfig(epochs=1, batch_size=2, learning_rate=5e-2),
        backend=BackendConfig(lora_r=2, lora_alpha=4),
    )


def scripted_eval(monkeypatch, val_by_round: list[float]):
    """Replace evaluation by scripted val accuracies per round, per example: accuracy a
    solves the first a*4 of the 4 examples (so better rounds solve supersets); test follows
    the last val."""
    calls = {"val": 0}

    def fake(self, model, r, split):
        if split == "val":
            acc = val_by_round[calls["val"]]
            calls["val"] += 1
        else:
            acc = val_by_round[max(0, calls["val"] - 1)]
        rollouts = [
            Rollout(f"{split}-{i}", [], "x", score=Score(float(i < acc * 4), float(i < acc * 4)))
            for i in range(4)
        ]
        return summarize(rollouts, task="t", model="m", split=split, wall_s=0.0, skill_hash="")

    monkeypatch.setattr(RestTrainer, "_eval", fake)
    return calls


def weights(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).state_dict()


def test_best_round_on_val_is_shipped_not_the_last(tiny_dir, tmp_path, monkeypatch):
    from tests.test_contract import Recorder

    scripted_eval(monkeypatch, [0.25, 0.75, 0.5])
    recorder = Recorder()
    trainer = RestTrainer(
        config(2),
        EchoTask(),
        tiny_dir,
        output_dir=tmp_path / "run",
        callbacks=[recorder],
        progress=False,
    )
    result = trainer.train()
    assert result.best_round == 1
    # every round reaches the callbacks: scored, gated, then done
    assert recorder.events == [
        ("start", "rest"),
        ("evaluate", 0, "val", "base"),
        ("evaluate", 0, "test", "base"),
        ("evaluate", 1, "val", "candidate"),
        ("gate", 1, "accept_new_best"),
        ("step", 1),
        ("evaluate", 2, "val", "candidate"),
        ("gate", 2, "reject"),
        ("step", 2),
        ("end",),
    ]
    assert recorder.results == [result] and result.run_dir == tmp_path / "run"
    assert read_json(tmp_path / "run" / "best" / "best.json")["round"] == 1
    history = trainer.run.history()
    assert [h["round"] for h in history] == [0, 1, 2]
    assert all(h["trained"] for h in history[1:])
    # the gate decided: round 1 gained 2 of 4 val items (a new best), round 2 lost one
    assert [h["gate"]["decision"] for h in history[1:]] == ["accept_new_best", "reject"]
    # best/ holds exactly round 1's weights (base + round-1 adapter), not round 2's
    shipped = weights(tmp_path / "run" / "best")
    r1 = trainer._round_model(1).state_dict()
    r2 = trainer._round_model(2).state_dict()
    assert all(torch.allclose(shipped[k], r1[k], atol=1e-6) for k in r1)
    assert any(not torch.allclose(shipped[k], r2[k], atol=1e-6) for k in r2)
    samples = (tmp_path / "run" / "rounds" / "1" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 4 * 2 and '"messages"' in samples[0]
    assert result.to_dict()["shipped"] == "round 1"


def test_run_that_never_improves_ships_the_base(tiny_dir, tmp_path, monkeypatch):
    scripted_eval(monkeypatch, [0.5, 0.5, 0.25])
    result = RestTrainer(
        config(2), EchoTask(), tiny_dir, output_dir=tmp_path / "run", progress=False
    ).train()
    assert result.best_round == 0
    assert result.shipped_test == result.base_test
    base = weights(tiny_dir)
    shipped = weights(tmp_path / "run" / "best")
    assert all(torch.equal(base[k], shipped[k]) for k in base)
    assert read_json(tmp_path / "run" / "result.json")["shipped"] == "base model"


def test_killed_run_resumes_without_redoing_a_round(tiny_dir, tmp_path, monkeypatch):
    scripted_eval(monkeypatch, [0.25, 0.5, 0.75, 0.75])
    real_train = rest_mod.sft_train
    sampled_rounds: list[str] = []
    real_samples = RestTrainer._samples

    def counting_samples(self, model, r, source_round):
        sampled_rounds.append(r)
        return real_samples(self, model, r, source_round)

    def dies_in_round_2(*args, **kwargs):
        if 2 in sampled_rounds:
            raise KeyboardInterrupt("killed")
        return real_train(*args, **kwargs)

    monkeypatch.setattr(RestTrainer, "_samples", counting_samples)
    monkeypatch.setattr(rest_mod, "sft_train", dies_in_round_2)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        RestTrainer(config(2), EchoTask(), tiny_dir, output_dir=run, progress=False).train()
    assert read_json(run / "state.json")["completed_round"] == 1
    monkeypatch.setattr(rest_mod, "sft_train", real_train)
    sampled_rounds.clear()
    result = RestTrainer(config(2), EchoTask(), tiny_dir, output_dir=run, progress=False).train()
    assert sampled_rounds == [2]  # round 1 was not redone
    assert [
        h["round"] for h in RestTrainer(config(2), EchoTask(), output_dir=run).run.history()
    ] == [0, 1, 2]
    assert result.best_round == 2
    # a resume with other settings is refused

    with pytest.raises(ConfigError, match="different config"):
        RestTrainer(config(3), EchoTask(), tiny_dir, output_dir=run, progress=False).train()


def test_continued_rounds_leave_the_loaded_base_untouched(tiny_dir, tmp_path, monkeypatch):
    """Round 0 samples from the loaded base itself (no copy); training from it, and a resumed
    run rebuilding round 1 on it, work on copies."""
    scripted_eval(monkeypatch, [0.25, 0.5, 0.75])
    cfg = dataclasses.replace(config(2), continue_training=True)
    trainer = RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "run", progress=False)
    trainer.train()
    base = weights(tiny_dir)
    loaded = trainer._base.state_dict()
    assert all(torch.equal(base[k], loaded[k]) for k in base)
    assert trainer._round_model(0) is trainer._base
    rebuilt = trainer._round_model(1).state_dict()  # the adapter merged into a copy
    assert any(not torch.equal(base[k], rebuilt[k]) for k in base)
    assert all(torch.equal(base[k], trainer._base.state_dict()[k]) for k in base)


def test_sampling_fills_the_generation_batch_for_episodes_too(tiny_dir, tmp_path):
    """The rollout's concurrency counts calls: k samples of a one-step prompt are one call of
    k rows, an episode's turn is a call of one row, so episodes need k times the calls."""
    from selftaught.tasks.registry import load_task

    cfg = dataclasses.replace(config(1), gen_batch_size=16, samples_per_prompt=4)
    one_step = RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "a")
    tools = load_task("tool:calculator", train_size=4, val_size=2, test_size=2)
    episodes = RestTrainer(cfg, tools, tiny_dir, output_dir=tmp_path / "b")
    assert one_step._sampling_calls() == 4  # 4 prompts x 4 samples = 16 rows
    assert episodes._sampling_calls() == 16  # 16 episodes, one row each


def test_teacher_skill_is_used_for_sampling_only(tiny_dir, tmp_path, monkeypatch):
    scripted_eval(monkeypatch, [0.25, 0.5])
    cfg = config(1)
    cfg.teacher_skill = "Always answer x."
    RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "run", progress=False).train()
    import json

    rows = [json.loads(line) for line in (tmp_path / "run/rounds/1/samples.jsonl").open()]
    assert rows[0]["messages"][0] == {"role": "system", "content": "Always answer x."}
    assert all(m["role"] != "system" for m in rows[0]["train_messages"])


class TeacherTask(EchoTask):
    """Solved only by the reply `answer <id>`: what a teacher says, never a random student."""

    name = "test:teacher"

    def score(self, output, example):
        right = output.strip() == f"answer {example.id}"
        return Score(float(right), float(right), "ok" if right else "wrong")


def scripted_teacher(monkeypatch):
    """A teacher (resolved from the spec `teacher-spec`) right on the even train prompts; it
    records every prompt it is sent."""
    import re

    from tests.scripted import ScriptedModel, user_of

    def answer(messages):
        m = re.search(r"(\w+) question (\d+)", user_of(messages))
        split, i = m.group(1), int(m.group(2))
        return f"answer {split}-{i}" if i % 2 == 0 else "no idea"

    teacher = ScriptedModel(answer, "teacher-spec")
    resolved = []

    def resolve(spec, **kw):
        resolved.append(spec)
        return teacher

    monkeypatch.setattr(rest_mod, "resolve_model", resolve)
    return teacher, resolved


@pytest.mark.parametrize("method", ["rest", "sft"])
def test_a_teachers_passing_replies_train_the_student(tiny_dir, tmp_path, monkeypatch, method):
    import json

    from tests.scripted import user_of

    scripted_eval(monkeypatch, [0.25, 0.75])
    teacher, resolved = scripted_teacher(monkeypatch)
    trained_on: list[list[str]] = []
    real_train = rest_mod.sft_train

    def train(model, tok, elite, *args, **kwargs):
        trained_on.append(sorted(f"{s.example_id}:{s.target}" for s in elite))
        return real_train(model, tok, elite, *args, **kwargs)

    monkeypatch.setattr(rest_mod, "sft_train", train)
    cfg = dataclasses.replace(config(1), method=method, teacher_model="teacher-spec")
    run = tmp_path / "run"
    result = RestTrainer(cfg, TeacherTask(), tiny_dir, output_dir=run, progress=False).train()
    assert resolved == ["teacher-spec"]
    # the teacher saw train prompts only, k each; never a val or test item
    shown = [user_of(m) for m in teacher.calls]
    assert shown and all(s.startswith("train question") for s in shown)
    rows = [json.loads(line) for line in (run / "rounds/1/samples.jsonl").open()]
    assert {r["completion"] for r in rows} == {"answer train-0", "answer train-2", "no idea"}
    # its passing replies (not the references, not the student's own) trained the student
    assert trained_on == [["train-0:answer train-0", "train-2:answer train-2"]]
    assert all(m["role"] != "system" for r in rows for m in r["train_messages"])
    assert result.usage["teacher"]["calls"] >= 1 and result.best_round == 1  # gated as any


def test_sft_samples_only_with_a_teacher_model():
    from selftaught.cli.train import check_method_options

    check_method_options("sft", {"--teacher-model", "--samples-per-prompt", "--temperature"})
    with pytest.raises(ConfigError, match="sft with --teacher-model"):
        check_method_options("sft", {"--samples-per-prompt"})
    for method in ("grpo", "dpo"):
        with pytest.raises(ConfigError, match="--teacher-model"):
            check_method_options(method, {"--teacher-model"})


def test_teacher_model_samples_no_server():
    with pytest.raises(ConfigError, match="teacher_model samples the teacher"):
        RestConfig(teacher_model="openai:gpt-4o", sampler_url="http://127.0.0.1:8000/v1")


@pytest.mark.slow
def test_scratch_backend_on_the_grid_game(tmp_path):
    from selftaught.tasks.registry import load_task

    task = load_task("game:ctf", seed=0, train_size=8, val_size=4, test_size=4)
    cfg = RestConfig(
        rounds=1,
        samples_per_prompt=4,
        max_tokens=48,
        max_per_prompt=1,
        sft=SFTTrainConfig(epochs=2, batch_size=4),
        backend=BackendConfig(backend="scratch", scratch_layers=1, scratch_width=64),
    )
    result = RestTrainer(cfg, task, output_dir=tmp_path / "run", progress=False).train()
    history = read_json(tmp_path / "run" / "state.json")
    assert history["completed_round"] == 1
    rows = RestTrainer(cfg, task, output_dir=tmp_path / "run").run.history()
    assert rows[0]["model"] == "random strategies"
    assert rows[1]["trained"] and rows[1]["elite"]["kept"] == 8  # one per prompt (top 25% of 4)
    import json

    elite = [json.loads(line) for line in (tmp_path / "run/rounds/1/samples.jsonl").open()]
    assert all(json.loads(s["target"]) for s in elite)  # games train the JSON strategy
    assert (tmp_path / "run" / "rounds" / "1" / "model" / "config.json").exists()
    assert result.base_test.n == 4


def test_sft_method_trains_on_references_in_one_round(tiny_dir, tmp_path, monkeypatch):
    import json

    scripted_eval(monkeypatch, [0.25, 0.75])
    cfg = dataclasses.replace(config(1), method="sft")
    result = RestTrainer(
        cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "run", progress=False
    ).train()
    rows = [json.loads(line) for line in (tmp_path / "run/rounds/1/samples.jsonl").open()]
    assert [r["target"] for r in rows] == ["x"] * 4
    assert result.best_round == 1
    from selftaught.weights.config import ConfigError

    with pytest.raises(ConfigError, match="--rounds must be 1"):
        dataclasses.replace(config(2), method="sft")


class HardTask(EchoTask):
    """Nothing the model writes is ever right: no elite."""

    def score(self, output, example):
        return Score(0.0, 0.0, "wrong")


def test_too_few_elite_samples_stop_the_run_at_once_with_advice(tiny_dir, tmp_path, monkeypatch):
    scripted_eval(monkeypatch, [0.25])
    sampled: list[int] = []
    real_samples = RestTrainer._samples

    def counting(self, model, r, source_round):
        sampled.append(r)
        return real_samples(self, model, r, source_round)

    monkeypatch.setattr(RestTrainer, "_samples", counting)
    trainer = RestTrainer(config(3), HardTask(), tiny_dir, output_dir=tmp_path / "run")
    result = trainer.train()
    assert sampled == [1]  # round 1 only: not rounds 2 and 3 for nothing
    assert result.best_round == 0 and "fewer than one batch" in str(result.stopped_by)
    last = trainer.run.history()[-1]
    assert last["round"] == 1 and not last["trained"] and "easier" in last["advice"]
    written = read_json(tmp_path / "run" / "result.json")["stopped_by"]
    assert written == result.stopped_by.to_dict()


def solved_in_round_one_only(monkeypatch) -> list[int]:
    """Round 1's samples are solved, round 2's none (a round that found nothing new): the
    sizes of what each fine-tune trained on are recorded."""
    real_samples, real_train = RestTrainer._samples, rest_mod.sft_train
    trained_on: list[int] = []

    def samples(self, model, r, source_round):
        got, errors, tools = real_samples(self, model, r, source_round)
        if r > 1:
            got = [dataclasses.replace(s, score=0.0, hard=0.0) for s in got]
        return got, errors, tools

    def train(model, tok, elite, *args, **kwargs):
        trained_on.append(len(elite))
        return real_train(model, tok, elite, *args, **kwargs)

    monkeypatch.setattr(RestTrainer, "_samples", samples)
    monkeypatch.setattr(rest_mod, "sft_train", train)
    return trained_on


def test_a_grown_dataset_trains_each_round_on_every_rounds_elite(tiny_dir, tmp_path, monkeypatch):

    scripted_eval(monkeypatch, [0.25, 0.5, 0.75])
    trained_on = solved_in_round_one_only(monkeypatch)
    cfg = dataclasses.replace(config(2), dataset="grow")
    run = tmp_path / "run"
    result = RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=run, progress=False).train()
    history = RestTrainer(cfg, EchoTask(), output_dir=run).run.history()
    # round 2 solved nothing, yet trains on round 1's elite (per-round elite would stop)
    assert [h["trained"] for h in history[1:]] == [True, True]
    kept = history[1]["elite"]["kept"]
    assert trained_on == [kept, kept]
    assert history[2]["elite"]["kept"] == 0
    assert history[2]["dataset"] == {"kind": "grow", "samples": kept, "new": 0}
    assert result.best_round == 2  # the gate still picks what ships
    monkeypatch.undo()
    scripted_eval(monkeypatch, [0.25, 0.5, 0.75])
    solved_in_round_one_only(monkeypatch)
    per_round = RestTrainer(config(2), EchoTask(), tiny_dir, output_dir=tmp_path / "per-round",
                            progress=False).train()  # fmt: skip
    assert "fewer than one batch" in str(per_round.stopped_by)


def test_a_grown_dataset_is_the_union_of_the_rounds_elite_once_each(
    tiny_dir, tmp_path, monkeypatch
):
    import json

    from selftaught.weights.elite import dedupe_samples, select_elite
    from selftaught.weights.sampling import Sample

    scripted_eval(monkeypatch, [0.25, 0.5, 0.75])
    trained_on: list[list[str]] = []
    real_train = rest_mod.sft_train

    def train(model, tok, elite, *args, **kwargs):
        trained_on.append([f"{s.example_id}:{s.target}" for s in elite])
        return real_train(model, tok, elite, *args, **kwargs)

    monkeypatch.setattr(rest_mod, "sft_train", train)
    cfg = dataclasses.replace(config(2), dataset="grow")
    run = tmp_path / "run"
    RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=run, progress=False).train()
    elite = []
    for r in (1, 2):
        rows = [
            Sample.from_dict(json.loads(line))
            for line in (run / f"rounds/{r}/samples.jsonl").open()
        ]
        elite.append(select_elite(rows, min_score=1.0, max_per_prompt=2, keep_truncated=True)[0])
    union = dedupe_samples(elite[0] + elite[1])
    assert trained_on[0] == [f"{s.example_id}:{s.target}" for s in elite[0]]
    assert trained_on[1] == [f"{s.example_id}:{s.target}" for s in union]
    assert len(union) > len(elite[1])  # round 1's finds are kept
    assert len(set(trained_on[1])) == len(trained_on[1])  # each once


def test_dataset_grow_needs_rest_sampling():
    with pytest.raises(ConfigError, match="dataset 'grow'.*--method rest"):
        RestConfig(method="sft", dataset="grow")
    with pytest.raises(ConfigError, match="dataset must be one of round, grow"):
        RestConfig(dataset="all")


class CrashingScorerTask(EchoTask):
    """The scorer raises on one train prompt: its samples are errors, never 0-scored."""

    def score(self, output, example):
        if example.id == "train-0":
            raise ValueError("bad reference")
        return super().score(output, example)


def test_scorer_errors_are_no_samples_and_are_counted(tiny_dir, tmp_path, monkeypatch):
    scripted_eval(monkeypatch, [0.25, 0.25])
    RestTrainer(config(1), CrashingScorerTask(), tiny_dir, output_dir=tmp_path / "run").train()
    import json

    rows = [json.loads(line) for line in (tmp_path / "run/rounds/1/samples.jsonl").open()]
    assert {r["example_id"] for r in rows} == {"train-1", "train-2", "train-3"}
    history = RestTrainer(
        config(1), CrashingScorerTask(), output_dir=tmp_path / "run"
    ).run.history()
    assert history[1]["sample_errors"] == 2 and history[1]["samples"] == 6


class RightTask(EchoTask):
    """Solved when the reply is 'right'."""

    def score(self, output, example):
        solved = float(output.strip() == "right")
        return Score(solved, solved, "ok" if solved else "wrong")


def vllm_like(**hooks):
    """A scripted vLLM serving `base` with runtime LoRA loading: the base model answers train
    prompts right and val / test prompts wrong, any adapter answers everything right."""
    from tests.fake_upstream import FakeUpstream

    def reply(body, headers):
        asked = body["messages"][-1]["content"]
        return "right" if body["model"] != "base" or "train" in asked else "wrong"

    return FakeUpstream(model="base", chat_reply=reply, strict_models=True, **hooks)


def served_config(url: str) -> RestConfig:
    cfg = config(2)
    cfg.sampler_url = url
    return cfg


def test_rounds_sample_and_evaluate_on_a_vllm_server_each_with_its_checked_adapter(
    tiny_dir, tmp_path
):
    """--sampler-url: round 1 samples the base model on the server, round 2 round 1's
    adapter, loaded once into the running server (vLLM's runtime LoRA API), listed there with
    its folder; every round, round 0 too, is scored there; an
    adapter no later round needs is unloaded, and the run leaves the server as it found it
    (the check of what the server serves under a name: the stale tests below)."""
    with vllm_like() as server:
        trainer = RestTrainer(
            served_config(server.base_url), RightTask(), tiny_dir, output_dir=tmp_path / "run"
        )
        result = trainer.train()
    names = [body["lora_name"] for body in server.lora_loads]
    assert len(names) == 2 and len(set(names)) == 2  # one load per round
    for r, (name, body) in enumerate(zip(names, server.lora_loads, strict=True), start=1):
        assert body["lora_path"] == str((tmp_path / f"run/rounds/{r}/adapter").resolve())
        assert f"round{r}-" in name
    chats = [(c["body"]["model"], c["body"]["messages"][-1]["content"]) for c in server.calls
             if c["path"] == "/v1/chat/completions"]  # fmt: skip
    sampled = [model for model, asked in chats if "train" in asked]
    assert sampled == ["base"] * 4 + [names[0]] * 4  # round 2 samples with round 1's adapter
    val = [model for model, asked in chats if "val" in asked]
    assert val == ["base"] * 4 + [names[0]] * 4 + [names[1]] * 4
    assert result.best_round == 1 and result.shipped_test.hard == 1.0  # scored on the server
    assert result.base_test.hard == 0.0
    assert sorted(server.lora_unloads) == sorted(names) and server.adapters == {}


def test_a_stale_adapter_on_the_sampler_server_stops_the_run_loudly(tiny_dir, tmp_path):
    """The server lists the round's adapter name with another folder (it kept another
    adapter under that name): the run stops with an error naming both, and no request ever
    named the adapter (ART #661: rollouts silently used stale adapters)."""
    from selftaught.models.vllm import StaleAdapter

    with vllm_like(listed_root=lambda name, path: "/old/run/rounds/1/adapter") as server:
        trainer = RestTrainer(
            served_config(server.base_url), RightTask(), tiny_dir, output_dir=tmp_path / "run"
        )
        with pytest.raises(StaleAdapter, match="from /old/run/rounds/1/adapter, not /"):
            trainer.train()
    name = server.lora_loads[0]["lora_name"]
    assert all(
        c["body"]["model"] != name for c in server.calls if c["path"].endswith("/completions")
    )


def test_a_reply_that_did_not_come_from_the_adapter_stops_the_run(tiny_dir, tmp_path):
    """The server lists the adapter but answers requests for it as the base model: a fatal
    error, never round 1's val scored on the base's replies."""
    from selftaught.models.errors import FatalBackendError

    with vllm_like(reply_model=lambda asked: "base") as server:
        trainer = RestTrainer(
            served_config(server.base_url), RightTask(), tiny_dir, output_dir=tmp_path / "run"
        )
        with pytest.raises(FatalBackendError, match="the reply came from 'base'"):
            trainer.train()
    assert len(server.lora_loads) == 1 and not (tmp_path / "run/rounds/2").exists()


def test_sampler_url_needs_lora_from_the_base():
    from selftaught.weights.config import ConfigError

    with pytest.raises(ConfigError, match="needs --backend lora"):
        RestConfig(sampler_url="http://x/v1", continue_training=True)


def test_rounds_are_served_in_the_serving_dtype_and_a_resume_in_another_is_refused(
    tiny_dir, tmp_path, monkeypatch
):
    """`SELFTAUGHT_DTYPE=bfloat16` on a CPU: every round is sampled and scored by a bf16
    copy while the trained weights stay float32; the run records it, and a resume served in
    float32 is refused, naming the setting (its scores would not be comparable)."""
    import torch

    from selftaught.models.local import LocalModel

    monkeypatch.setenv("SELFTAUGHT_DTYPE", "bfloat16")
    served: list[torch.dtype] = []
    wrap = LocalModel.from_pretrained_model

    def spy(model, *args, **kwargs):
        served.append(next(model.parameters()).dtype)
        return wrap(model, *args, **kwargs)

    monkeypatch.setattr(LocalModel, "from_pretrained_model", staticmethod(spy))
    run = tmp_path / "run"
    trainer = RestTrainer(config(1), EchoTask(), tiny_dir, output_dir=run, progress=False)
    trainer.train()
    assert served and set(served) == {torch.bfloat16}  # round 0 and round 1, every call
    assert next(trainer._base.parameters()).dtype == torch.float32  # trained in its own
    assert read_json(run / "config.json")["serving_dtype"] == "bfloat16"

    monkeypatch.setenv("SELFTAUGHT_DTYPE", "float32")
    with pytest.raises(ConfigError, match=r"different config \(serving_dtype\)"):
        RestTrainer(config(1), EchoTask(), tiny_dir, output_dir=run, progress=False).train()


def test_a_round_makes_its_served_copy_once_and_serves_with_it(tiny_dir, tmp_path, monkeypatch):
    """Served in bf16, round 0 copies the base once for val and test, and round 1 samples
    from that same copy, then copies its trained model once for val and test (before: a
    copy per sampling, val and test call). Nothing stays copied while round 1 trains. And
    the copy is what answers: the trained model's forward, patched by the SFT trainer, ran
    the float32 original from every copy of it."""
    from selftaught.models.local import LocalModel

    monkeypatch.setenv("SELFTAUGHT_DTYPE", "bfloat16")
    copies: list[int] = []
    real = rest_mod.served_copy

    def counting(model, dtype):
        copies.append(id(model))
        return real(model, dtype)

    monkeypatch.setattr(rest_mod, "served_copy", counting)
    ran: list[list[torch.dtype]] = []  # per served model: its own embeddings' outputs
    wrap = LocalModel.from_pretrained_model

    def spy(model, *args, **kwargs):
        ran.append([])
        model.get_input_embeddings().register_forward_hook(
            lambda module, inputs, out, mine=ran[-1]: mine.append(out.dtype)
        )
        return wrap(model, *args, **kwargs)

    monkeypatch.setattr(LocalModel, "from_pretrained_model", staticmethod(spy))
    held_while_training: list[bool] = []
    fine_tune = RestTrainer._fine_tune

    def spy(self, *args, **kwargs):
        held_while_training.append(getattr(self, "_serving", None) is not None)
        return fine_tune(self, *args, **kwargs)

    monkeypatch.setattr(RestTrainer, "_fine_tune", spy)
    cfg = dataclasses.replace(config(1), eval_test_each_round=True)
    trainer = RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "run", progress=False)
    trainer.train()
    assert len(copies) == 2 and len(set(copies)) == 2  # the base's, then round 1's
    assert held_while_training == [False]
    assert len(ran) == 5 and all(r and set(r) == {torch.bfloat16} for r in ran), ran
    assert trainer._serving is None  # let go when the run ends
