"""Weight nights: a night trains an adapter on its train tasks and one gate picks text, weights
or both on the same val tasks. Scripted models and a scripted adapter trainer (the adapter's
replies are scripted) for the choice; one slow real-model night on the embedded model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from selftaught.models.base import GenerationParams
from selftaught.sleep.night.cycle import NightConfig, run_night
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import NightTask, SplitOverlap
from selftaught.sleep.night.weight_night import (
    TrainedAdapter,
    WeightData,
    WeightNightConfig,
    train_only_data,
)
from selftaught.sleep.records import TaskChecks, TrainedRecord
from selftaught.weights.dpo import PreferencePair
from selftaught.weights.sampling import Sample
from tests.scripted import (
    ScriptedModel,
    append,
    canned_analyst,
    edits_json,
    rule_answer,
    system_of,
    user_of,
)
from tests.test_sleep_cycle import config, fill_log, models

_NEEDS = re.compile(r"\[needs (\w+)\] What is (\d+) \+ (\d+)\?")


def _question(messages: list[dict]) -> tuple[str, int]:
    rule, a, b = _NEEDS.findall(user_of(messages))[-1]
    return rule, int(a) + int(b)


def always_right(messages: list[dict]) -> str:
    return f"Answer: {_question(messages)[1]}"


def knows_beta(messages: list[dict]) -> str:
    """An adapter that learned the beta tasks; alpha still needs the rule in the prompt."""
    rule, total = _question(messages)
    ok = rule == "beta" or f"rule {rule}" in system_of(messages)
    return f"Answer: {total if ok else total + 1}"


class FakeTrainer:
    """Writes an adapter folder as peft would and serves `replies[method]` as the adapter."""

    def __init__(self, **replies):
        self.replies = replies
        self.calls: list[tuple[str, WeightData]] = []

    def __call__(self, method: str, data: WeightData, out_dir: Path) -> TrainedAdapter:
        self.calls.append((method, data))
        out_dir.mkdir(parents=True)
        (out_dir / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        (out_dir / "adapter_model.safetensors").write_bytes(b"scripted")
        model = ScriptedModel(self.replies[method], f"adapter-{method}")
        trained = TrainedRecord(steps=3, loss_first=2.0).only("steps", "loss_first")
        return TrainedAdapter(method, out_dir, model, trained, "base")


def weight_config(home: Path, weights: str = "sft", **kw) -> NightConfig:
    return config(home, documents=("skill",), weights=weights, **kw)


def splits(night) -> dict[str, set[str]]:
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    out: dict[str, set[str]] = {}
    for r in rows:
        out.setdefault(r["split"], set()).add(r["id"])
    return out


RULE_ALPHA = canned_analyst(failure=edits_json(append("rule alpha")))
MIXED = ["alpha"] * 12 + ["beta"] * 12


def test_weights_win_when_only_the_adapter_helps(tmp_path):
    fill_log(tmp_path, MIXED)
    trainer = FakeTrainer(sft=always_right)
    m = models(analyst=canned_analyst())  # the analyst proposes nothing
    m.adapter_trainer = trainer
    (night,) = run_night(weight_config(tmp_path), models=m)
    assert night.status == "staged", night.reason
    d = night.night_dir
    proposal = night.proposal
    assert proposal.candidate == night.weights.winner == "sft"
    assert not proposal.skill_changed and (d / "proposal" / "skill.md").read_text() == ""
    assert sorted(p.name for p in (d / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not (d / "weights" / "sft" / "adapter").exists()  # moved, not copied
    meta = proposal.adapter
    assert meta.dir == "adapter" and meta.method == "sft"
    assert meta.base_model == "scripted-target" and meta.val.score.hard == 1.0
    split = splits(night)
    assert set(meta.train_items) == split["train"]  # every corrected train task, no other
    assert not set(meta.train_items) & split["val"]
    ((method, data),) = trainer.calls
    assert data.corrections == len(split["train"]) and data.elite == 0
    assert {s.target for s in data.sft} == {str(t) for t in _references(night, "train")}
    cands = night.weights.candidates
    assert set(cands) == {"current", "sft"}  # no text proposal: no text candidates
    assert cands["current"].score.n == cands["sft"].score.n == len(split["val"])
    assert all(len(c.to_dict()["hard_ci"]) == 2 for c in cands.values())  # stored, not derived
    assert night.weights.gates["sft"].decision == "accept_new_best"
    assert "sft won" in night.weights.why
    md = (d / "report.md").read_text()
    assert "## Text or weights" in md and "Winner: **sft**" in md and "### adapter (sft)" in md
    assert "| current |" in md and "| sft |" in md


def test_the_report_says_where_the_nights_time_went(tmp_path):
    fill_log(tmp_path, MIXED)
    m = models(analyst=RULE_ALPHA)
    m.adapter_trainer = FakeTrainer(sft=always_right)
    (night,) = run_night(weight_config(tmp_path), models=m)
    assert night.status == "staged", night.reason
    assert list(night.phase_seconds) == ["mine", "text", "proofread", "weights"]
    assert all(s >= 0 for s in night.phase_seconds.values())
    assert night.phases["skill"].seconds <= night.phase_seconds["text"]
    assert list(night.weights.seconds) == ["replay", "train", "gate"]
    assert sum(night.weights.seconds.values()) <= night.phase_seconds["weights"] + 0.01
    assert sum(night.phase_seconds.values()) <= night.seconds + 0.01
    md = (night.night_dir / "report.md").read_text()
    assert "## Time" in md and "weights " in md and "(replay " in md and "(skill " in md


def test_a_weights_only_night_trains_no_text_and_lets_the_gate_pick_the_adapter(tmp_path):
    fill_log(tmp_path, MIXED)
    analyst = canned_analyst(failure=edits_json(append("rule alpha")))  # would edit the skill
    m = models(analyst=analyst)
    m.adapter_trainer = FakeTrainer(sft=always_right)
    (night,) = run_night(config(tmp_path, documents=(), weights="sft"), models=m)
    assert night.status == "staged", night.reason
    assert not night.phases and not analyst.calls  # no text phase ran
    assert set(night.weights.candidates) == {"current", "sft"}
    assert night.proposal.candidate == "sft"
    with pytest.raises(Exception, match="none only with weights on"):
        NightConfig(documents=())


def _references(night, split: str) -> list[str]:
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    return [r["reference"] for r in rows if r["split"] == split]


def test_text_wins_when_the_adapter_does_not_help(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    m = models(analyst=RULE_ALPHA)
    m.adapter_trainer = FakeTrainer(sft=rule_answer)  # the adapter changed nothing
    (night,) = run_night(weight_config(tmp_path), models=m)
    assert night.status == "staged", night.reason
    w = night.weights
    assert set(w.candidates) == {"current", "text", "sft", "sft+text"}
    assert w.winner == "text" and night.proposal.candidate == "text"
    # sft+text scores as text does: the tie goes to the simpler candidate
    assert w.candidates["sft+text"].score.hard == w.candidates["text"].score.hard == 1.0
    assert w.gates["sft"].decision != "accept_new_best"  # a tie with the adopted one
    assert (night.night_dir / "proposal" / "skill.md").read_text().strip() == "rule alpha"
    assert night.proposal.adapter is None
    assert not (night.night_dir / "adapter").exists()
    assert not list((night.night_dir / "weights").glob("*/adapter"))  # losers deleted


def test_both_win_when_text_and_adapter_each_fix_their_own_tasks(tmp_path):
    fill_log(tmp_path, MIXED)
    m = models(analyst=RULE_ALPHA)
    m.adapter_trainer = FakeTrainer(sft=knows_beta)
    (night,) = run_night(weight_config(tmp_path), models=m)
    val = [r for r in _rows(night) if r["split"] == "val"]
    rules = [_NEEDS.search(r["prompt"]).group(1) for r in val]
    assert rules.count("alpha") >= 2 and rules.count("beta") >= 2  # the fixture's premise
    assert night.status == "staged", night.reason
    w = night.weights
    assert w.winner == "sft+text", w.why
    c = w.candidates
    assert c["sft+text"].score.hard == 1.0 > max(c["text"].score.hard, c["sft"].score.hard)
    assert w.gates["text"].decision == w.gates["sft"].decision == "accept_new_best"
    assert "also passed with less gain" in w.why
    proposal = night.proposal
    assert proposal.skill_changed and proposal.adapter.with_text
    assert (night.night_dir / "proposal" / "skill.md").read_text().strip() == "rule alpha"
    assert (night.night_dir / "adapter" / "adapter_config.json").is_file()
    assert proposal.paired is not None
    assert proposal.paired.wins == len(val) and proposal.paired.losses == 0


def _rows(night) -> list[dict]:
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    for r in rows:
        r["prompt"] = r["prompt_head"]
    return rows


def test_the_gate_keeps_the_adopted_version_when_no_candidate_passes(tmp_path):
    fill_log(tmp_path, MIXED)
    m = models(analyst=canned_analyst())
    m.adapter_trainer = FakeTrainer(sft=rule_answer)
    (night,) = run_night(weight_config(tmp_path), models=m)
    assert night.status == "no_proposal"
    assert "the gate kept the adopted version" in night.reason
    assert "no candidate passed the gate" in night.weights.why
    assert night.proposal is None and not (night.night_dir / "adapter").exists()


def test_auto_also_trains_dpo_on_rejected_replies_and_their_corrections(tmp_path):
    fill_log(tmp_path, MIXED)
    trainer = FakeTrainer(sft=rule_answer, dpo=always_right)
    m = models(analyst=canned_analyst())
    m.adapter_trainer = trainer
    (night,) = run_night(weight_config(tmp_path, "auto"), models=m)
    assert [c[0] for c in trainer.calls] == ["sft", "dpo"]
    data = trainer.calls[1][1]
    train = splits(night)["train"]
    assert len(data.pairs) == len(train) and {p.example_id for p in data.pairs} == train
    for p in data.pairs:  # the user's correction over the reply the user rejected
        _, total = _question(p.prompt)
        assert p.chosen == str(total) and p.rejected == f"Answer: {total + 1}"
    assert night.weights.winner == "dpo" and night.status == "staged"
    assert night.proposal.adapter.method == "dpo"


def test_weights_off_never_trains_and_reports_as_before(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    trainer = FakeTrainer(sft=always_right)
    m = models(analyst=RULE_ALPHA)
    m.adapter_trainer = trainer
    (night,) = run_night(weight_config(tmp_path, "off"), models=m)
    assert trainer.calls == [] and night.weights is None
    assert night.status == "staged" and night.proposal.candidate is None
    assert night.training.weights is None


def test_a_remote_or_scripted_target_without_a_trainer_stays_text_only(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    (night,) = run_night(weight_config(tmp_path), models=models(analyst=RULE_ALPHA))
    assert night.status == "staged" and night.weights is None
    assert any("is not a local model" in n for n in night.notes)


def test_too_little_data_for_one_batch_stays_text_only_and_says_why(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    m = models(analyst=RULE_ALPHA)
    m.adapter_trainer = FakeTrainer(sft=always_right)
    cfg = weight_config(tmp_path, weight_training=WeightNightConfig(adapter_batch_size=64))
    (night,) = run_night(cfg, models=m)
    assert m.adapter_trainer.calls == [] and night.status == "staged"
    assert any("fewer than one batch (64)" in n for n in night.notes)


def _task(tid: str, a: int, b: int) -> MinedTask:
    msgs = [{"role": "user", "content": f"[needs alpha] What is {a} + {b}?"}]
    return MinedTask(tid, msgs, reference=str(a + b), state=TaskChecks(demo_source="correction"))


def test_weight_training_refuses_val_items_and_drops_copies_of_them():
    train, val = _task("t1", 1, 3), _task("v1", 5, 9)
    task = NightTask("p", {"train": [train], "val": [val], "test": []})

    def sample(tid: str, msgs: list) -> Sample:
        return Sample(tid, msgs, msgs, "x", "x", 1.0, 1.0)

    clean = WeightData(sft=[sample("t1", train.messages)], corrections=1)
    assert train_only_data(clean, task) == [] and len(clean.sft) == 1
    with pytest.raises(SplitOverlap, match="not train tasks"):  # a bug: fails closed
        train_only_data(WeightData(sft=[sample("v1", val.messages)]), task)
    copy = _task("t2", 5, 9)  # a train task that is the same item as the val one
    copy.messages[0]["content"] += " Thanks!"
    sibling = _task("t3", 5, 8)  # one template, other values: another item
    leaky = NightTask("p", {"train": [train, copy, sibling], "val": [val], "test": []})
    data = WeightData(
        sft=[sample(t.id, t.messages) for t in (train, copy, sibling)],
        pairs=[PreferencePair("t2", copy.messages, "14", "Answer: 15")],
        corrections=3,
    )
    (dropped,) = train_only_data(data, leaky)
    assert (dropped.item, dropped.held_out, dropped.split, dropped.phase) == (
        "t2",
        "v1",
        "val",
        "weights",
    )
    assert [s.example_id for s in data.sft] == ["t1", "t3"] and data.pairs == []
    assert data.corrections == 2 and data.record().preference_pairs == 0


def test_bad_weight_settings_are_refused_in_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="weights must be one of off, sft, dpo, auto"):
        NightConfig(home=tmp_path, weights="lora")
    with pytest.raises(ValueError, match="max_steps"):
        WeightNightConfig(adapter_max_steps=0)


def test_the_cli_refuses_an_unknown_weights_mode_in_one_sentence(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from selftaught.cli import app

    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))
    result = CliRunner().invoke(app, ["sleep", "run", "--model", "local", "--weights", "lora"])
    assert result.exit_code == 2
    assert "weights must be one of off, sft, dpo, auto" in " ".join(result.output.split())


# ---- the embedded model -----------------------------------------------------------------------


@pytest.fixture
def one_thread(monkeypatch):
    """Training on 2 shared cores: one torch thread is ~5x faster than two spinning ones."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("SELFTAUGHT_THREADS", "1")  # the local model keeps to it too
    yield
    torch.set_num_threads(before)


