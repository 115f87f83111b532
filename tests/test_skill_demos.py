"""Demonstrations, the candidate pool and the per-step candidate search (scripted models)."""

from __future__ import annotations

import json
import random
import re

import pytest

from selftaught.demos import (
    Demo,
    DemoLeakError,
    LeakCheck,
    join_skill,
    split_skill,
)
from selftaught.duplicates import item_key, same_item
from selftaught.gate import GateConfig
from selftaught.policy import Policy
from selftaught.runs import RunError
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.demo_search import (
    DemoPool,
    from_references,
    propose_sets,
    shows_work,
    stratified,
    work_steps,
)
from selftaught.skill.pool import Member, merge_pair, pareto_front, pick_parent, top_items
from selftaught.tasks.base import Example
from tests.scripted import ScriptedModel, ToyTask, canned_analyst, user_of

# ---- the demos block ---------------------------------------------------------------------


def test_demos_block_round_trips_and_a_skill_without_one_is_all_rules():
    demos = [
        Demo.of("t1", "What is 2 + 2?", "Answer: 4", "bootstrap"),
        Demo.of("t2", [{"role": "user", "content": "Hi\nthere"}], "Hello", "correction"),
    ]
    text = join_skill("# Skill\n- be brief", demos, "system")
    parts = split_skill(text)
    assert parts.rules == "# Skill\n- be brief"
    assert parts.demos == tuple(demos) and parts.placement == "system"
    assert split_skill("# Skill\n- be brief").demos == ()
    assert join_skill("# Skill", []) == "# Skill"


def test_a_malformed_demo_line_names_its_line():
    text = (
        "rules\n\n<!-- selftaught:demos placement=turns -->\n{}\nnot json\n"
        "<!-- /selftaught:demos -->\n"
    )
    with pytest.raises(RunError, match="line 1"):
        split_skill(text)


class _Plain:
    name, kind, instructions = "plain", "agent", "Be exact."


