"""Weak labels: requests nobody checked, sampled k times; an answer enough samples agree on
becomes a reference for a train task only, never val or test, never the recall pool."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from selftaught.errors import ConfigError
from selftaught.models.base import Message
from selftaught.policy import Policy
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.intake.log import OPERATOR, Feedback, Interaction, TaskLog
from selftaught.sleep.night import recall
from selftaught.sleep.night.checks import short_answer
from selftaught.sleep.night.cycle import NightConfig, mine, run_night
from selftaught.sleep.night.mine import NO_CHECK, MineConfig, MinedTask
from selftaught.sleep.night.split import SplitConfig, assign_splits, train_only
from selftaught.sleep.night.weak import (
    UNTRUSTED_REQUEST,
    WeakConfig,
    settle_weak,
    weak_label,
)
from selftaught.sleep.records import SyntheticOrigin, TaskChecks, WeakLabel, WeakRecord
from tests.scripted import ScriptedModel, rule_answer, user_of
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

_ADD = re.compile(r"Please add (\d+) and (\d+)\.")


def adds(messages: list[Message]) -> str:
    """The night's rule target, and the right sum for a request nobody checked."""
    m = _ADD.search(user_of(messages))
    if m is None:
        return rule_answer(messages)
    return f"The answer is {int(m.group(1)) + int(m.group(2))}."


def row(text: str, client: str | None = OPERATOR, **kw) -> Interaction:
    return Interaction(
        messages=[{"role": "user", "content": text}],
        reply=kw.pop("reply", "Sure."),
        project="demo",
        source="proxy",
        client=client,
        **kw,
    )


def label(rows, target, checked=(), **weak):
    return weak_label(
        rows,
        list(checked),
        WeakConfig(**weak),
        MineConfig(),
        target,
        Policy(),
        SkillOptConfig(),
    )


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("The answer is 110.", "110"),
        ("50 + 60 = 110", "110"),
        ("Answer: 1,250", "1250"),
        ("7 km", "7 km"),
        ("Paris.", "Paris"),
        ("I do not know.", None),
        ("It could be 3 or 4 depending on the day of the week you ask me", None),
        ("3 or 4", None),
    ],
)
def test_a_short_answer_is_read_from_a_reply(reply, answer):
    got = short_answer(reply)
    assert (got.value if got else None) == answer


def test_mining_hands_back_the_rows_it_dropped_for_having_no_check():
    rows = [
        row("Please add 1 and 2."),
        row("Please add 3 and 4.", feedback=Feedback(reference="7")),
    ]
    unchecked: list[Interaction] = []
    tasks, report = mine(rows, MineConfig(), None, unchecked)
    assert [t.reference for t in tasks] == ["7"]
    assert [it.id for it in unchecked] == [rows[0].id]
    assert any(why.startswith(NO_CHECK) for why in report.dropped)  # still counted as dropped


def test_agreeing_samples_become_a_weak_reference():
    target = ScriptedModel(adds)
    tasks, report = label([row("Please add 50 and 60.")], target, k=3)
    (task,) = tasks
    assert task.reference == "110" and task.state.scorer == "numeric"
    assert task.state.weak.agreement == 1.0 and task.state.weak.k == 3
    assert train_only(task) == "weak" and not task.state.has("no_demo")  # the operator's request
    assert len(target.calls) == 3 and report.labelled == 1 and report.sampled == 1
    assert all(p.temperature == SkillOptConfig().rollout_temperature for p in target.params)


def test_disagreeing_samples_label_nothing():
    n = itertools.count()
    target = ScriptedModel(lambda _: f"Answer: {110 + next(n) % 3}")
    tasks, report = label([row("Please add 50 and 60.")], target, k=3, agree=0.6)
    assert tasks == [] and report.disagreed == 1 and report.labelled == 0
    assert report.tasks[0].agreement == pytest.approx(1 / 3, abs=1e-3)
    # two of three agreeing reach 0.6, not 0.8
    n2 = itertools.count()
    two = ScriptedModel(lambda _: "Answer: 110" if next(n2) % 3 else "Answer: 7")
    assert len(label([row("Please add 50 and 60.")], two, k=3, agree=0.6)[0]) == 1
    n3 = itertools.count()
    two = ScriptedModel(lambda _: "Answer: 110" if next(n3) % 3 else "Answer: 7")
    assert label([row("Please add 50 and 60.")], two, k=3, agree=0.8)[0] == []


def test_an_end_users_request_is_labelled_but_never_a_demo():
    (task,), _ = label([row("Please add 5 and 6.", client="key:abc")], ScriptedModel(adds), k=2)
    assert task.state.no_demo == UNTRUSTED_REQUEST and task.reference == "11"


