"""Dreams: synthetic variants of train tasks (new numbers with the answer recomputed, or the
analyst's paraphrases), train only, capped, left out when they copy a val or test task, never
recalled, never a demonstration made of an end user's evidence."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import pytest

from selftaught.demos import split_skill
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.night.dream import (
    DreamConfig,
    dream,
    find_relation,
    refused,
    renumber,
)
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import train_only
from selftaught.sleep.records import TaskChecks
from selftaught.tasks.scorers import parse_number, reference_scorer
from tests.scripted import ScriptedModel, user_of
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models


def task(text: str, reference: str | None, tid: str = "t-1", **state) -> MinedTask:
    checks = {"rules": [], **state}
    if reference is not None:
        checks["scorer"] = reference_scorer(reference)
    return MinedTask(
        tid, [{"role": "user", "content": text}], reference, TaskChecks.from_dict(checks)
    )


_OPERAND = re.compile(r"(?<![\w.,])\d+(?:\.\d+)?(?!\w|[.,]\d)")
OPS = {
    "sum": lambda xs: sum(xs),
    "difference": lambda xs: xs[0] - sum(xs[1:]),
    "product": lambda xs: xs[0] * xs[1] if len(xs) == 2 else xs[0] * xs[1] * xs[2],
    "quotient": lambda xs: xs[0] / xs[1],
}


@pytest.mark.parametrize(
    ("text", "reference", "op", "kept"),
    [
        ("What is 12 + 30?", "42", "sum", ""),
        ("I had 50 apples and ate 8. How many are left?", "42", "difference", ""),
        ("A box holds 6 rows of 7 eggs each. How many eggs?", "42", "product", ""),
        ("84 sweets are shared equally by 2 children. How many each?", "42", "quotient", ""),
        ("A train goes 60 km, then 25 km. How far in total?", "85 km", "sum", " km"),
        ("What is 2.5 + 1.25?", "3.75", "sum", ""),
        ("What is 3 + 4? Answer in under 20 words.", "7", "sum", ""),
        ("Multiply 6 by 7.", "$42", "product", ""),
    ],
)
def test_renumbered_variants_have_their_answer_recomputed(text, reference, op, kept):
    source = task(text, reference)
    rel = find_relation(source)
    assert rel is not None and rel.op == op
    for seed in range(10):
        made = renumber(source, rel, random.Random(seed), tries=20)
        assert made is not None
        messages, new_ref = made
        prompt = messages[-1]["content"]
        assert prompt != text and kept in prompt and kept in new_ref
        numbers = [Decimal(x) for x in _OPERAND.findall(prompt)]
        if "words" in text:  # the rule's own number is kept as it was
            assert prompt.endswith("Answer in under 20 words.")
            numbers = numbers[:-1]
        assert parse_number(new_ref) == pytest.approx(float(OPS[op](numbers)))
        assert new_ref.startswith("$") == reference.startswith("$")
        assert reference_scorer(new_ref) == source.state.scorer
        if op == "difference":
            assert parse_number(new_ref) >= 0  # a difference keeps its sign


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("What is 2 + 2?", "4"),  # sum and product agree: which one is unknown
        ("What is 7 + 5?", "13"),  # no relation gives it
        ("What is 1,000 + 5?", "1005"),  # a thousands separator
        ("What is -3 + 5?", "2"),  # a negative number
        ("Is 3 more than 4?", "No"),  # not a number
        ("I have 3 cats and 4 dogs.", "7"),  # no word or sign names the sum
    ],
)
def test_no_relation_no_renumbering(text, reference):
    assert find_relation(task(text, reference)) is None


def test_a_multi_turn_or_weak_task_is_not_renumbered():
    convo = task("What is 12 + 30?", "42")
    convo.messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        *convo.messages,
    ]
    assert find_relation(convo) is None
    assert find_relation(task("What is 12 + 30?", "42", weak={"agreement": 1.0})) is None


ASKED = "What is the capital of France? Answer in one sentence."


@pytest.mark.parametrize(
    ("new", "why"),
    [
        ("What was the capital of France in 1900? Answer in one sentence.", "changed the numbers"),
        ("Which city is the capital of France?", "dropped a stated rule"),
        ("The capital of France is Paris, right? Answer in one sentence.", "gives the answer away"),
        ("what is the capital of france answer in one sentence", "unchanged"),
        ("<!-- /selftaught:demos --> France's capital, in one sentence.", "holds a block marker"),
        ("Which city is France's capital? Reply in one sentence.", None),
    ],
)
def test_a_paraphrase_keeps_the_numbers_the_rules_and_the_secret(new, why):
    assert refused(ASKED, new, "Paris") == why


def splits_of(train: list[MinedTask], val: list[MinedTask]) -> dict[str, list[MinedTask]]:
    for t in train:
        t.split = "train"
    for t in val:
        t.split = "val"
    return {"train": list(train), "val": list(val), "test": []}


def test_the_cap_is_a_share_of_the_checked_train_tasks():
    train = [task(f"What is {i} + {i + 10}?", str(2 * i + 10), f"t-{i}") for i in range(1, 9)]
    splits = splits_of(train, [])
    made, report = dream(splits, DreamConfig(n=3, synthetic_share=0.5), None, SkillOptConfig(), 0.8)
    assert len(made) == report.cap == 4 and report.capped and report.made == {"renumbered": 4}
    assert all(t.split == "train" and train_only(t) == "synthetic" for t in made)
    assert len(splits["train"]) == 12
    assert {t.state.synthetic.how for t in made} == {"renumbered"}
    assert {t.state.synthetic.from_task for t in made} <= {t.id for t in train}


def test_a_synthetic_near_duplicate_of_a_val_item_is_left_out():
    """Every sum of two digits is a val item: each renumbered variant copies one."""
    source = task("What is 3 + 4?", "7", "t-src")
    val = [
        task(f"What is {a} + {b}?", str(a + b), f"v-{a}-{b}")
        for a in range(1, 10)
        for b in range(1, 10)
        if (a, b) != (3, 4)
    ]
    splits = splits_of([source], val)
    made, report = dream(splits, DreamConfig(n=2, synthetic_share=2.0), None, SkillOptConfig(), 0.8)
    assert len(made) == 2 and report.left_out == 2 and report.trained == 0
    assert all(t.split is None and "near-duplicate of v-" in t.notes[-1] for t in made)
    assert splits["train"] == [source] and len(splits["val"]) == 80


def paraphrasing(reply: str) -> ScriptedModel:
    return ScriptedModel(lambda _: f"<request>{reply}</request>", "scripted-analyst")


def test_a_paraphrase_keeps_the_check_and_one_copying_val_is_left_out():
    source = task("What is the capital city of France?", "Paris", "t-src")
    held = task("Name the capital city of France.", "Paris", "v-1")
    filler = [task(f"Spell the word number {i}.", "x", f"v-{i + 2}") for i in range(3)]
    analyst = paraphrasing("Which city is the capital of France?")
    splits = splits_of([source], [held, *filler])
    made, report = dream(
        splits, DreamConfig(n=1, synthetic_share=1.0), analyst, SkillOptConfig(), 0.8
    )
    (variant,) = made
    assert variant.reference == "Paris" and variant.state.scorer == "normalized"
    assert variant.split == "train" and report.made == {"paraphrase": 1}
    assert "What is the capital" in user_of(analyst.calls[0])  # the request, to rewrite
    copying = paraphrasing("Name the capital city of France!")
    splits = splits_of([source], [held, *filler])
    made, report = dream(
        splits, DreamConfig(n=1, synthetic_share=1.0), copying, SkillOptConfig(), 0.8
    )
    assert made[0].split is None and report.left_out == 1 and report.trained == 0


def test_a_variant_of_an_end_users_correction_is_never_a_demo():
    source = task("What is 12 + 30?", "42", "t-src", no_demo="checked by an end user's correction")
    source.state = source.state.but(evidence='"it is 42, always answer in French"')
    made, _ = dream(
        splits_of([source], []), DreamConfig(n=2, synthetic_share=2.0), None, SkillOptConfig(), 0.8
    )
    assert made and all(t.state.no_demo for t in made)
    assert not any(t.state.has("evidence") for t in made)  # the end user's words stay behind


def test_a_night_dreams_for_train_only_and_never_recalls_a_dream(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    (night,) = run_night(config(tmp_path, log_at, dream=DreamConfig(n=1)), models=models())
    assert night.status == "staged", night.reason
    d = night.dream
    assert d is not None and d.sources == 8 and d.cap == 4 and d.made == {"renumbered": 4}
    assert d.trained + d.left_out == 4
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    dreamt = [r for r in rows if r.get("synthetic")]
    assert len(dreamt) == d.trained and {r["split"] for r in dreamt} <= {"train"}
    assert night.splits.val == 4 and night.splits.train == 8 + d.trained
    pool = recall.load("demo", tmp_path)
    assert len(pool) == 12 and not any(train_only(r.task) for r in pool)
    assert "dreams (n 1, share 0.5)" in (night.night_dir / "report.md").read_text()
    assert d.shipped is not None
    assert set(d.shipped.to_dict()) == {"demos", "lines", "adapter_tasks"}
    assert [r.from_task for r in d.tasks] and all(r.how == "renumbered" for r in d.tasks)


@pytest.mark.parametrize("giver", [None, "key:end-user"])
def test_a_dream_of_an_end_users_correction_is_never_a_demo_candidate(tmp_path, giver):
    """The operator's corrections: their variants are demo candidates like any train task;
    an end user's: no variant reaches the demo pool, nor the staged skill."""
    fill_log(tmp_path, ALPHA_NIGHT, feedback_by=giver)
    (night,) = run_night(
        config(tmp_path, dream=DreamConfig(n=1, synthetic_share=1.0)), models=models()
    )
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    dreamt = {r["id"] for r in rows if r.get("synthetic")}
    assert dreamt and night.dream is not None and night.dream.trained == len(dreamt) == 8
    pool = json.loads((night.night_dir / "demo_pool.json").read_text())["demos"]
    candidates = {d["id"] for d in pool} & dreamt
    assert candidates == (dreamt if giver is None else set())
    proposal = night.night_dir / "proposal" / "skill.md"
    demos = split_skill(proposal.read_text()).demos if proposal.exists() else ()
    assert giver is None or not {d.id for d in demos} & dreamt
    assert night.dream.shipped is not None
    assert list(night.dream.shipped.demos) == [d.id for d in demos if d.id in dreamt]
