"""Before a night: `sleep plan` counts what a night would call, and a budget that cannot gate
one candidate is refused before any call.

The plan is checked against the night itself: the same scripted night is planned, then run
with every model call counted under the phase it happened in (the skill and memory phases,
their baselines, the demo modes, leave-one-out, the miner); each count is at most the plan's
(exact for the baselines), and no phase calls what the plan did not count."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from selftaught.api import sleep_night
from selftaught.errors import ConfigError
from selftaught.models.base import AsyncChatModel, ChatModel, Completion, GenerationParams
from selftaught.models.usage import Budget
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.plan import Sizes, merge_calls, reflect_calls, run_calls
from selftaught.skill.trainer import SkillTrainer
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night import consolidate
from selftaught.sleep.night.cycle import (
    NightConfig,
    NightModels,
    night_training_defaults,
    run_night,
)
from selftaught.sleep.night.dream import DreamConfig
from selftaught.sleep.night.phases import proofread as proofread_phase
from selftaught.sleep.night.phases import split as split_phase
from selftaught.sleep.night.plan import EXACT, plan_night
from selftaught.sleep.night.weak import WeakConfig
from tests.scripted import ScriptedModel, append, canned_analyst, edits_json, rule_target

PROJECT = "demo"


def fill_log(home: Path, n: int = 16, unchecked: int = 0) -> None:
    """`n` corrected sums (the operator's reference; rules alpha and beta) and `unchecked`
    rows with only a thumbs-down (no reference: the miner's to check)."""
    log = TaskLog(home / "log.db")
    for i in range(n):
        rule, a, b = ("alpha" if i % 3 else "beta"), i + 1, 7 * i + 3
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"[needs {rule}] What is {a} + {b}?"}],
                reply=f"Answer: {a + b + 1}",
                project=PROJECT,
                source="proxy",
                model="gpt-4o-mini",  # as the proxy logs it
                prompt_tokens=20,
                completion_tokens=4,
                latency_s=0.5,
                feedback=Feedback(thumb="down", reference=str(a + b)),
            )
        )
    for i in range(unchecked):
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"Name a river in country number {i}."}],
                reply="The Thames.",
                project=PROJECT,
                source="proxy",
                feedback=Feedback(thumb="down"),
            )
        )
    log.close()


class Counting(AsyncChatModel):
    """A model whose every call is counted under the night's phase at the time."""

    def __init__(self, inner: ChatModel, role: str, seen: Counter[tuple[str, str]], now: dict):
        self.inner, self.role, self.seen, self.now = inner, role, seen, now
        self.name = inner.name

    async def achat(self, messages, params: GenerationParams) -> Completion:
        self.seen[(self.now["phase"], self.role)] += 1
        return await self.inner.achat(messages, params)


