"""Mining logged interactions into checked tasks, near-duplicates, splits, rule checks."""

from __future__ import annotations

import pytest

from selftaught.sleep.intake.log import Feedback, Interaction
from selftaught.sleep.night.checks import Rule, detect_language, find_rules, score_example
from selftaught.sleep.night.cycle import mine
from selftaught.sleep.night.mine import MineConfig
from selftaught.sleep.night.split import (
    NightTask,
    SplitConfig,
    TooFewTasks,
    assign_splits,
    check_split,
)
from selftaught.tasks.base import Example, check_disjoint
from selftaught.tasks.scorers import quantity, reference_scorer

SECRET = "sk-proj-" + "Ab3" * 20


def it(prompt: str, reply: str = "x", **kw) -> Interaction:
    return Interaction(messages=[{"role": "user", "content": prompt}], reply=reply, **kw)


def test_each_interaction_gets_its_strongest_check_and_records_its_source():
    rows = [
        it("What is 2 + 2?", "5", reference="4"),
        it("What is 3 + 3?", "7", feedback=Feedback(thumb="down", reference="6")),
        it("How far is 3 km plus 4 km?", "7", feedback=Feedback(reference="7 km")),
        it("Explain recursion in at most 20 words.", "Recursion is ..."),
        it("Tell me a joke.", "No."),  # no reference, no rule, no judge: dropped
        it("broken", None, error="upstream 500"),
    ]
    tasks, report = mine(rows, MineConfig())
    by_prompt = {t.prompt: t for t in tasks}
    assert by_prompt["What is 2 + 2?"].state.scorer == "numeric"
    corrected = by_prompt["What is 3 + 3?"]
    assert corrected.reference == "6" and corrected.negative and corrected.logged_reply == "7"
    assert by_prompt["How far is 3 km plus 4 km?"].state.scorer == "quantity"
    rule_task = by_prompt["Explain recursion in at most 20 words."]
    assert rule_task.check == "rule" and rule_task.state.rules[0]["arg"] == 20
    assert all(t.sources and t.origins == ["api"] for t in tasks)
    assert report.read == 6 and report.tasks == 4 and report.negative == 1
    assert report.by_check == {"reference": 3, "rule": 1}
    assert report.dropped == {
        "no reference, no stated rule and no --judge-model for a rubric": 1,
        "failed call (an error, never a task)": 1,
    }


def test_with_a_judge_unreferenced_requests_get_a_rubric_showing_the_rejected_reply():
    rows = [
        it("Tell me a joke.", "No.", feedback=Feedback(thumb="down", comment="be funnier")),
        it("Name a fruit.", "Apple", feedback=Feedback(thumb="up")),
    ]
    tasks, report = mine(rows, MineConfig(judge=True))
    joke, fruit = sorted(tasks, key=lambda t: t.prompt, reverse=True)
    assert joke.check == "rubric" and "be funnier" in joke.state.rubric
    assert "'No.'" in joke.state.rubric and joke.reference is None
    assert fruit.reference == "Apple" and "approved" in fruit.state.rubric
    assert report.by_check == {"rubric": 2}


def test_mined_text_is_redacted_and_injected_skills_stripped_and_images_refused():
    block = "<!-- selftaught:skill version=3 -->\nOld skill.\n<!-- /selftaught:skill -->\n\n"
    rows = [
        Interaction(
            messages=[
                {"role": "system", "content": block + "Be brief."},
                {"role": "user", "content": f"My key is {SECRET}. What is 1 + 1?"},
            ],
            reply=f"ok {SECRET}",
            reference="2",
        ),
        Interaction(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
            reply="a cat",
            reference="cat",
        ),
    ]
    tasks, report = mine(rows, MineConfig())
    (task,) = tasks
    text = str(task.to_dict())
    assert SECRET not in text and "[REDACTED:openai_key]" in text
    assert task.messages[0] == {"role": "system", "content": "Be brief."}
    assert report.dropped == {
        "holds non-text content (images, files): cannot be replayed as text": 1
    }


def test_near_duplicates_merge_but_different_numbers_never_do():
    rows = [
        it("What is 3 + 4?", "8", created_at=1.0, reference="7"),
        it("what is 3+4", "7", created_at=2.0, feedback=Feedback(thumb="down", reference="7")),
        it("What is 3 + 5?", "8", created_at=3.0, reference="8"),
    ]
    tasks, report = mine(rows, MineConfig())
    assert report.merged == 1 and len(tasks) == 2
    merged = next(t for t in tasks if len(t.sources) == 2)
    assert merged.negative and merged.sources[0] == rows[1].id  # the newest leads


