"""Teacher demos (issue 52, `--teacher-demos`): the optimizer writes replies to train items the
target failed; only what the task's own scorer passes becomes a demo; off by default; its calls
are the optimizer's; an item marked `no_demo` (an end user's evidence) never reaches it."""

from __future__ import annotations

import json
import random
import re

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.demos import Demo, LeakCheck, join_skill, split_skill
from selftaught.gate import GateConfig
from selftaught.models.base import Completion, run_sync
from selftaught.models.usage import Budget
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.demo_search import DemoPool, propose_sets
from selftaught.skill.teacher import Teacher, read_reply
from selftaught.sleep.intake.log import Interaction, TaskLog
from selftaught.sleep.night.cycle import run_night
from selftaught.tasks.registry import load_task
from tests.scripted import ScriptedModel, ToyTask, canned_analyst, user_of
from tests.test_skill_demos import format_learner
from tests.test_sleep_cycle import config, fill_log, models
from tests.test_sleep_demos import few_shot

TEACHER_PROMPT = "## The task\n<task>"
_SUM = re.compile(r"What is (\d+) \+ (\d+)\?")


def is_teacher(messages) -> bool:
    return TEACHER_PROMPT in user_of(messages)


def asked(model: ScriptedModel) -> list[str]:
    """The questions the teacher was asked, in order."""
    out = []
    for m in model.calls:
        if is_teacher(m):
            task = user_of(m).split("<task>", 1)[1].split("</task>", 1)[0]
            out.append(_SUM.search(task).group(0))
    return out


def teacher(right: set[int] | None = None, reply=None) -> ScriptedModel:
    """An optimizer that writes the right 'Answer: N' for questions whose first number is in
    `right` (all when None) and a wrong one otherwise; any other prompt gets no edits."""
    canned = canned_analyst()

    def answer(messages):
        if not is_teacher(messages):
            return canned.fn(messages)
        task = user_of(messages).split("<task>", 1)[1]
        a, b = map(int, _SUM.search(task).groups())
        if reply is not None:
            return reply(a, b)
        ok = right is None or a in right
        return f"Let me add.\n<reply>{a} + {b} = {a + b}\nAnswer: {a + b + (not ok)}</reply>"

    return ScriptedModel(answer, "scripted-teacher")


def demo_learner(messages):
    """Replies with a bare sum (a fail) unless a prior assistant turn (a demo) holds
    'Answer:'; rules in the system prompt change nothing."""
    m = _SUM.search([x for x in messages if x["role"] == "user"][-1]["content"])
    if m is None:
        return "?"
    total = int(m.group(1)) + int(m.group(2))
    shown = any(x["role"] == "assistant" and "Answer:" in x["content"] for x in messages[:-1])
    return f"Answer: {total}" if shown else str(total)


def beta_task(train: int = 2) -> ToyTask:
    """Only beta questions: `demo_learner` answers them with a bare number (a fail) unless a
    demo shows 'Answer: N'; the references are bare numbers too (the scorer refuses them)."""
    return ToyTask(train={"beta": train}, val={"beta": 6}, test={"beta": 3})


def run(tmp_path, task, optimizer, target=None, **kw):
    config = dict(epochs=1, batch_size=2, proposals=0, demos_max=2, screen_size=0)
    config.update(kw)
    trainer = SkillTrainer(
        SkillOptConfig(gate=GateConfig(), **config),
        task,
        target or ScriptedModel(demo_learner, "demo-learner"),
        optimizer,
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    )
    return trainer.train()


def history(path) -> list[dict]:
    return [json.loads(x) for x in (path / "history.jsonl").read_text().splitlines()]


# ---- the trainer ------------------------------------------------------------------------------