@pytest.fixture
def counted(monkeypatch):
    """(calls by (phase, role), the labeller's state): the night's phases label the calls."""
    seen: Counter[tuple[str, str]] = Counter()
    now = {"phase": "mine"}

    def labelled(fn, label):
        def wrapper(*args, **kwargs):
            before, now["phase"] = now["phase"], label(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                now["phase"] = before

        return wrapper

    monkeypatch.setattr(consolidate, "_phase", labelled(consolidate._phase, lambda d, *a: d))
    monkeypatch.setattr(
        consolidate,
        "choose_demo_mode",
        labelled(consolidate.choose_demo_mode, lambda *a: "demo modes"),
    )
    monkeypatch.setattr(
        proofread_phase,
        "proofread",
        labelled(proofread_phase.proofread, lambda *a, **k: "leave-one-out"),
    )
    monkeypatch.setattr(
        split_phase, "weak_label", labelled(split_phase.weak_label, lambda *a: "weak labels")
    )
    monkeypatch.setattr(split_phase, "dream", labelled(split_phase.dream, lambda *a: "dreams"))
    baseline = SkillTrainer._baseline

    async def labelled_baseline(self, *args):
        before, now["phase"] = now["phase"], f"{self.document}: baseline"
        try:
            return await baseline(self, *args)
        finally:
            now["phase"] = before

    monkeypatch.setattr(SkillTrainer, "_baseline", labelled_baseline)
    return seen, now


def night_models(seen, now, *, miner: bool = False, judge: bool = False) -> NightModels:
    analyst = canned_analyst(failure=edits_json(append("rule alpha")),
                             success=edits_json(append("keep answers short")))  # fmt: skip
    models = NightModels(Counting(rule_target(), "target", seen, now), "scripted-target",
                         Counting(analyst, "optimizer", seen, now), "scripted-analyst")  # fmt: skip
    if miner:
        models.miner, models.miner_spec = Counting(analyst, "miner", seen, now), "scripted-miner"
    if judge:
        grader = ScriptedModel(lambda m: '{"score": 8, "reason": "fine"}', "scripted-judge")
        models.judge, models.judge_spec = Counting(grader, "judge", seen, now), "scripted-judge"
    return models


def night_config(home: Path, night: dict | None = None, **training) -> NightConfig:
    config = dataclasses.replace(night_training_defaults(), **training)
    return NightConfig(home=home, log_path=home / "log.db", project=PROJECT, training=config,
                       **(night or {}))  # fmt: skip


SETTINGS = [
    pytest.param({}, {}, id="defaults"),
    pytest.param(
        dict(
            epochs=2,
            batch_size=4,
            rollouts_k=2,
            proposals=2,
            screen_size=2,
            minibatch_size=2,
            proposal_temperature=0.7,
            max_minibatches=2,
        ),
        {"miner": True, "judge": True},
        id="steps-k2-proposals-screening-miner-judge",
    ),  # fmt: skip
    pytest.param(
        dict(demos_max=0),
        {"night": {"weak": WeakConfig(k=2), "dream": DreamConfig(n=1), "leave_one_out": 2}},
        id="weak-dreams-rules-only",
    ),
]


@pytest.mark.parametrize(("training", "roles"), SETTINGS)
def test_the_plan_bounds_every_phase_of_a_scripted_night(tmp_path, counted, training, roles):
    seen, now = counted
    roles = dict(roles)
    fill_log(tmp_path, unchecked=0 if roles == {} else 3)
    cfg = night_config(tmp_path, roles.pop("night", None), **training)
    (plan,) = plan_night(cfg, models=night_models(seen, now, **roles))
    assert not seen  # planning calls no model
    (night,) = run_night(cfg, models=night_models(seen, now, **roles))
    assert night.status in ("staged", "no_proposal"), night.reason
    report = json.loads((night.night_dir / "report.json").read_text())
    assert plan.tasks.mined == report["mining"]["tasks"]
    split = report["splits"]
    assert (plan.tasks.val, plan.tasks.test) == (split["val"], split["test"])
    t = plan.tasks  # weak and dreamt tasks: at their caps
    assert t.train - t.train_only <= split["train"] <= t.train
    planned: dict[tuple[str, str], tuple[int, str]] = {}
    for p in plan.phases:
        planned[(p.phase, p.role)] = (
            planned.get((p.phase, p.role), (0, p.bound))[0] + p.calls,
            p.bound,
        )
    for key, n in seen.items():
        assert key in planned, f"{key}: {n} calls the plan did not count"
        most, bound = planned[key]
        assert n == most if bound == EXACT else n <= most, (key, n, planned[key])
    assert planned[("skill: baseline", "target")] == (report["splits"]["val"], EXACT)
    assert seen[("skill: baseline", "target")] == report["splits"]["val"]
    assert sum(seen.values()) <= plan.calls
    if roles.get("miner"):
        assert seen[("mine", "miner")] > 0


def test_the_plan_writes_nothing_and_counts_tonights_tasks(tmp_path):
    fill_log(tmp_path)
    cfg = night_config(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    (plan,) = plan_night(cfg, models=night_models(Counter(), {"phase": "mine"}))
    assert sorted(
        p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "log.db" not in p.name
    ) == [p for p in before if "log.db" not in p.name]
    assert plan.tasks.mined == 16 and plan.tasks.by_trust == {"operator": 16}
    assert sum(plan.tasks.by_kind.values()) == 16
    assert plan.smallest_gain is not None and plan.smallest_gain.n_val == plan.tasks.val
    assert plan.power and "val tasks" in plan.power
    assert plan.usd is None and plan.unpriced  # scripted models have no price


def test_a_budget_that_cannot_gate_one_candidate_is_refused_before_any_call(tmp_path):
    fill_log(tmp_path)
    seen: Counter = Counter()
    now = {"phase": "mine"}
    (plan,) = plan_night(night_config(tmp_path), models=night_models(seen, now))
    least = plan.minimum.calls
    val = plan.tasks.val
    assert least >= 2 * val + 1  # the starting skill and one candidate on val, a train step
    short = night_config(tmp_path, budget=Budget(calls=least - 1))
    with pytest.raises(ConfigError, match=rf"--budget-calls {least - 1} .*at least {least} calls"):
        sleep_night(short, model=night_models(seen, now))
    assert not seen  # refused before any call
    assert not staging.list_nights(PROJECT, tmp_path)  # and before the night's folder
    (night,) = sleep_night(night_config(tmp_path, budget=Budget(calls=least)),
                           model=night_models(seen, now))  # fmt: skip
    assert sum(seen.values()) > 0 and night.status != "failed"


def test_usd_and_time_come_from_the_price_table_and_the_logged_latency(tmp_path):
    fill_log(tmp_path)  # 20 prompt and 4 reply tokens a row, 0.5 s each
    cfg = dataclasses_replace_models(night_config(tmp_path), "openai:gpt-4o-mini")
    (plan,) = plan_night(cfg)
    base = next(p for p in plan.phases if p.phase == "skill: baseline")
    assert (base.calls, base.tokens_in, base.tokens_out) == (4, 4 * 20, 4 * 4)
    assert base.usd == pytest.approx((80 * 0.15 + 16 * 0.60) / 1e6)  # gpt-4o-mini's rates
    assert base.seconds == 0.5  # 4 calls, 8 at a time, 0.5 s each
    assert plan.usd is not None and plan.seconds is not None and not plan.unpriced
    assert plan.minimum.usd and plan.usd >= plan.minimum.usd
    short = night_config(tmp_path, budget=Budget(usd=plan.minimum.usd / 2))
    (refused,) = plan_night(dataclasses_replace_models(short, "openai:gpt-4o-mini"))
    assert refused.refusal and "--budget-usd" in refused.refusal


def dataclasses_replace_models(cfg: NightConfig, spec: str) -> NightConfig:
    return dataclasses.replace(cfg, model=spec, miner_model="off")


# ---- the trainer's counts -------------------------------------------------------------------


def test_merges_and_reflections_are_counted_as_the_trainer_makes_them():
    assert [merge_calls(n, 8) for n in (0, 1, 2, 8, 9, 16, 17, 65)] == [0, 0, 1, 1, 2, 3, 3, 10]
    cfg = SkillOptConfig(minibatch_size=8, max_minibatches=4)
    assert reflect_calls(0, 2, cfg) == 0 and reflect_calls(3, 2, cfg) == 2
    assert reflect_calls(40, 2, cfg) == 6 and reflect_calls(200, 2, cfg) == 8


def test_screening_spends_the_subset_on_all_and_the_rest_on_the_kept():
    cfg = SkillOptConfig(epochs=1, batch_size=10, proposals=3, demos_max=0, screen_size=10,
                         screen_keep=1, evaluate_test=False)  # fmt: skip
    run = run_calls(cfg, Sizes(10, 30), demos_on=False)
    assert run.steps == 1 and run.candidates_per_step == 3
    assert run.baseline == 30 and run.candidates == 3 * 10 + 1 * 20
    judged = run_calls(cfg, Sizes(10, 30), demos_on=False, counted=Sizes(2, 5))
    assert judged.baseline == 5 and judged.candidates == 3 * 5 + 5 and judged.analyst == 0


def test_a_local_models_time_is_its_tokens_at_this_machines_raw_rate(tmp_path):
    from selftaught.errors import MissingDependency
    from selftaught.models.raw_rate import RawRate

    fill_log(tmp_path)  # replies of 4 tokens
    cfg = dataclasses.replace(night_config(tmp_path), model="local", miner_model="off",
                              weights="sft")  # fmt: skip
    measured: list[str] = []

    def rate_of(spec: str) -> RawRate:
        measured.append(spec)
        return RawRate(tokens=800, seconds=10.0, batch=8)  # 80 tok/s

    (plan,) = plan_night(cfg, rate_of=rate_of)
    assert measured == ["local"]  # once, for every role the embedded model plays
    base = next(p for p in plan.phases if p.phase == "skill: baseline")
    assert base.seconds == pytest.approx(base.tokens_out / 80) and base.usd == 0.0
    assert any(p.phase == "weights" for p in plan.phases)  # a local target trains an adapter
    assert "80.0 tok/s" in plan.timing and plan.usd == 0.0

    def missing(spec: str) -> RawRate:
        raise MissingDependency("the local extra is not installed")

    (plan,) = plan_night(cfg, rate_of=missing)
    assert plan.seconds is None and any("not measured" in n for n in plan.notes)


def test_a_night_without_val_plans_no_val_replay_and_says_the_gate_is_off(tmp_path):
    fill_log(tmp_path)
    cfg = dataclasses.replace(night_config(tmp_path), val_split=False)
    (plan,) = plan_night(cfg, models=night_models(Counter(), {"phase": "mine"}))
    assert (plan.tasks.train, plan.tasks.val) == (16, 0)
    assert "leave-one-out" not in {p.phase for p in plan.phases}  # the gate is off
    assert next(p for p in plan.phases if p.phase == "skill: baseline").calls == 0
    assert plan.smallest_gain.items == 0 and "gate is off" in plan.power