def test_a_rejected_answer_is_not_taken_and_a_real_reference_scores_the_weak_one():
    rejected = row("Please add 2 and 2.", reply="The answer is 4.", feedback=Feedback(thumb="down"))
    twin_ok, twin_bad = row("Please add 50 and 60."), row("Please add 10 and 10.")
    checked = [
        MinedTask("c-1", twin_ok.messages, "110", TaskChecks(scorer="numeric")),
        MinedTask("c-2", twin_bad.messages, "21", TaskChecks(scorer="numeric")),
    ]
    tasks, report = label([rejected, twin_ok, twin_bad], ScriptedModel(adds), checked, k=2)
    assert tasks == []  # refuted, and twice already checked
    assert report.refuted == 1 and report.already_checked == 2
    assert report.verified == {"right": 1, "wrong": 1} and report.accuracy == 0.5


def test_weak_and_synthetic_tasks_go_to_train_only_and_never_copy_held_out_ones():
    real = [
        MinedTask(f"r{i}", [{"role": "user", "content": f"What is {i} + {i + 7}?"}], str(2 * i + 7))
        for i in range(10)
    ]
    real[0].split = "val"  # fixed, as a recalled task's split is
    weak = MinedTask(
        "w1", [{"role": "user", "content": "Name a colour."}], "red", TaskChecks(weak=WeakLabel())
    )
    weak.split = "val"  # a train-only task is never validated on, whatever it says
    copy = MinedTask(
        "w2", list(real[0].messages), "7", TaskChecks(synthetic=SyntheticOrigin(from_task="r0"))
    )
    splits = assign_splits([*real, weak, copy], SplitConfig(val_fraction=0.5, min_val=4))
    assert weak.split == "train" and weak in splits["train"]
    assert copy.split is None and all(copy not in s for s in splits.values())
    assert "near-duplicate of r0 (val)" in copy.notes[-1]
    assert sum(len(s) for s in splits.values()) == 11


def test_weak_config_is_checked():
    with pytest.raises(ConfigError, match="at least 2"):
        WeakConfig(k=1)
    with pytest.raises(ConfigError, match="agree"):
        WeakConfig(k=3, agree=0.5)


def add_unchecked(home, pairs, log_at=None, client=None) -> None:
    """Requests with no feedback, from the same (unknown) client as `fill_log`'s rows."""
    log = TaskLog(log_at or home / "log.db")
    for a, b in pairs:
        log.add(row(f"Please add {a} and {b}.", client=client))
    log.close()