def test_only_the_reply_the_scorer_passes_becomes_a_teacher_demo_and_is_shipped(tmp_path):
    optimizer = teacher(right={0})  # train-000 (0 + 3) right, train-001 (1 + 10) wrong
    result = run(tmp_path, beta_task(), optimizer, teacher_demos=4)
    assert sorted(asked(optimizer)) == ["What is 0 + 3?", "What is 1 + 10?"]
    pool = json.loads((tmp_path / "demo_pool.json").read_text())
    assert [(d["id"], d["source"]) for d in pool["demos"]] == [("train-000", "teacher")]
    assert pool["demos"][0]["reply"] == "0 + 3 = 3\nAnswer: 3"  # what was between the tags
    assert sorted(pool["teacher_asked"]) == ["train-000", "train-001"]
    # the demo met the gate like any candidate: val 0 of 6 -> 6 of 6
    assert result.val_initial.solved == 0 and result.val_best.solved == 6
    assert [(d["id"], d["source"]) for d in result.best_demos] == [("train-000", "teacher")]
    row = history(tmp_path)[1]
    assert row["demos"]["teacher"] == {"demo": 1, "failed": 1} and row["demos"]["new"] == 1
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    statuses = {a["id"]: a["status"] for a in diag["teacher"]}
    assert statuses == {"train-000": "demo", "train-001": "failed"}
    # its calls are the optimizer's, in the ledger and the step's usage
    assert result.usage["optimizer"]["calls"] == len(optimizer.calls) == 2
    assert row["usage"]["optimizer"]["calls"] == 2


def test_off_by_default_nothing_is_asked_and_the_run_is_as_before(tmp_path):
    optimizer = teacher()
    result = run(tmp_path, beta_task(), optimizer)
    assert optimizer.calls == [] and result.val_best.solved == 0
    pool = json.loads((tmp_path / "demo_pool.json").read_text())
    assert pool == {"demos": [], "leaks": []}
    row = history(tmp_path)[1]
    assert "teacher" not in row["demos"]
    assert "teacher" not in json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())


def _same(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("time_s", "step_time_s")}


def test_with_enough_own_demos_the_teacher_is_not_asked_and_the_history_is_the_same(tmp_path):
    """The existing bootstrap test's run (six alpha replies pass): teacher on changes nothing."""
    kw = dict(batch_size=8, demos_max=2, screen_size=4, proposals=1)
    off = run(tmp_path / "off", ToyTask(), canned_analyst(), ScriptedModel(format_learner), **kw)
    optimizer = teacher()
    target = ScriptedModel(format_learner)
    on = run(tmp_path / "on", ToyTask(), optimizer, target, teacher_demos=4, **kw)
    assert not any(is_teacher(m) for m in optimizer.calls)
    assert [_same(r) for r in history(tmp_path / "on")] == [
        _same(r) for r in history(tmp_path / "off")
    ][:1] + [
        {**_same(r), "demos": {**r["demos"], "teacher": {}}} for r in history(tmp_path / "off")[1:]
    ]
    assert on.best_demos == off.best_demos and on.val_best.solved == off.val_best.solved == 11


def test_the_budget_counts_the_teacher_calls(tmp_path):
    optimizer = teacher()
    # baseline: 6 val calls; step 1: 2 train rollouts; the teacher gets one call before the cap
    result = run(tmp_path, beta_task(), optimizer, teacher_demos=2, budget=Budget(calls=9))
    assert result.stopped_by is not None and result.stopped_by.kind == "budget"
    assert result.usage["optimizer"]["calls"] == 1 == len(optimizer.calls)
    assert sum(u["calls"] for u in result.usage.values()) == 9


def test_a_no_demo_item_never_reaches_the_teacher(tmp_path):
    task = beta_task(train=4)
    for ex in task.splits["train"][:2]:  # train-000 (0 + 3), train-001 (1 + 10)
        ex.state["no_demo"] = "checked by an end user's correction"
    optimizer = teacher()
    run(tmp_path, task, optimizer, batch_size=4, teacher_demos=4)
    assert sorted(asked(optimizer)) == ["What is 2 + 17?", "What is 3 + 24?"]
    prompts = "\n".join(user_of(m) for m in optimizer.calls)
    assert "0 + 3" not in prompts and "1 + 10" not in prompts
    pool = json.loads((tmp_path / "demo_pool.json").read_text())
    assert {d["id"] for d in pool["demos"]} == {"train-002", "train-003"}