def test_policy_places_demos_as_turns_or_as_a_system_section():
    demo = Demo.of("t1", "What is 2 + 2?", "Answer: 4", "reference")
    ex = Example("x", "What is 3 + 3?")
    turns = Policy(skill=join_skill("Rules.", [demo], "turns")).messages(_Plain(), ex)
    assert [m["role"] for m in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"] == "Rules." and turns[2]["content"] == "Answer: 4"
    assert turns[1]["content"] == "What is 2 + 2?\n\nBe exact."  # as a real input is shown
    system = Policy(skill=join_skill("Rules.", [demo], "system")).messages(_Plain(), ex)
    assert [m["role"] for m in system] == ["system", "user"]
    assert "## Worked examples" in system[0]["content"] and "Answer: 4" in system[0]["content"]
    # a chat input keeps its own system turn first, the demos after it
    chat = Example("y", [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    msgs = Policy(skill=join_skill("", [demo], "turns")).messages(_Plain(), chat)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"] == "Q\n\nBe exact."


def test_skill_hash_is_unchanged_without_demos_and_covers_them_with():
    plain = Policy(skill="Rules.")
    a = Policy(skill=join_skill("Rules.", [Demo.of("t1", "Q1", "A1", "bootstrap")]))
    b = Policy(skill=join_skill("Rules.", [Demo.of("t1", "Q1", "A2", "bootstrap")]))
    assert len({plain.skill_hash(), a.skill_hash(), b.skill_hash()}) == 3
    assert plain.system_prompt() == a.system_prompt() == "Rules."


# ---- leakage -------------------------------------------------------------------------------


def test_near_duplicates_are_caught_and_different_problems_are_not():
    def near_duplicate(a: str, b: str) -> bool:
        return same_item(item_key(a), item_key(b))

    assert near_duplicate("What is 3 + 4?", "what is 3+4 ?")
    assert near_duplicate(
        "Please compute 17 * 23 for me now", "Could you compute 17 * 23 for me now"
    )
    assert not near_duplicate("What is 3 + 4?", "What is 3 + 5?")
    assert not near_duplicate("Name a color.", "Name a fruit.")
    # the same numbers with another operator or sign are another problem
    assert not near_duplicate("Calculate 5 - 3.", "Calculate ( 5 * 3 ).")
    assert not near_duplicate("Calculate -9 / 1.", "Calculate 9 / 1.")
    # list markers are layout: two syllogisms (reasoning-gym's, one template) share only them
    one = "Consider these statements:\n1. Some teachers are not parents\n2. All parents are "
    two = "Consider these statements:\n1. All adults are grandparents\n2. No grandparents are "
    ask = "\n\nDoes it logically follow that:\n{}?\n(Answer Yes or No)"
    assert not near_duplicate(one + "lawyers" + ask.format("Some lawyers are parents"),
                              two + "fish" + ask.format("Some adults are not fish"))  # fmt: skip
    same = one + "lawyers" + ask.format("Some lawyers are parents")
    assert near_duplicate(same, same.replace("\n1. ", "\n 1) ").lower())
    assert not near_duplicate("1. Add 3 and 4.", "1. Add 3 and 5.")  # numbers still count


def test_leak_check_drops_and_fails_closed_naming_both_items():
    check = LeakCheck([("val", "val-7", "What is 3 + 4?"), ("test", "test-1", "Name a color.")])
    clean = Demo.of("train-1", "What is 5 + 6?", "Answer: 11", "bootstrap")
    leak = Demo.of("train-2", "what is 3+4?", "Answer: 7", "bootstrap")
    kept, leaks = check.filter([clean, leak])
    assert kept == [clean] and leaks[0].why() == "demo train-2 duplicates val item val-7"
    with pytest.raises(DemoLeakError, match="train-2 duplicates val item val-7"):
        check.assert_clean([clean, leak])


def test_a_starting_skill_whose_demo_copies_a_val_input_refuses_to_run(tmp_path):
    task = ToyTask()
    val0 = task.examples("val")[0]
    skill = join_skill("# Skill", [Demo.of("mine", val0.input, "Answer: 1", "reference")])
    trainer = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4),
        task,
        ScriptedModel(lambda m: "Answer: 0"),
        canned_analyst(),
        skill,
        output_dir=tmp_path,
        progress=False,
    )
    with pytest.raises(DemoLeakError, match=f"duplicates val item {val0.id}"):
        trainer.train()
    assert not (tmp_path / "history.jsonl").exists()  # refused before anything ran


# ---- demo candidates -----------------------------------------------------------------------


def test_references_become_demos_only_when_the_scorer_passes_them():
    task = ToyTask()  # its scorer wants "Answer: N": a bare reference fails it
    assert from_references(task, task.examples("train")) == []

    class Wrapped(ToyTask):
        def score(self, output, example):
            return super().score(f"Answer: {output}", example)

    demos = from_references(Wrapped(), Wrapped().examples("train")[:3])
    assert [d.source for d in demos] == ["reference"] * 3


def test_proposed_demo_sets_prefer_bootstrapped_and_never_repeat():
    pool = [Demo.of(f"r{i}", f"q{i}", "a", "reference") for i in range(6)]
    pool += [Demo.of(f"b{i}", f"x{i}", "a", "bootstrap") for i in range(2)]
    tried: set[tuple[str, ...]] = set()
    sets = propose_sets([], pool, 3, 4, random.Random(0), tried)
    assert sets and all(len(s) <= 3 for s, _ in sets)
    assert sets[0][1].startswith("add b")  # the model's own reply first
    fresh = [s for s, why in sets if why.startswith("fresh")][0]
    assert {d.source for d in fresh[:2]} == {"bootstrap"}
    again = propose_sets([], pool, 3, 4, random.Random(0), tried)
    assert not {tuple(d.id for d in s) for s, _ in again} & {
        tuple(d.id for d in s) for s, _ in sets
    }
    parent = list(sets[0][0])
    moves = [why.split()[0] for _, why in propose_sets(parent, pool, 1, 4, random.Random(1), set())]
    assert "add" not in moves and "swap" in moves  # at the cap: no add


def test_at_the_cap_the_first_swap_brings_in_the_best_ranked_demo():
    pool = [
        Demo.of("b1", "Calculate 9 - 1.", "8", "bootstrap"),
        Demo.of("b2", "Calculate 2 * 3 + 10.", "2 * 3 + 10 = 6 + 10 = 16", "bootstrap"),
        Demo.of("b3", "Calculate 5 - 2.", "5 - 2 = 3", "bootstrap"),
    ]
    for seed in range(5):
        at_cap = propose_sets(pool[:1], pool, 1, 4, random.Random(seed), set())
        swaps = [[d.id for d in s] for s, why in at_cap if why.startswith("swap")]
        assert swaps[0] == ["b2"]  # the most worked reply, not the one after it
        below = propose_sets(pool[:1], pool, 2, 4, random.Random(seed), set())
        assert [[d.id for d in s] for s, _ in below[:2]] == [["b1", "b2"], ["b3"]]  # add, swap


def test_demo_sets_take_the_most_worked_replies_before_bare_answers_and_references():
    pool = [
        Demo.of("r1", "Calculate 3 + 4.", "7", "reference"),
        Demo.of("b1", "Calculate 9 - 1.", "8", "bootstrap"),
        Demo.of("b2", "Calculate 2 * 3 + 10.", "2 * 3 + 10 = 6 + 10 = 16", "bootstrap"),
        Demo.of("b3", "Calculate 5 - 2.", "5 - 2 = 3", "bootstrap"),
        Demo.of("b4", "Calculate 8 - 2 - 1.", "8 - 2 - 1 = 6 - 1 = 5", "bootstrap"),
        Demo.of("b5", "Calculate 4 + 4.", "First add 4 and 4.\nSo the answer is 8.", "bootstrap"),
    ]
    assert shows_work("5 - 2 = 3") and shows_work("First add.\nThen 7") and not shows_work("-8")
    steps = [work_steps(r) for r in ("2 * 3 + 1 = 6 + 1 = 7", "First add.\nThen 7", "-8")]
    assert steps == [2, 0, 0]  # lines of prose are not steps
    for seed in range(5):
        sets = propose_sets([], pool, 4, 4, random.Random(seed), set())
        assert sets[0][1] == "add b4 (bootstrap)"  # the most steps, the shorter of two such
        fresh = [s for s, why in sets if why.startswith("fresh")]
        assert [d.id for d in fresh[0]] == ["b4", "b2", "b3", "b5"]  # the first fresh set


def test_on_a_label_task_the_first_fresh_set_gives_each_answer_its_share():
    # the model's own passing replies all say "No"; train's other answer is "Yes"
    pool = [Demo.of(f"b{i}", f"Does it follow ({i})?", "No", "bootstrap") for i in range(5)]
    pool += [Demo.of(f"r{i}", f"Does it hold ({i})?", "Yes.", "reference") for i in range(11)]
    for seed in range(5):
        sets = propose_sets([], pool, 4, 4, random.Random(seed), set())
        shared = [s for s, why in sets if why == "stratified set of 4"][0]
        assert [d.reply for d in shared] == ["No", "Yes.", "Yes.", "Yes."]  # 5:11 of 4 slots
        plain = propose_sets([], pool, 4, 4, random.Random(seed), set(), stratify=False)
        fresh = [s for s, why in plain if why.startswith("fresh")][0]
        assert [d.reply for d in fresh] == ["No"] * 4  # what it replaces: one answer only
    yes_no = [Demo.of("a", "q1", "yes", "reference"), Demo.of("b", "q2", "Yes!", "bootstrap")]
    assert stratified(yes_no, 4) is None  # one answer, case and punctuation aside
    free_text = [Demo.of(f"w{i}", f"q{i}", f"a, b{i}", "bootstrap") for i in range(5)]
    assert stratified(free_text, 4) is None  # more answers than slots: the ranked top stays


def test_later_rounds_offer_random_sets_once_the_first_moves_were_tried():
    pool = [Demo.of(f"b{i}", f"q{i}", "x" * (i + 1), "bootstrap") for i in range(6)]
    tried: set[tuple[str, ...]] = set()
    first = propose_sets([pool[0]], pool, 3, 4, random.Random(0), tried)
    later = propose_sets([pool[0]], pool, 3, 4, random.Random(0), tried)
    assert len(first) == len(later) == 4  # new sets still come after the first four
    keys = [tuple(d.id for d in s) for s, _ in first + later]
    assert len(set(keys)) == len(keys)
    rank = {d.id: i for i, d in enumerate(pool)}  # here the ranking is the pool's order
    for demos, why in first + later:
        assert 1 <= len(demos) <= 3
        if why.startswith("random"):  # drawn from the better half, kept in ranked order
            assert [rank[d.id] for d in demos] == sorted(rank[d.id] for d in demos)
            assert all(rank[d.id] < 3 for d in demos)


def test_demo_pool_prefers_the_models_own_reply_and_records_leaks():
    check = LeakCheck([("val", "v1", "What is 3 + 4?")])
    pool = DemoPool()
    pool.add([Demo.of("t1", "q", "7", "reference")], check)
    pool.add([Demo.of("t1", "q", "Answer: 7", "bootstrap")], check)
    pool.add([Demo.of("t2", "What is 3 + 4?", "7", "bootstrap")], check)
    assert pool.demos["t1"].source == "bootstrap" and "t2" not in pool.demos
    assert DemoPool.from_dict(json.loads(json.dumps(pool.to_dict()))).leaks == pool.leaks


# ---- the pool ------------------------------------------------------------------------------


def test_pareto_front_keeps_per_item_winners_and_drops_the_dominated():
    a = Member("a", {"1": 1, "2": 1, "3": 0, "4": 0})
    b = Member("b", {"1": 0, "2": 0, "3": 1, "4": 0})
    c = Member("c", {"1": 1, "2": 0, "3": 0, "4": 0})  # dominated by a
    d = Member("d", {"1": 1, "2": 1, "3": 0, "4": 0})  # a's twin, later: dropped
    assert [m.version for m in pareto_front([a, b, c, d])] == ["a", "b"]
    assert top_items([a, b])["b"] == {"3"}
    draws = [pick_parent([a, b, c], random.Random(s)).version for s in range(400)]
    assert set(draws) == {"a", "b"} and 200 < draws.count("a") < 330  # weight 2:1
    assert merge_pair([a, b, c]) == (a, b)
    assert merge_pair([a, c]) is None  # one front member: nothing to merge


def test_with_no_item_solved_the_front_is_the_first_member():
    z = [Member("x", {"1": 0}), Member("y", {"1": 0})]
    assert [m.version for m in pareto_front(z)] == ["x"]


# ---- the trainer: demos win where rules cannot ---------------------------------------------

_Q = re.compile(r"\[needs (\w+)\] what is (\d+) ?\+ ?(\d+)\?", re.I)


def format_learner(messages):
    """Knows the 'Answer: N' format for alpha questions; for any other question only when a
    prior assistant turn (a demo) shows it. Rules in the system prompt change nothing."""
    last_user = [m for m in messages if m["role"] == "user"][-1]["content"]
    m = _Q.search(last_user)
    if m is None:
        return "?"
    total = int(m.group(2)) + int(m.group(3))
    shown = any(
        x["role"] == "assistant" and x["content"].startswith("Answer:") for x in messages[:-1]
    )
    return f"Answer: {total}" if m.group(1) == "alpha" or shown else str(total)


def test_a_bootstrapped_demo_set_is_found_gated_and_shipped(tmp_path):
    target = ScriptedModel(format_learner, "format-learner")
    trainer = SkillTrainer(
        SkillOptConfig(
            epochs=1, batch_size=8, demos_max=2, screen_size=4, gate=GateConfig(), pool=True
        ),
        ToyTask(),
        target,
        canned_analyst(),  # proposes nothing: only demos can help
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    )
    result = trainer.train()
    # val: 5 alpha of 11 solved at first; with one demo all 11
    assert result.val_initial.solved == 5 and result.val_best.solved == 11
    assert result.test.best.hard == 1.0 and result.test.initial.solved == 5
    train_ids = {e.id for e in ToyTask().examples("train")}
    assert result.best_demos and all(d["id"] in train_ids for d in result.best_demos)
    assert {d["source"] for d in result.best_demos} == {"bootstrap"}
    row = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()][1]
    assert row["gate"]["decision"] == "accept_new_best"
    kinds = [c["kind"] for c in row["candidates"]]
    assert kinds == ["demos", "demos"] and sum(c["chosen"] for c in row["candidates"]) == 1
    assert all(c["screen"] is not None for c in row["candidates"])  # screened first
    assert row["demos"]["pool"] == 6  # the six alpha train replies passed
    shipped = split_skill((tmp_path / "best_skill.md").read_text())
    assert shipped.demos and shipped.placement == "turns"
    # screening spent 4 val items per candidate, full val only for the one that went on
    val_calls = sum(1 for call in target.calls if "1000" <= _num(call) < "2000")
    assert val_calls == 11 + 4 + 4 + (11 - 4)