def test_mined_tasks_carry_their_interactions_tags_for_the_per_tag_veto():
    rows = [
        it("What is 3 + 4?", "8", created_at=1.0, reference="7", tags=["billing"]),
        it("what is 3+4", "7", created_at=2.0, reference="7", tags=["support", "billing"]),
        it("What is 3 + 5?", "8", created_at=3.0, reference="8"),
    ]
    tasks, _ = mine(rows, MineConfig())
    merged = next(t for t in tasks if len(t.sources) == 2)
    assert merged.state.tags == ("billing", "support")  # the union of the merged rows'
    untagged = next(t for t in tasks if len(t.sources) == 1)
    assert not untagged.state.has("tags")


def test_splits_are_stable_disjoint_and_refuse_too_few_tasks():
    rows = [it(f"Question number {i}: what is {i} + {i}?", reference=str(2 * i)) for i in range(12)]
    tasks, _ = mine(rows, MineConfig())
    splits = assign_splits(tasks, SplitConfig(val_fraction=0.3))
    assert sum(len(v) for v in splits.values()) == 12
    assert len(splits["val"]) >= 4 and len(splits["train"]) >= 2
    again, _ = mine(rows, MineConfig())
    assert {t.id: t.split for t in assign_splits(again, SplitConfig())["val"]} == {
        t.id: t.split for t in splits["val"]
    }
    task = NightTask("demo", splits)
    check_disjoint(task)  # the trainer's own check passes
    assert task.name == "sleep:demo" and task.sizes()["val"] == len(splits["val"])
    few, _ = mine(rows[:5], MineConfig())
    with pytest.raises(TooFewTasks, match="5 mined, at least 6 needed"):
        assign_splits(few, SplitConfig())


def test_a_train_task_that_duplicates_a_val_task_is_dropped_naming_both():
    tasks, _ = mine(
        [it("What is 3 + 4?", reference="7"), it("Hello there, what is 9 + 9?", reference="18")],
        MineConfig(),
    )
    tasks[0].split, tasks[1].split = "train", "val"
    twin, _ = mine([it("what is 3+4 ?", reference="7")], MineConfig())
    twin[0].split = "val"
    splits = {"train": [tasks[0]], "val": [tasks[1], twin[0]], "test": []}
    (dropped,) = check_split(splits, 0.8)  # val keeps its item; train gives its copy up
    assert (dropped.item, dropped.held_out, dropped.split) == (tasks[0].id, twin[0].id, "val")
    assert splits == {"train": [], "val": [tasks[1], twin[0]], "test": []}
    assert tasks[0].split is None and twin[0].id in tasks[0].notes[-1]


def test_rules_the_user_states_are_found_and_checked():
    rules = {r.kind: r for r in find_rules("Answer in French, in at most 12 words, as JSON.")}
    assert rules["language"].arg == "french" and rules["max_words"].arg == 12
    assert "json" in rules
    assert find_rules("Summarize this in two sentences")[0] == Rule(
        "max_sentences", 2, "in two sentences"
    )
    assert find_rules("What is the capital of France?") == []
    assert Rule("max_words", 3).check("one two three")[0]
    assert not Rule("max_words", 3).check("one two three four")[0]
    assert Rule("json").check('Here: {"a": 1}')[0] and not Rule("json").check("no")[0]
    assert Rule("bullets").check("- a\n- b")[0] and not Rule("bullets").check("a, b")[0]
    assert detect_language("Le chat est sur la table et il dort") == "french"
    assert detect_language("Hi") is None  # too short to tell: the check passes, saying so
    ok, why = Rule("language", "french").check("Hi")
    assert ok and "too short" in why


def test_a_quantity_needs_the_number_and_the_unit_at_the_end():
    ex = Example("q", "How far?", reference="7 km")
    assert quantity("The total is 7 km.", ex).hard == 1.0
    no_unit = quantity("The total is 7", ex)
    assert no_unit.hard == 0.0 and no_unit.soft == 0.5 and "unit 'km'" in no_unit.feedback
    wrong = quantity("Answer: 8 km", ex)
    assert wrong.hard == 0.0 and wrong.soft == 0.5 and "expected the number 7" in wrong.feedback
    assert reference_scorer("42") == "numeric" and reference_scorer("Paris") == "normalized"


def test_a_task_with_a_reference_and_a_rule_must_pass_both():
    ex = Example(
        "q",
        "What is 2 + 2? Answer in at most 3 words.",
        reference="4",
        state={"scorer": "numeric", "rules": [Rule("max_words", 3).to_dict()]},
    )
    assert score_example("It is 4", ex, None).hard == 1.0
    long = score_example("Well, let me think: it is 4", ex, None)
    assert long.hard == 0.0 and long.soft == 0.5 and "rule max_words" in long.feedback