def test_each_item_is_asked_once_per_run(tmp_path):
    optimizer = teacher(right=set())  # always wrong: the pool stays short
    run(tmp_path, beta_task(), optimizer, epochs=3, teacher_demos=4)
    assert sorted(asked(optimizer)) == ["What is 0 + 3?", "What is 1 + 10?"]


# ---- what is not a demo ----------------------------------------------------------------------


class _Crashing(ToyTask):
    """A scorer that crashes on a teacher's worked reply (it holds '=')."""

    def score(self, output, example):
        if "=" in output:
            raise RuntimeError("scorer bug")
        return super().score(output, example)


@pytest.mark.parametrize(
    ("reply", "truncated", "status"),
    [
        ("<reply>Answer: {s}", False, "unreadable"),  # opened, never closed
        ("<reply> </reply>", False, "unreadable"),
        ("<reply>Answer: {s}</reply>", True, "truncated"),
        ("<reply>{a} + {b} = {s}\nAnswer: {s}</reply>", False, "scorer_error"),
        ("<reply>Answer: {s}</reply>", False, "demo"),  # the same reply, whole: a demo
    ],
)
def test_a_cut_off_unreadable_or_crashing_reply_is_no_demo(reply, truncated, status):
    ex = beta_task().splits["train"][0]
    a, b = 0, 3

    def write(messages):
        return Completion(
            text=reply.format(a=a, b=b, s=a + b), finish_reason="length" if truncated else "stop"
        )

    task = _Crashing(train={"beta": 2}, val={"beta": 6}, test={"beta": 3})
    done = run_sync(Teacher(ScriptedModel(write), task, SkillOptConfig()).write([ex], "", []))
    ((attempt, demo),) = done
    assert attempt.status == status and (demo is not None) == (status == "demo")
    if status == "scorer_error":
        assert "scorer bug" in attempt.why


def test_read_reply_takes_the_last_tagged_reply_or_the_whole_text():
    assert read_reply("a <reply>one</reply> b <reply> two </reply>") == "two"
    assert read_reply("Answer: 7") == "Answer: 7"
    assert read_reply("<reply>Answer: 7") is None and read_reply("   ") is None


def test_the_teacher_sees_other_items_references_never_its_own():
    task = beta_task(train=4)
    ex, other = task.splits["train"][0], task.splits["train"][1]
    shown = [
        Demo.of(ex.id, ex.input, "3", "reference"),
        Demo.of(other.id, other.input, "11", "reference"),
    ]
    prompt = Teacher(ScriptedModel(str), task, SkillOptConfig()).render(ex, "rule one", shown)
    assert "Expected answer: 11" in prompt and "Expected answer: 3" not in prompt
    assert "rule one" in prompt and task.instructions in prompt


def test_teacher_demos_rank_after_own_replies_and_before_references():
    pool = [
        Demo.of("r", "q1", "7", "reference"),
        Demo.of("t", "q2", "2 + 5 = 7\nAnswer: 7", "teacher"),
        Demo.of("b", "q3", "Answer: 7", "bootstrap"),
    ]
    moves = propose_sets([], pool, 3, 5, random.Random(0), set(), stratify=False)
    fresh = next(demos for demos, why in moves if why.startswith("fresh set"))
    assert [d.source for d in fresh] == ["bootstrap", "teacher", "reference"]
    check = LeakCheck([])
    held = DemoPool()
    held.add([Demo.of("x", "q", "7", "reference")], check)
    held.add([Demo.of("x", "q", "Answer: 7", "teacher")], check)
    assert held.demos["x"].source == "teacher"
    held.add([Demo.of("x", "q", "Answer: 7!", "bootstrap")], check)
    held.add([Demo.of("x", "q", "Answer: 7?", "teacher")], check)
    assert held.demos["x"].source == "bootstrap"