def _num(messages) -> str:
    m = _Q.search(user_of(messages[-1:]))
    return m.group(2).zfill(4) if m else ""


def test_a_train_item_reworded_from_val_never_becomes_a_demo(tmp_path):
    class Reworded(ToyTask):
        def __init__(self):
            super().__init__()
            val0 = self.splits["val"][0]  # "[needs alpha] What is 1000 + 3?"
            self.splits["train"][0] = Example(
                "train-copy", val0.input.lower().replace(" + ", "+"), val0.reference, val0.state
            )

    trainer = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8, demos_max=2, screen_size=4, gate=GateConfig()),
        Reworded(),
        ScriptedModel(format_learner),
        canned_analyst(),
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    )
    result = trainer.train()
    pool = json.loads((tmp_path / "demo_pool.json").read_text())
    assert "train-copy" not in {d["id"] for d in pool["demos"]}
    assert pool["leaks"] == [{"demo_id": "train-copy", "held_out_id": "val-000", "split": "val"}]
    assert "train-copy" not in {d["id"] for d in result.best_demos}


def demo_hater(messages):
    """Right without demos, wrong with any: every demo set is screened out."""
    m = _Q.search([x for x in messages if x["role"] == "user"][-1]["content"])
    if m is None:
        return "?"
    wrong = any(x["role"] == "assistant" for x in messages[:-1])
    return f"Answer: {int(m.group(2)) + int(m.group(3)) + wrong}"


