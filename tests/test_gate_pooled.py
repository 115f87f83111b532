"""The pooled val (issue 52, `--pooled-val`): the gate reads val plus a held-out pool split from
train, one look, with the power of each stated; the pool never feeds what is learned; off by
default and refused in nights unless allowed."""

from __future__ import annotations

import json

import pytest

from selftaught.demos import Demo, DemoLeakError, join_skill
from selftaught.errors import ConfigError
from selftaught.gate import GateConfig, pooled_gate
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.pooled_val import check_pool, split_pool
from selftaught.sleep.night.cycle import NightConfig
from tests.scripted import ToyTask, canned_analyst, rule_target, schedule_of_rules, user_of

GATE = GateConfig(margin=1.0, confidence=0.8)  # the skill run's default gate


def scores(prefix: str, ones: int, n: int) -> dict[str, float | None]:
    return {f"{prefix}{i}": float(i < ones) for i in range(n)}


def test_a_gain_too_small_for_val_alone_passes_on_the_pooled_val_with_its_power():
    # 2 val items: no gain can pass there (3 net wins needed: margin > 1 and 2^-w <= 0.2)
    val = (scores("v", 2, 2), scores("v", 0, 2), scores("v", 0, 2))
    pool = (scores("p", 6, 20), scores("p", 1, 20), scores("p", 1, 20))
    alone = pooled_gate(val, ({}, {}, {}), GATE)
    assert alone.result.decision == "accept" and not alone.pooled
    assert alone.power_val.items is None
    both = pooled_gate(val, pool, GATE)
    assert both.pooled and both.result.decision == "accept_new_best"
    assert both.result.reason.startswith("pooled val (2 val + 20 pool items)")
    assert both.result.n_paired == 22 and both.result.gain_vs_best == 7
    assert both.power_pooled.items == 3 and both.power_pooled.n_val == 22
    assert both.to_dict()["power_val"]["items"] is None


def test_a_candidate_val_rejects_is_not_given_a_second_chance_on_the_pool():
    val = (scores("v", 1, 10), scores("v", 3, 10), scores("v", 3, 10))
    pool = (scores("p", 20, 20), scores("p", 0, 20), scores("p", 0, 20))
    verdict = pooled_gate(val, pool, GATE)
    assert verdict.result.decision == "reject" and not verdict.pooled


def test_the_pooled_look_can_also_reject_what_val_alone_would_accept():
    val = (scores("v", 8, 30), scores("v", 3, 30), scores("v", 3, 30))  # +5 on val
    pool = (scores("p", 0, 40), scores("p", 8, 40), scores("p", 8, 40))  # -8 on the pool
    assert pooled_gate(val, ({}, {}, {}), GATE).result.decision == "accept_new_best"
    assert pooled_gate(val, pool, GATE).result.decision == "reject"


def test_split_pool_is_seeded_disjoint_and_leaves_train():
    train = ToyTask().examples("train")
    rest, pool = split_pool(train, 3, seed=0)
    assert len(pool) == 3 and len(rest) == 5
    assert {e.id for e in rest} | {e.id for e in pool} == {e.id for e in train}
    assert [e.id for e in split_pool(train, 3, seed=0)[1]] == [e.id for e in pool]
    with pytest.raises(ConfigError, match="pooled_val 8"):
        split_pool(train, 8, seed=0)


def test_an_overlap_of_the_pool_with_what_is_learned_fails_closed_naming_it():
    train = ToyTask().examples("train")
    rest, pool = split_pool(train, 3, seed=0)
    check_pool(pool, rest, [])  # clean
    with pytest.raises(DemoLeakError, match=pool[0].id):
        check_pool(pool, [*rest, pool[0]], [])
    copy = Demo.of("mine", pool[1].input, "Answer: 1", "user")
    with pytest.raises(DemoLeakError, match=pool[1].id):
        check_pool(pool, rest, [copy])


def make(tmp_path, analyst, skill="# Skill\n", **kw):
    config = dict(epochs=1, batch_size=8, demos_max=0, pool=False, screen_size=0)
    config.update(kw)
    return SkillTrainer(
        SkillOptConfig(**config),
        ToyTask(),
        rule_target(),
        analyst,
        skill,
        output_dir=tmp_path,
        progress=False,
    )


def test_off_by_default(tmp_path):
    assert SkillOptConfig().pooled_val == 0
    make(tmp_path, canned_analyst()).train()
    assert not (tmp_path / "pool_cache.json").exists()
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert "pooled_val" not in diag


def test_the_run_gates_on_the_pooled_val_and_the_pool_never_reaches_the_analyst(tmp_path):
    analyst = canned_analyst(failure=schedule_of_rules("Use rule alpha."))
    trainer = make(tmp_path, analyst, pooled_val=3)
    result = trainer.train()
    pool_ids = {ex.id for ex in trainer.scorer.pool_set}
    assert len(pool_ids) == 3 and not pool_ids & {ex.id for ex in trainer.train_set}
    prompts = "\n".join(user_of(m) for m in analyst.calls)
    for ex in trainer.scorer.pool_set:
        assert ex.prompt_text() not in prompts
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert {r["id"] for r in diag["batch"]}.isdisjoint(pool_ids)
    assert diag["pooled_val"]["pooled"] and diag["pooled_val"]["n_pool"] == 3
    assert diag["pooled_val"]["power_pooled"]["n_val"] == 11 + 3
    assert diag["gate"]["reason"].startswith("pooled val (11 val + 3 pool items)")
    cache = json.loads((tmp_path / "pool_cache.json").read_text())
    assert all(set(v) == pool_ids for v in cache.values())
    assert result.val_best.solved > result.val_initial.solved


def test_a_starting_skill_whose_demo_copies_a_pool_item_refuses_to_run(tmp_path):
    _, pool = split_pool(ToyTask().examples("train"), 3, seed=0)
    skill = join_skill("# Skill\n", [Demo.of("mine", pool[0].input, "Answer: 1", "user")])
    with pytest.raises(DemoLeakError, match=pool[0].id):
        make(tmp_path, canned_analyst(), skill=skill, pooled_val=3).train()


def test_a_night_refuses_the_pooled_val_unless_allowed():
    with pytest.raises(ConfigError, match="allow_pooled_val"):
        NightConfig(training=SkillOptConfig(pooled_val=4))
    assert NightConfig(training=SkillOptConfig(pooled_val=4), allow_pooled_val=True)
    assert NightConfig().training.pooled_val == 0