def test_teacher_demos_must_not_be_negative():
    with pytest.raises(ValueError, match="teacher_demos"):
        SkillOptConfig(teacher_demos=-1)
    assert SkillOptConfig().teacher_demos == 0


def test_a_skill_file_with_a_teacher_demo_round_trips():
    demo = Demo.of("t1", "What is 2 + 2?", "2 + 2 = 4\nAnswer: 4", "teacher")
    assert split_skill(join_skill("rules", [demo])).demos == (demo,)


# ---- a night: the same no_demo rule ------------------------------------------------------------


def _night_teacher() -> ScriptedModel:
    """A night's analyst: no edits, and the right bare sum to every teacher prompt."""
    return teacher(reply=lambda a, b: f"<reply>{a + b}</reply>")


def _fill_referenced(home, n: int) -> None:
    """Rows whose reference was known when logged (the operator's data, no correction)."""
    log = TaskLog(home / "log.db")
    for i in range(n):
        a, b = i + 1, 7 * i + 3
        q = f"[needs alpha] What is {a} + {b}?"
        log.add(
            Interaction(
                messages=[{"role": "user", "content": q}],
                reply=f"{a + b + 1}",
                project="demo",
                source="proxy",
                reference=str(a + b),
            )
        )
    log.close()


def test_a_nights_no_demo_train_task_never_reaches_the_teacher(tmp_path):
    training = SkillOptConfig(epochs=1, batch_size=16, gate=GateConfig(), teacher_demos=8)
    # the operator's own rows: the target fails them, the teacher is asked, its replies pass
    _fill_referenced(tmp_path / "ops", 12)
    analyst = _night_teacher()
    cfg = config(tmp_path / "ops", since=0, training=training)
    run_night(cfg, models=models(ScriptedModel(few_shot), analyst))
    assert asked(analyst)
    pool = json.loads(next((tmp_path / "ops").rglob("demo_pool.json")).read_text())
    assert "teacher" in {d["source"] for d in pool["demos"]}
    # the same questions, each checked by an end user's correction: no_demo, never asked
    users = tmp_path / "users"
    fill_log(users, ["alpha"] * 12, feedback_by="key:someone")
    analyst = _night_teacher()
    (night,) = run_night(
        config(users, since=0, training=training), models=models(ScriptedModel(few_shot), analyst)
    )
    assert night.splits.train > 0 and analyst.calls  # the night ran and its analyst was asked
    assert not any(is_teacher(m) for m in analyst.calls)
    tasks = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    train = [t for t in tasks if t["split"] == "train"]
    assert train and all(t["no_demo"] for t in train)
    pool = json.loads((night.night_dir / "demo_pool.json").read_text())
    assert pool["demos"] == [] and "teacher_asked" not in pool


# ---- the embedded model as target and teacher ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_teacher_demos_end_to_end_on_the_local_model(tmp_path):
    """SmolLM2-135M as both target and teacher on a tiny chain_sum: the run completes, and
    every teacher demo in the pool is one the task's own scorer passes."""
    spec = "gym:chain_sum?max_terms=3&max_digits=1"
    sizes = {"train_size": 12, "val_size": 8, "test_size": 4}
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["optimize", "--task", spec, "--model", "local", "--optimizer-model", "local"]
        + ["--proposals", "0", "--teacher-demos", "6", "--epochs", "1", "--batch-size", "12"]
        + ["--screen-size", "4", "--max-tokens", "48", "--output", str(out)]
        + [f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    row = history(out)[1]
    asked_n = sum(row["demos"].get("teacher", {}).values())
    assert summary["usage"].get("optimizer", {}).get("calls", 0) == asked_n
    task = load_task(spec, **sizes)
    train = {e.id: e for e in task.examples("train")}
    pool = json.loads((out / "demo_pool.json").read_text())
    for d in pool["demos"]:
        assert d["id"] in train
        if d["source"] == "teacher":
            assert task.score(d["reply"], train[d["id"]]).hard == 1