def test_a_night_trains_on_weak_labels_and_never_validates_or_recalls_them(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    add_unchecked(tmp_path, [(50, 60), (70, 80), (90, 15)], log_at)
    cfg = config(tmp_path, log_at, weak=WeakConfig(k=3))
    (night,) = run_night(cfg, models=models(ScriptedModel(adds, "scripted-target")))
    assert night.status == "staged", night.reason
    w = night.weak
    assert w is not None and (w.candidates, w.sampled, w.labelled, w.trained) == (3, 3, 3, 3)
    assert w.mean_agreement == 1.0 and night.splits.train >= 3
    assert {t.outcome for t in w.tasks} == {"labelled"}
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    weak_rows = [r for r in rows if r.get("weak")]
    assert sorted(r["reference"] for r in weak_rows) == ["105", "110", "150"]
    assert {r["split"] for r in weak_rows} == {"train"}
    assert night.mining.tasks == 12  # mining's own count is unchanged
    pool = recall.load("demo", tmp_path)
    assert len(pool) == 12 and not any(train_only(r.task) for r in pool)
    assert "weak labels (k 3, agree 80%)" in (night.night_dir / "report.md").read_text()
    usage = night.usage["target"]["calls"]
    evidence = (night.night_dir / "evidence.jsonl").read_text().count('"role": "target"')
    assert usage == evidence and usage >= 9  # the samples are charged to the night


def test_without_pseudo_k_a_night_has_no_weak_section(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    add_unchecked(tmp_path, [(50, 60)])
    (night,) = run_night(config(tmp_path), models=models(ScriptedModel(adds, "scripted-target")))
    assert night.weak is None and night.splits.to_dict() == {"train": 8, "val": 4, "test": 0}


def test_sleep_config_carries_the_weak_and_dream_settings():
    cfg = NightConfig(weak=WeakConfig(k=4, agree=0.75))
    assert cfg.weak.k == 4 and cfg.dream.n == 0


def test_weak_tasks_are_capped_by_a_share_of_the_checked_train_tasks():
    real = [
        MinedTask(f"r{i}", [{"role": "user", "content": f"What is {i} + {i + 7}?"}], "x")
        for i in range(4)
    ]
    weak = [
        MinedTask(f"w{i}", [{"role": "user", "content": f"Name colour {i}."}], "red")
        for i in range(5)
    ]
    for i, t in enumerate(weak):
        t.state = t.state.but(weak=WeakLabel(agreement=0.8 + i / 100, k=5))
    splits = {"train": [*real, *weak], "val": [], "test": []}
    for t in splits["train"]:
        t.split = "train"
    report = settle_weak(splits, weak, WeakConfig(k=5, weak_share=0.5), WeakRecord(labelled=5))
    assert report.over_cap == 3 and report.trained == 2
    assert {t.id for t in splits["train"] if train_only(t)} == {"w4", "w3"}  # best agreed
    assert weak[0].split is None and "over the weak share" in weak[0].notes[-1]


def test_the_recall_pool_never_keeps_a_weak_or_synthetic_task(tmp_path):
    def one(tid: str, **state) -> MinedTask:
        t = MinedTask(
            tid, [{"role": "user", "content": tid}], "1", TaskChecks.empty().but(rules=(), **state)
        )
        t.split = "train"
        return t

    tasks = [
        one("real"),
        one("weak", weak=WeakLabel(k=3)),
        one("dream", synthetic=SyntheticOrigin(from_task="real")),
    ]
    assert recall.remember("demo", tmp_path, "n1", tasks, [], set(), 10) == 1
    assert [r.task.id for r in recall.load("demo", tmp_path)] == ["real"]


@pytest.mark.slow
@pytest.mark.local
def test_pseudo_k_samples_the_embedded_model(tmp_path):
    """Plumbing only: the embedded SmolLM2-135M answers k samples per unchecked request
    through the rollout runner; whether they agree is the model's business."""
    pytest.importorskip("transformers")
    from selftaught.models import embedded
    from selftaught.models.local import LocalModel
    from selftaught.models.usage import TrackedModel, UsageLedger

    try:
        embedded.embedded_model_dir()
    except embedded.EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    ledger = UsageLedger()
    model = LocalModel(max_batch_size=8)
    target = TrackedModel(model, ledger, "target")
    rows = [row("What is 2 + 2?"), row("Name a colour.")]
    training = SkillOptConfig(max_tokens=16)
    tasks, report = weak_label(
        rows, [], WeakConfig(k=3, agree=0.67), MineConfig(), target, Policy(), training
    )
    assert report.sampled == 2 and report.failed_samples == 0
    assert ledger.to_dict()["target"]["calls"] >= 2  # k samples may share one prompt
    assert len(report.tasks) == 2 and all(0 <= r.agreement <= 1 for r in report.tasks)
    assert all(t.state.weak.k == 3 and t.reference for t in tasks)


def test_a_real_reference_arriving_on_a_later_night_scores_a_weak_label(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    add_unchecked(tmp_path, [(50, 60), (70, 80)])
    cfg = config(tmp_path, weak=WeakConfig(k=2))
    target = ScriptedModel(adds, "scripted-target")
    (first,) = run_night(cfg, models=models(target))
    assert first.weak is not None and first.weak.labelled == 2 and first.weak.waiting == 2
    assert first.weak.verified_later == {"right": 0, "wrong": 0}
    log = TaskLog(tmp_path / "log.db")
    for text, right in (("Please add 50 and 60.", "110"), ("Please add 70 and 80.", "151")):
        log.add(row(text, client=None, feedback=Feedback(thumb="down", reference=right)))
    log.close()
    (second,) = run_night(cfg, models=models(target))
    assert second.status in ("staged", "no_proposal"), second.reason
    w = second.weak
    assert w is not None and w.verified_later == {"right": 1, "wrong": 1} and w.accuracy == 0.5
    assert w.waiting == 0 and w.candidates == 0
    assert "1 of 2 right" in (second.night_dir / "report.md").read_text()


def test_a_weak_label_must_fail_the_rejected_reply_even_when_it_is_prose():
    """Two-sided: the agreed answer, as a check, must fail the reply the user rejected. A
    reply in prose has no short answer to compare; the agreed answer's own scorer reads it."""
    prose = "If you put 2 apples next to 2 apples you get 4 of them in total."
    assert short_answer(prose) is None
    rejected = row("Please add 2 and 2.", reply=prose, feedback=Feedback(thumb="down"))
    tasks, report = label([rejected], ScriptedModel(adds), k=2)
    assert tasks == [] and report.refuted == 1
    other = prose.replace("4", "5")
    rejected = row("Please add 2 and 2.", reply=other, feedback=Feedback(thumb="down"))
    (task,), report = label([rejected], ScriptedModel(adds), k=2)
    assert task.reference == "4" and train_only(task) == "weak" and report.refuted == 0