def test_a_demo_set_screened_out_is_not_proposed_again(tmp_path):
    target = ScriptedModel(demo_hater)
    config = SkillOptConfig(
        epochs=3, batch_size=8, proposals=0, demos_max=2, screen_size=4, gate=GateConfig()
    )
    SkillTrainer(
        config,
        ToyTask(),
        target,
        canned_analyst(),
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    rows = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()][1:]
    assert len(rows) == 3 and all(r["gate"]["decision"] == "reject" for r in rows)
    proposed = [tuple(c["demos"]) for r in rows for c in r["candidates"]]
    assert len(proposed) == 6 and len(set(proposed)) == 6  # two new sets every step
    assert all(c["screen"] == 0.0 and c["val"] is None for r in rows for c in r["candidates"])


def test_demo_search_alone_never_calls_an_analyst(tmp_path):
    analyst = canned_analyst()
    result = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8, proposals=0, screen_size=4, gate=GateConfig()),
        ToyTask(),
        ScriptedModel(format_learner),
        analyst,
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    assert analyst.calls == [] and result.val_best.solved == 11
    assert result.usage.get("optimizer", {}).get("calls", 0) == 0
    with pytest.raises(ValueError, match="nothing to learn"):
        SkillOptConfig(proposals=0, demos_max=0)
