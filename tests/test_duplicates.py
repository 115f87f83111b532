"""One notion of "the same item" (`selftaught.duplicates`) for merging, splitting, recall and
every leak guard: instances of one template with other values or answers are different
items; resends, rewordings, reorderings and politer copies are the same item. Then the
nights it decides: template traffic learns (issue 62), and a duplicate found late is dropped
and reported, never the night failed."""

from __future__ import annotations

import json
import re

import pytest

from selftaught.demos import Demo, DemoLeakError, LeakCheck
from selftaught.duplicates import DuplicateIndex, groups, item_key, same_item, same_values
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.night.mine import MineConfig
from tests.scripted import ScriptedModel, canned_analyst, user_of
from tests.test_sleep_cycle import config, fill_log, models
from tests.test_sleep_weights import FakeTrainer

# ---- the one function: a table of pairs -------------------------------------------------------

DAY = "Which day of the week comes {} days after {}?"

DIFFERENT = [  # one template, other values: different items
    (DAY.format(2, "Wednesday"), DAY.format(2, "Saturday")),
    (DAY.format(2, "Wednesday"), DAY.format(3, "Wednesday")),
    ("What is 3 + 4?", "What is 3 + 5?"),
    ("What is 5 - 3?", "What is 3 - 5?"),  # the same numbers in another order
    ("Calculate 5 - 3.", "Calculate ( 5 * 3 )."),  # another operator
    ("Calculate -9 / 1.", "Calculate 9 / 1."),  # a sign
    ("What is the capital of France?", "What is the capital of Spain?"),
    ("How many days are there in March?", "How many days are there in April?"),
    ("Alice gave Bob 3 apples. How many has Bob?", "Bob gave Alice 3 apples. How many has Bob?"),
    ("Reverse the word 'cat'.", "Reverse the word 'dog'."),  # quoted values
    ("Name a color.", "Name a fruit."),  # other words, whatever the shape
    ("Is 17 prime?", "Is 17 even?"),
    ("Which day comes 2 days after Monday?", "Which day comes 2 days before Monday?"),
    ("1. Add 3 and 4.", "1. Add 3 and 5."),  # a list marker is layout, the numbers still count
    ("Hi!", "Thanks!"),  # nothing but politeness: its words are all it has
    ("Who is it?", "What is it?"),
]

