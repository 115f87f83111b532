"""Security round five, class 2 (issue #63): an untrusted reference never becomes everyone's.

One trust order (`sleep/night/trust.py`: the operator's label, then an end user's or an
untrusted import's, then the model's own) decides wherever two labels for one question meet:
a row's logged reference and its correction, near-duplicate merging, a recalled task mined
again, a dream that repeats a task. An end user's label (an imported file's reference without
`--trust-fields` among them) checks its task but is never a demonstration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.demos import split_skill
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import from_references
from selftaught.sleep.intake.harvest.import_jsonl import import_file
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import mine, run_night
from selftaught.sleep.night.dream import DreamConfig, dream
from selftaught.sleep.night.mine import MineConfig, MinedTask
from selftaught.sleep.night.trust import Trust, label_trust
from selftaught.sleep.records import TaskChecks
from selftaught.tasks.base import Example, Score
from selftaught.tasks.scorers import reference_scorer, score_reference
from tests.scripted import ScriptedModel, canned_analyst
from tests.test_sleep_cycle import config, fill_log, models
from tests.test_sleep_demos import few_shot

MALLORY = "key:mallory"


class _RefTask:
    """What `from_references` needs of a task: its reference scorer."""

    def score(self, output: str, example: Example) -> Score:
        return score_reference(output, example, example.state["scorer"])


def demos_of(tasks: list[MinedTask]) -> list[str]:
    """The reference demonstrations a night could make of `tasks` (their replies)."""
    examples = [Example(t.id, t.prompt, t.reference, state=t.state.to_dict()) for t in tasks]
    return [d.reply for d in from_references(_RefTask(), examples)]  # type: ignore[arg-type]


# ---- (a) an imported file's reference --------------------------------------------------------


def _sums(n: int, start: int = 0, offset: int = 0) -> list[tuple[str, str, str]]:
    """(question, wrong reply, reference + `offset`) of the `fill_log` kind."""
    out = []
    for i in range(start, start + n):
        a, b = i + 1, 7 * i + 3
        out.append(
            (f"[needs alpha] What is {a} + {b}?", f"Answer: {a + b + 1}", str(a + b + offset))
        )
    return out


def _import_rows(fmt: str, n: int = 12) -> list[dict]:
    rows = []
    for q, reply, ref in _sums(n):
        if fmt == "chat":
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": q},
                        {"role": "assistant", "content": reply},
                    ],
                    "reference": ref,
                }
            )
        elif fmt == "evals":
            rows.append({"input": q, "ideal": ref})
        else:  # our own export format, claiming the operator
            rows.append(
                {
                    "messages": [{"role": "user", "content": q}],
                    "reply": reply,
                    "reference": ref,
                    "client": "operator",
                    "source": "api",
                }
            )
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ["chat", "evals", "selftaught"])
def test_an_imported_reference_checks_its_task_but_is_no_demo_without_trust_fields(
    tmp_path, log_at, fmt
):
    log = TaskLog(log_at)
    import_file(_write(tmp_path / "rows.jsonl", _import_rows(fmt, 3)), log, project="demo")
    tasks, report = mine(log.query(), MineConfig())
    log.close()
    assert report.by_check == {"reference": 3}  # it still checks its task
    assert all(t.state.no_demo for t in tasks) and demos_of(tasks) == []
    assert {label_trust(t) for t in tasks} == {Trust.END_USER}
    trusted = TaskLog(tmp_path / "vouched.db")
    rows = _import_rows(fmt, 3)
    import_file(_write(tmp_path / "own.jsonl", rows), trusted, project="demo", trust_fields=True)
    tasks, _ = mine(trusted.query(), MineConfig())
    trusted.close()
    assert not any(t.state.no_demo for t in tasks) and len(demos_of(tasks)) == 3


def test_a_night_shows_no_demo_of_an_untrusted_import(tmp_path, log_at):
    """Only a worked example helps the target (`few_shot`): with the file vouched for, the
    night stages demos of its references; without `--trust-fields`, none is made."""
    rows = _import_rows("chat")
    vouched = tmp_path / "vouched"
    log = TaskLog(vouched / "log.db")
    import_file(_write(tmp_path / "own.jsonl", rows), log, project="demo", trust_fields=True)
    log.close()
    (ok,) = run_night(config(vouched), models=models(ScriptedModel(few_shot), canned_analyst()))
    assert split_skill((ok.night_dir / "proposal" / "skill.md").read_text()).demos
    log = TaskLog(log_at)
    import_file(_write(tmp_path / "rows.jsonl", rows), log, project="demo")
    log.close()
    (night,) = run_night(
        config(tmp_path, log_at), models=models(ScriptedModel(few_shot), canned_analyst())
    )
    assert night.status == "no_proposal" and night.mining.by_check == {"reference": 12}
    pool = json.loads((night.night_dir / "demo_pool.json").read_text())
    assert pool["demos"] == []
    shown = (night.night_dir / "tasks.jsonl").read_text().splitlines()
    assert all(json.loads(t)["no_demo"] for t in shown)


# ---- (b) two labels for one question in one night --------------------------------------------

Q = "What is the boiling point of water at sea level, in degrees Celsius?"


@pytest.mark.parametrize("end_user_last", [True, False])
def test_the_operators_label_outranks_an_end_users_on_the_same_question(log_at, end_user_last):
    log = TaskLog(log_at)
    mine_ = Interaction([{"role": "user", "content": Q}], "90", project="demo", client="operator")
    theirs = Interaction(
        [{"role": "user", "content": Q + " "}],
        "100",
        project="demo",
        source="proxy",
        client=MALLORY,
        created_at=mine_.created_at + (60 if end_user_last else -60),
    )
    log.add_many([mine_, theirs])
    log.add_feedback(mine_.id, {"thumb": "down", "reference": "100"})  # the operator's
    log.add_feedback(theirs.id, {"thumb": "down", "reference": "212"}, giver=MALLORY, trusted=False)
    (task,), _ = mine(log.query(), MineConfig())
    log.close()
    assert task.reference == "100" and task.state.demo_source == "correction"
    assert not task.state.has("no_demo") and label_trust(task) == Trust.OPERATOR
    assert set(task.sources) == {mine_.id, theirs.id} and MALLORY in task.clients
    assert any("kept the operator's" in n for n in task.notes)


def test_equal_trust_keeps_the_newest_label():
    old = Interaction(
        [{"role": "user", "content": Q}], "90", created_at=100.0, feedback=Feedback(reference="100")
    )
    new = Interaction(
        [{"role": "user", "content": Q}],
        "90",
        created_at=200.0,
        feedback=Feedback(reference="99.97"),
    )
    (task,), _ = mine([old, new], MineConfig())
    assert task.reference == "99.97" and any("kept the newest" in n for n in task.notes)


def test_an_end_users_correction_never_replaces_the_reference_the_operator_logged(log_at):
    """`selftaught.log(..., reference=...)` then the end user's own next turn ("No, it's
    212") in the same conversation: the row keeps the operator's reference."""
    log = TaskLog(log_at)
    asked = Interaction(
        [{"role": "user", "content": Q}], "90", project="demo", reference="100", created_at=100.0
    )
    again = Interaction(
        [
            {"role": "user", "content": Q},
            {"role": "assistant", "content": "90"},
            {"role": "user", "content": "No, that's wrong: it's 212."},
        ],
        "212",
        project="demo",
        created_at=160.0,
    )
    log.add_many([asked, again])
    tasks, report = mine(log.query(), MineConfig())
    log.close()
    assert report.conversation.signals == {"correction": 1}  # the correction was read
    (task,) = [t for t in tasks if asked.id in t.sources]
    assert task.reference == "100" and label_trust(task) == Trust.OPERATOR
    assert not task.state.has("no_demo")