PROBE = [{"role": "user", "content": "A runner ran 2 km and then 3 km. How far in all?"}]
PROBE_PARAMS = GenerationParams(max_tokens=24, temperature=0)


@pytest.mark.slow  # the embedded model replays ~50 short requests; ~40 s of training
def test_a_weight_night_on_the_embedded_model(tmp_path, one_thread):
    """24 requests whose replies the user corrected to the house style "N km"; a night with the
    embedded model as target and weights "sft": a real peft adapter trained within a 12-step
    cap, scored on the same val as the adopted version, and staged (the folder peft loads back
    onto the base model) or refused by the gate."""
    pytest.importorskip("trl")
    from peft import PeftConfig, PeftModel

    from selftaught.models import load_model
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir
    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
    from selftaught.sleep.night.cycle import NightModels
    from selftaught.sleep.night.weight_night import LocalAdapterTrainer
    from selftaught.weights.sft import load_causal_lm

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    log = TaskLog(tmp_path / "log.db")
    for i in range(24):
        a, b = i % 5 + 1, (3 * i) % 4 + 1
        ask = f"A runner ran {a} km in the morning and {b} km in the evening (day {i + 1}). "
        log.add(
            Interaction(
                messages=[{"role": "user", "content": ask + "How far did she run that day?"}],
                reply=f"She ran a total of {a + b} kilometers that day.",
                project="demo",
                source="proxy",
                feedback=Feedback(thumb="down", reference=f"{a + b} km"),
            )
        )
    log.close()
    target = load_model("local")
    caps = WeightNightConfig(adapter_max_steps=12, adapter_max_minutes=2, max_length=256)
    seen: list[dict] = []

    class Spy(LocalAdapterTrainer):
        def __call__(self, method, data, out_dir):
            adapter = super().__call__(method, data, out_dir)
            files = {p.name for p in out_dir.iterdir()}
            seen.append(
                {
                    "method": method,
                    "files": files,
                    "peft": PeftConfig.from_pretrained(out_dir),
                    "probe": adapter.model.chat(PROBE, PROBE_PARAMS).text,
                }
            )
            return adapter

    models = NightModels(target, "local", canned_analyst(), "local")
    models.adapter_trainer = Spy("local", caps, target)
    config = NightConfig(
        home=tmp_path,
        log_path=tmp_path / "log.db",
        documents=("skill",),
        training=SkillOptConfig(epochs=1, batch_size=8, max_tokens=24, concurrency=4, demos_max=0),
        weights="sft",
        weight_training=caps,
    )
    (night,) = run_night(config, models=models)
    assert night.status in ("staged", "no_proposal"), night.reason
    w = night.weights
    assert [s["method"] for s in seen] == ["sft"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= seen[0]["files"]
    assert seen[0]["peft"].peft_type == "LORA" and seen[0]["peft"].r == 8
    t = w.trained["sft"]
    assert 1 <= t.steps <= 12 and t.loss_last < t.loss_first
    assert w.data is not None and w.data.corrections == night.splits.train
    assert set(w.candidates) == {"current", "sft"}  # the analyst proposed no text
    for c in w.candidates.values():
        s = c.score
        assert s.n == night.splits.val
        assert s.hard_ci[0] <= s.hard <= s.hard_ci[1]
    held_out = {r["id"] for r in _rows(night) if r["split"] != "train"}
    assert held_out and set(w.train_items).isdisjoint(held_out)
    staged = night.night_dir / "adapter"
    if w.winner == "sft":
        assert night.status == "staged" and night.proposal.adapter.base_model == "local"
        base, _ = load_causal_lm(embedded_model_dir())
        assert isinstance(PeftModel.from_pretrained(base, str(staged)), PeftModel)
        _adopt_serve_rollback(tmp_path, target, night, seen[0]["probe"])
    else:
        assert not staged.exists() and "gate kept the adopted version" in night.reason
    assert "## Text or weights" in (night.night_dir / "report.md").read_text()


def _adopt_serve_rollback(home: Path, target, night, trained_reply: str) -> None:
    """The staged adapter adopted and served by the model the proxy and `serve --project`
    use: it answers as the adapter the night trained and gated did; then rolled back to the
    base."""
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.adoption.serving import FollowAdopted

    served = FollowAdopted(target, "demo", home)
    before = served.chat(PROBE, PROBE_PARAMS).text
    staging.adopt("demo", night.night_dir.name, home=home)
    assert served.chat(PROBE, PROBE_PARAMS).text == trained_reply
    assert served.switches == 1 and served.adapter is not None
    staging.rollback("demo", home=home)
    assert served.chat(PROBE, PROBE_PARAMS).text == before and served.switches == 2


def test_a_nights_adapters_are_the_trainers_fit_bit_for_bit(tmp_path, one_thread, monkeypatch):
    """A night's adapters are trained by the trainers `selftaught train` runs, built the one way
    (`build_trainer` on a `RestConfig(method="sft")` and a `DPOConfig`), through their `fit`;
    and they are, bit for bit, what the night trained before it went through the trainers: the
    same rows through `sft_train` / `dpo_train` with the night's settings (a tiny model)."""
    pytest.importorskip("trl")
    import copy

    import torch
    from safetensors.torch import load_file

    from selftaught.models import load_model
    from selftaught.sleep.night.weight_night import LocalAdapterTrainer
    from selftaught.weights import build
    from selftaught.weights.dpo import DPOTrainer, dpo_train
    from selftaught.weights.rest import RestTrainer
    from selftaught.weights.sft import prepare_trainable, save_atomic, sft_train
    from tests.tiny_model import save_tiny_model

    tiny = save_tiny_model(tmp_path / "tiny")
    built: list = []
    real_build = build.build_weight_trainer  # what build_trainer builds weight runs with

    def spy(config, task, model, **kw):
        trainer = real_build(config, task, model, **kw)
        built.append(trainer)
        return trainer

    monkeypatch.setattr(build, "build_weight_trainer", spy)
    cfg = WeightNightConfig(adapter_max_steps=2, adapter_batch_size=2, max_length=64, device="cpu")
    ask = [{"role": "system", "content": "Answer in km."}]
    prompts = [[*ask, {"role": "user", "content": f"{i} km and {i + 1} km?"}] for i in range(4)]
    rows = [(f"t{i}", p, f"{2 * i + 1} km") for i, p in enumerate(prompts)]
    data = WeightData(
        sft=[Sample(i, p, p, a, a, 1.0, 1.0) for i, p, a in rows],
        pairs=[PreferencePair(i, p, a, "Far.") for i, p, a in rows],
    )
    night = LocalAdapterTrainer(f"local:{tiny}", cfg, load_model(f"local:{tiny}", device="cpu"), 3)

    def weights(folder: Path) -> dict:
        return load_file(str(folder / "adapter_model.safetensors"))

    for method in ("sft", "dpo"):
        torch.manual_seed(0)  # the LoRA's initial weights
        trained = night(method, data, tmp_path / "night" / method / "adapter").training
        # the trainer's report, every key typed, in its order; then the adapter it went on from
        assert not trained.extra and list(trained.to_dict())[-1] == "continued_from"
        counted = trained.train_samples if method == "sft" else trained.train_pairs
        assert trained.steps == 2 and counted == 4 and trained.continued_from is None
        base, tok = night._base, night._tok  # the target's weights, read once
        torch.manual_seed(0)
        model = prepare_trainable(copy.deepcopy(base), cfg.backend_config())
        if method == "sft":
            sft_train(model, tok, data.sft, cfg.sft_config(4), backend="lora", seed=3,
                      progress=False)  # fmt: skip
        else:
            dpo = cfg.dpo_config(4)
            dpo_train(model, tok, data.pairs, dpo.train, beta=dpo.beta, learning_rate=dpo.lr(),
                      seed=3)  # fmt: skip
        save_atomic(model, tmp_path / "before" / method)
        got = weights(tmp_path / "night" / method / "adapter")
        want = weights(tmp_path / "before" / method)
        assert got.keys() == want.keys() and got
        assert all(torch.equal(got[k], want[k]) for k in want), method
    assert [type(t) for t in built] == [RestTrainer, DPOTrainer]
    assert built[0].config.method == "sft" and built[0].config.sft == cfg.sft_config(4)
    assert built[1].config.beta == cfg.dpo_beta and built[1].pairs == tuple(data.pairs)