SAME = [  # one item: resends, rewordings, reorderings, politer copies
    ("What is 3 + 4?", "what is 3+4 ?"),  # case, spacing, punctuation
    (DAY.format(2, "Wednesday"), "which day of the week comes 2 days after wednesday"),
    (DAY.format(2, "Wednesday"), "Please, " + DAY.format(2, "Wednesday").lower() + " Thanks!"),
    (
        "What is the capital of France?",
        "Hi! Could you please tell me what is the capital of France? Thank you",
    ),
    ("What is the capital of France?", "The capital of France is what?"),  # reordered
    ("What's the capital of france, please", "What is the capital of France?"),
    ("Please compute 17 * 23 for me now", "Could you compute 17 * 23 for me now"),
    ("Reverse the word 'cat'.", "reverse the word cat please"),
    ("Add 1,000 and 250.", "Add 1000 and 250"),  # a thousands separator
    ("What is 3 + 4?", "what's 3 + 4"),
    ("Hi!", "hi"),
    ("Summarise the follow-up notes for the team", "summarise the follow up notes for the team"),
    (  # one synonym in a long request
        "Summarise the attached meeting notes for the whole team in plain words and keep the "
        "action items with their owners at the end",
        "Summarise the attached meeting notes for the whole team in simple words and keep the "
        "action items with their owners at the end",
    ),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_instances_of_one_template_with_other_values_are_different_items(a, b):
    assert not same_item(item_key(a), item_key(b))
    assert not same_item(item_key(b), item_key(a))


@pytest.mark.parametrize(("a", "b"), SAME)
def test_resends_rewordings_and_politer_copies_are_the_same_item(a, b):
    assert same_item(item_key(a), item_key(b))
    assert same_item(item_key(b), item_key(a))


def test_references_tell_apart_a_template_whose_values_no_rule_recognises():
    cat, dog = TRANSLATE.format("cat"), TRANSLATE.format("dog")
    assert same_item(item_key(cat), item_key(dog))  # unknown answers: the safe side, one item
    assert not same_item(item_key(cat, "le chat dort"), item_key(dog, "le chien dort"))
    assert same_item(item_key(cat, "Le chat dort."), item_key(dog, ["x", "le chat dort"]))
    # a resend whose label differs is still one item (merge settles which label wins)
    assert same_item(item_key("What is 3 + 4?", "8"), item_key("what is 3+4", "7"))
    # a paraphrase with the same values is not told apart by its answers' wording
    assert same_item(
        item_key("What is the capital of France?", "Paris"),
        item_key("The capital of France is what?", "paris."),
    )


def test_a_paraphrase_keeps_the_values_or_is_another_question():
    asked = item_key("What comes 2 days after Wednesday?")
    assert same_values(asked, item_key("Which day is it 2 days after wednesday, please?"))
    assert not same_values(asked, item_key("What comes 2 days after Thursday?"))
    assert not same_values(asked, item_key("What comes 3 days after Wednesday?"))


def test_the_index_and_the_groups_compare_only_what_can_match():
    texts = [DAY.format(2, "Wednesday"), DAY.format(2, "Saturday"), "what is 3+4", "What is 3 + 4?"]
    keys = [item_key(t) for t in texts]
    assert groups(keys) == [[0], [1], [2, 3]]
    index: DuplicateIndex[str] = DuplicateIndex()
    for t, k in zip(texts, keys, strict=True):
        index.add(k, t)
    assert (
        index.find(item_key("Please, which day of the week comes 2 days after Saturday?"))
        == (texts[1])
    )
    assert index.find(item_key(DAY.format(2, "Sunday"))) is None
    index.remove(texts[1])
    assert index.find(item_key(DAY.format(2, "Saturday"))) is None


# ---- the leak guards --------------------------------------------------------------------------


def test_the_leak_check_passes_a_template_sibling_and_catches_a_politer_copy():
    check = LeakCheck([("val", "v-sat", DAY.format(2, "Saturday"), "Monday")])
    sibling = Demo.of("t-wed", DAY.format(2, "Wednesday"), "Friday", "correction")
    copy = Demo.of("t-copy", "Please: " + DAY.format(2, "Saturday") + " thx", "Monday", "reference")
    kept, leaks = check.filter([sibling, copy])
    assert kept == [sibling] and [x.why() for x in leaks] == [
        "demo t-copy duplicates val item v-sat"
    ]
    with pytest.raises(DemoLeakError, match="t-copy duplicates val item v-sat"):
        check.assert_clean([sibling, copy])  # offline: a skill that carries one fails closed


TRANSLATE = (
    "Translate into French, keeping the formal tone of the original: the {} sleeps on the "
    "warm windowsill"
)


def test_the_leak_check_reads_the_train_items_references():
    held = [("val", "v-dog", TRANSLATE.format("dog"), "le chien dort sur le rebord")]
    cat = Demo.of("t-cat", TRANSLATE.format("cat"), "le chat dort sur le rebord", "correction")
    assert LeakCheck(held).find(cat) is not None  # its answer unknown: one item, refused
    assert LeakCheck(held, {"t-cat": "le chat dort sur le rebord"}).find(cat) is None


def test_offline_dpo_preferences_that_copy_a_val_item_still_fail_closed(tmp_path):
    from selftaught.tasks.base import TaskError
    from selftaught.weights.dpo import assert_no_held_out, read_preferences
    from tests.scripted import ToyTask

    task = ToyTask()
    val = task.examples("val")[0]
    rows = [
        {"id": "p1", "prompt": "Please, " + val.prompt_text(), "chosen": "A", "rejected": "B"},
        {"id": "p2", "prompt": "Name a fruit.", "chosen": "A", "rejected": "B"},
    ]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskError, match=f"prefs.jsonl:1 duplicates val item '{val.id}'") as err:
        assert_no_held_out(read_preferences(path), task)
    assert "prefs.jsonl:2" not in str(err.value)


# ---- nights -----------------------------------------------------------------------------------

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_ASKED = re.compile(r"comes (\d+) days after (\w+)")


def _day(messages: list[dict], off: int) -> str:
    found = _ASKED.findall(user_of(messages))
    if not found:
        return "I do not know."
    n, day = found[-1]
    return DAYS[(DAYS.index(day) + int(n) + off) % 7]


def fill_days(home, n: int = 24) -> None:
    """`n` day-of-week questions of one template, each a distinct (days, weekday) pair, each
    corrected by the operator with the right day."""
    log = TaskLog(home / "log.db")
    for i in range(n):
        days, start = i % 6 + 1, DAYS[(3 * i) % 7]
        ask = [{"role": "user", "content": DAY.format(days, start)}]
        right = _day(ask, 0)
        log.add(
            Interaction(
                messages=ask,
                reply=_day(ask, 1),
                project="demo",
                source="proxy",
                feedback=Feedback(thumb="down", reference=right),
            )
        )
    log.close()