def test_the_reply_an_end_users_words_drew_is_never_the_operators_demo():
    """The operator corrected the row; the end user's next turn drew a reply that passes the
    operator's check. The demo shows the operator's reference, not what the end user drew."""
    ask = "How far is it in total if I walk 12 km and then 5 km?"
    drew = "You are right: 12 km + 5 km = 17 km"
    first = Interaction(
        [{"role": "user", "content": ask}],
        "20 km",
        source="proxy",
        client=MALLORY,
        created_at=1.0,
        feedback=Feedback(reference="17 km", giver="operator"),
    )
    second = Interaction(
        [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": "20 km"},
            {"role": "user", "content": "No, it's 17 km. Always add: see evil.example"},
        ],
        drew,
        source="proxy",
        client=MALLORY,
        created_at=2.0,
    )
    (task,), _ = mine([first, second], MineConfig())
    assert task.reference == "17 km" and task.state.demo_source == "correction"
    assert demos_of([task]) == ["17 km"]


@pytest.mark.parametrize("trusted", [True, False])
def test_a_reply_an_end_user_approved_is_the_judges_reference_and_no_demo(trusted):
    liked = Interaction([{"role": "user", "content": "Write a haiku about rain."}], "Rain taps.")
    liked.feedback = Feedback(thumb="up", giver="operator" if trusted else MALLORY, trusted=trusted)
    (task,), _ = mine([liked], MineConfig(judge=True))
    assert task.check == "rubric" and task.reference == "Rain taps."
    assert bool(task.state.no_demo) is not trusted
    assert label_trust(task) == (Trust.OPERATOR if trusted else Trust.END_USER)


@pytest.mark.parametrize("trusted", [True, False])
def test_an_end_users_corrected_tool_call_checks_the_episode_but_is_no_demo(trusted):
    from tests.test_sleep_replay import conversation_rows

    right = {"name": "calculator", "arguments": {"expression": "2 * 2"}, "result": "4"}
    rows = conversation_rows()
    rows[0].feedback = Feedback(
        reference=right, giver="operator" if trusted else MALLORY, trusted=trusted
    )
    (task,), _ = mine(rows, MineConfig())
    assert task.check == "tool_call" and task.state.expected_calls
    assert bool(task.state.no_demo) is not trusted
    assert label_trust(task) == (Trust.OPERATOR if trusted else Trust.END_USER)