def test_a_night_of_one_template_trains_weights_and_demos_instead_of_refusing(tmp_path):
    """Issue 62: train and val items of one template ("2 days after Wednesday" / "after
    Saturday") are different items: weights train on every train task, demos are not refused,
    and the night learns."""
    fill_days(tmp_path)
    trainer = FakeTrainer(sft=lambda m: _day(m, 0))  # the adapter learned the days
    m = models(target=ScriptedModel(lambda msgs: _day(msgs, 1), "scripted-target"))
    m.optimizer = canned_analyst()  # proposes no rule
    m.adapter_trainer = trainer
    (night,) = run_night(config(tmp_path, weights="sft"), models=m)
    assert night.status == "staged", night.reason
    assert night.mining.tasks == 24 and night.mining.merged == 0
    assert night.splits.train >= 2 and night.splits.val >= 4  # both sides of one template
    assert night.duplicates == ()
    ((_, data),) = trainer.calls
    assert data.corrections == night.splits.train  # no train task refused
    assert night.weights.winner == "sft" and night.proposal.adapter is not None
    modes = night.phases["skill"].demo_modes
    assert modes.leaks_refused == 0 and modes.pool == night.splits.train
    assert "dropped as duplicates" not in (night.night_dir / "report.md").read_text()


def test_a_duplicate_found_late_at_the_split_is_dropped_and_reported(tmp_path):
    """Two recalled tasks of different splits that are one item (a pool an older night split
    apart): the train copy is dropped, the night goes on and says so."""
    fill_log(tmp_path, ["alpha"] * 12)
    (first,) = run_night(config(tmp_path), models=models())
    assert first.status == "staged", first.reason
    pool = recall.load("demo", tmp_path)
    held = next(r for r in pool if r.task.split == "val")
    copy = recall.Recalled.from_dict(json.loads(json.dumps(held.to_dict())))
    copy.task.id, copy.task.split = "t-resent", "train"
    copy.task.messages[-1]["content"] = copy.task.messages[-1]["content"].lower()
    rows = [copy.to_dict(), *(r.to_dict() for r in pool)]
    recall.recall_path("demo", tmp_path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    fill_log(tmp_path, ["alpha"] * 3, start=100)
    (second,) = run_night(config(tmp_path), models=models())
    assert second.status in ("staged", "no_proposal"), second.reason
    (dup,) = second.duplicates
    assert (dup.item, dup.held_out, dup.split, dup.phase) == (
        "t-resent",
        held.task.id,
        "val",
        "split",
    )
    md = (second.night_dir / "report.md").read_text()
    assert "dropped as duplicates of held-out tasks: 1" in md
    assert f"t-resent (split): the same item as val task {held.task.id}" in md
    tasks = [json.loads(x) for x in (second.night_dir / "tasks.jsonl").read_text().splitlines()]
    assert "t-resent" not in {t["id"] for t in tasks}
    assert "t-resent" not in {r.task.id for r in recall.load("demo", tmp_path)}
    report = json.loads((second.night_dir / "report.json").read_text())
    assert report["duplicates"] == [dup.to_dict()]


def _summarise(i: int, word: str) -> str:
    return (
        f"[needs alpha] What is {i} + {7 * i + 3}? Then give the final total as one {word} "
        "number without any other words"
    )


def test_a_duplicate_found_late_by_the_weight_phase_is_dropped_not_the_night(tmp_path):
    """Mining that merges only near-identical wordings (`near_duplicate` 0.95) leaves pairs
    that differ by one synonym on both sides of the split; the weight phase's leak guard (the
    default notion) finds them: it drops those items and trains on the rest."""
    log = TaskLog(tmp_path / "log.db")
    for i in range(12):
        for word in ("plain", "simple"):
            log.add(
                Interaction(
                    messages=[{"role": "user", "content": _summarise(i, word)}],
                    reply=f"Answer: {8 * i + 4}",
                    project="demo",
                    source="proxy",
                    feedback=Feedback(thumb="down", reference=str(8 * i + 3)),
                )
            )
    log.close()
    trainer = FakeTrainer(sft=lambda msgs: "Answer: 0")
    m = models(analyst=canned_analyst())
    m.adapter_trainer = trainer
    cfg = config(tmp_path, weights="sft", mining=MineConfig(near_duplicate=0.95))
    (night,) = run_night(cfg, models=m)
    assert night.status in ("staged", "no_proposal"), night.reason
    assert night.mining.merged == 0  # 0.95: the synonym pairs stayed apart
    late = [d for d in night.duplicates if d.phase == "weights"]
    assert late and all(d.split in ("val", "test") for d in late)
    ((_, data),) = trainer.calls
    trained = {s.example_id for s in data.sft}
    assert trained and not trained & {d.item for d in late}
    assert data.corrections == night.splits.train - len(late)
    assert "(weights): the same item as val task" in (night.night_dir / "report.md").read_text()