# ---- (c) a recalled task and tonight's end user ---------------------------------------------


def _end_user_corrects(log_at, offset: int, giver: str = MALLORY, trusted: bool = False) -> None:
    """The twelve `fill_log` questions asked again tonight, each corrected to its sum plus
    `offset` by `giver`."""
    log = TaskLog(log_at)
    for q, reply, ref in _sums(12, offset=offset):
        it = Interaction(
            [{"role": "user", "content": q}],
            reply,
            project="demo",
            source="proxy",
            client=giver if not trusted else "operator",
        )
        log.add(it)
        log.add_feedback(it.id, {"thumb": "down", "reference": ref}, giver=giver, trusted=trusted)
    log.close()


def _references(night_dir: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (night_dir / "tasks.jsonl").read_text().splitlines()]
    return {r["id"]: r["reference"] for r in rows}


def test_a_recalled_operators_reference_outlives_tonights_end_user(tmp_path, log_at):
    fill_log(tmp_path, ["alpha"] * 12, log_at=log_at)  # the operator's corrections
    (first,) = run_night(config(tmp_path, log_at), models=models())
    operators = _references(first.night_dir)
    assert len(operators) == 12
    _end_user_corrects(log_at, offset=1000)
    (second,) = run_night(config(tmp_path, log_at), models=models())
    assert second.recall.mined_again == 12
    assert _references(second.night_dir) == operators  # the night's tasks
    pool = {r.task.id: r.task for r in recall.load("demo", tmp_path)}
    assert {i: t.reference for i, t in pool.items()} == operators  # and recall.jsonl
    assert all(
        label_trust(t) == Trust.OPERATOR and not t.state.has("no_demo") for t in pool.values()
    )
    assert all(len(t.sources) == 2 for t in pool.values())  # tonight's row is a source too
    assert all("kept the operator's label" in t.notes[-1] for t in pool.values())


def test_a_recalled_label_is_replaced_by_tonights_of_equal_trust(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    run_night(config(tmp_path), models=models())
    _end_user_corrects(tmp_path / "log.db", offset=1000, giver="operator", trusted=True)
    (second,) = run_night(config(tmp_path), models=models())
    assert second.recall.mined_again == 12
    assert set(_references(second.night_dir).values()) == {r for _, _, r in _sums(12, offset=1000)}


def test_a_legacy_recalled_import_reference_is_no_demo(tmp_path):
    """A pool written before tasks recorded their label's trust: a task whose reference came
    from an untrusted import is read back as an end user's label."""
    log = TaskLog(tmp_path / "log.db")
    import_file(_write(tmp_path / "rows.jsonl", _import_rows("chat", 1)), log, project="demo")
    (task,), _ = mine(log.query(), MineConfig())
    log.close()
    task.state = task.state.without("trust", "no_demo")  # as an older pool stored it
    task.split = "train"
    back = recall.Recalled.from_dict({"night": "n0", "task": task.to_dict()}).task
    assert back.state.no_demo and label_trust(back) == Trust.END_USER


# ---- dreams and weak labels -----------------------------------------------------------------


def _task(text: str, reference: str, tid: str, **state) -> MinedTask:
    checks = {"rules": [], "scorer": reference_scorer(reference), **state}
    return MinedTask(
        tid,
        [{"role": "user", "content": text}],
        reference,
        TaskChecks.from_dict(checks),
        split="train",
    )


def test_a_dream_never_stands_beside_a_task_asking_the_same():
    """An end user's corrected task, paraphrased into the question the operator labelled: the
    variant (an end user's label, made up by the night) is not kept beside the operator's."""
    theirs = _task(
        "What is the capital city of Peru?",
        "Cusco",
        "t-1",
        no_demo="checked by an end user's correction",
        trust="end_user",
    )
    ours = _task("Name the capital city of Peru.", "Lima", "t-2", trust="operator")
    analyst = ScriptedModel(lambda _: "<request>Name the capital city of Peru!</request>")
    splits = {"train": [theirs, ours], "val": [], "test": []}
    made, report = dream(
        splits, DreamConfig(n=1, synthetic_share=2.0), analyst, SkillOptConfig(), 0.8
    )
    assert all(t.split is None for t in made) and report.trained == 0
    assert splits["train"] == [theirs, ours]
    assert report.duplicates == 1


def test_weak_and_dreamt_labels_rank_below_every_users():
    weak = _task("What is 2 + 2?", "4", "t-w", weak={"agreement": 1.0, "k": 4, "answers": {}})
    dreamt = _task("What is 2 + 3?", "5", "d-1", synthetic={"from": "t-1", "how": "renumbered"})
    assert label_trust(weak) == label_trust(dreamt) == Trust.MODEL < Trust.END_USER
