"""Unlabeled traffic: threads, the user's next turn read as feedback, re-asks, and the tasks a
night mines from them (the conversation up to the judged request, the trust model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.sleep.intake.harvest.import_jsonl import import_file
from selftaught.sleep.intake.log import OPERATOR, TRUSTED_WORDS, Feedback, Interaction, TaskLog
from selftaught.sleep.intake.threads import build_threads
from selftaught.sleep.night.cycle import mine
from selftaught.sleep.night.followup import read_followup
from selftaught.sleep.night.mine import MineConfig
from selftaught.sleep.night.signals import (
    REDONE,
    read_threads,
    rejected_signals,
    review_signals,
)

FIXTURES = Path(__file__).parent / "fixtures"
Q = "How far is it in total if I walk 12 km and then 5 km?"
WRONG = "You walk a total of 20 kilometers."
CORRECTION = "No, that's wrong: it's 17 km. Please answer with just the number and km."


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def row(messages: list[dict[str, str]], reply: str, at: float, **kw) -> Interaction:
    kw.setdefault("client", "key:alice")
    return Interaction(messages=messages, reply=reply, created_at=at, source="proxy", **kw)


def chat_app_rows(client: str = "key:alice", **kw) -> list[Interaction]:
    """A chat app that resends the history: the question, then the user's correction."""
    first = row([user(Q)], WRONG, 100.0, client=client, **kw)
    second = row([user(Q), assistant(WRONG), user(CORRECTION)], "17 km", 160.0, client=client, **kw)
    return [first, second]


# ---- threads -------------------------------------------------------------------------------


def test_a_row_that_resends_another_rows_history_continues_its_thread():
    first, second = chat_app_rows()
    other = row([user("What is 2 + 2?")], "4", 120.0)
    threads = build_threads([first, other, second])
    assert [len(t.rows) for t in threads] == [2, 1]
    thread = threads[0]
    assert [r.id for r in thread.rows] == [first.id, second.id] and thread.how == "history"
    turn = thread.turns[0]
    assert turn.row_id == first.id and turn.reply == WRONG
    assert turn.followup == CORRECTION and turn.followup_row == second.id
    assert thread.turns[1].row_id == second.id and thread.turns[1].followup is None


def test_another_client_resending_the_same_history_does_not_join_the_thread():
    first, _ = chat_app_rows(client="key:alice")
    _, bobs = chat_app_rows(client="key:bob")
    threads = build_threads([first, bobs])
    assert [len(t.rows) for t in threads] == [1, 1]
    bob_thread = next(t for t in threads if t.head.id == bobs.id)
    assert bob_thread.turns[0].row_id is None  # bob's history is his own, not alice's row


def test_a_conversation_inside_one_row_has_its_turns():
    one = row([user(Q), assistant(WRONG), user(CORRECTION)], "17 km", 100.0)
    (thread,) = build_threads([one])
    assert [t.reply for t in thread.turns] == [WRONG, "17 km"]
    assert thread.turns[0].row_id is None and thread.turns[0].followup == CORRECTION


# ---- tasks from corrections ----------------------------------------------------------------


def test_a_correction_becomes_a_task_whose_prompt_ends_before_the_feedback_turn():
    tasks, report = mine(chat_app_rows(), MineConfig())
    assert report.tasks == 1 and report.dropped == {REDONE: 1}
    (task,) = tasks
    assert task.messages == [user(Q)]
    assert all("17" not in str(m["content"]) for m in task.messages)
    assert task.reference == "17 km" and task.state.scorer == "quantity"
    assert task.negative and task.logged_reply == WRONG
    conv = report.conversation
    assert conv is not None and conv.linked_threads == 1 and conv.signals == {"correction": 1}
    assert conv.untrusted == 1 and conv.redo_turns == 1


def test_an_end_users_correction_checks_the_task_but_is_evidence_only():
    (task,), _ = mine(chat_app_rows(), MineConfig())
    assert task.state.no_demo
    assert not task.state.has("demo_source") and not task.state.has("comment")
    assert json.loads(task.state.evidence) == CORRECTION  # quoted for the analyst
    assert task.state.rules == ()  # an end user's restated rule states no rule


def test_the_operators_own_correction_is_a_demo_and_its_rule_a_check():
    rows = chat_app_rows(meta={TRUSTED_WORDS: True})
    (task,), report = mine(rows, MineConfig())
    assert task.state.demo_source == "correction" and not task.state.has("no_demo")
    assert task.state.comment == CORRECTION
    assert [(r["kind"], r["arg"]) for r in task.state.rules] == [("just_number", "km")]
    assert report.conversation.trusted == 1


def test_explicit_feedback_on_the_row_wins_over_the_conversation():
    first, second = chat_app_rows()
    first.feedback = Feedback(reference="18 km", giver=OPERATOR, trusted=True)
    (task,), _ = mine([first, second], MineConfig())
    assert task.reference == "18 km" and task.state.demo_source == "correction"


def test_a_rejection_a_rule_and_an_acceptance_each_label_their_reply():
    rows = [
        row([user("Fix my test.")], "Change line 3.", 10.0),
        row(
            [user("Fix my test."), assistant("Change line 3."), user("that still fails")], "ok", 20
        ),
    ]
    rows += [
        row([user("Summarize the plot of Hamlet.")], "A long summary " * 20, 30.0, client="k2"),
        row(
            [
                user("Summarize the plot of Hamlet."),
                assistant("A long summary " * 20),
                user("In under 20 words please."),
            ],
            "Prince avenges father.",
            40.0,
            client="k2",
        ),  # fmt: skip
    ]
    _, signals, report = read_threads(rows, MineConfig())
    assert [s.kind for s in signals] == ["rejection", "rule"]
    assert report.signals == {"rejection": 1, "rule": 1}
    assert signals[0].words == "that still fails" and signals[0].thumb == "down"


def test_the_operator_can_reject_a_signal_before_a_night_uses_it(tmp_path: Path):
    rows = chat_app_rows()
    _, (signal,), _ = read_threads(rows, MineConfig())
    assert review_signals("demo", tmp_path, [signal.id]) == 1
    assert rejected_signals("demo", tmp_path) == {signal.id}
    tasks, report = mine(rows, MineConfig(), rejected_signals("demo", tmp_path))
    assert report.conversation.rejected_by_operator == 1
    assert report.conversation.signals == {} and report.by_check.get("reference") is None
    # not a correction any more: the next request is an ordinary one (its own rule checks it)
    assert [t.logged_reply for t in tasks] == ["17 km"]


def test_conversation_reading_can_be_turned_off():
    tasks, report = mine(chat_app_rows(), MineConfig(conversation=False, reask_window_s=0))
    assert report.conversation.signals == {}
    assert "no reference" in next(iter(report.dropped))


# ---- right answers the user accepts ----------------------------------------------------------

THANKS = "Thanks, that's right."


def accepted_rows(reply: str, trusted: bool) -> list[Interaction]:
    """The user thanks the reply, then says goodbye (a row nothing checks)."""
    meta = {TRUSTED_WORDS: True} if trusted else {}
    first = row([user(ASK)], reply, 1.0, meta=meta)
    second = row([user(ASK), assistant(reply), user(THANKS)], "Glad to help!", 2.0, meta=meta)
    return [first, second]


def demos_of(task) -> list[str]:
    from selftaught.skill.demo_search import from_references
    from selftaught.tasks.base import Example
    from selftaught.tasks.scorers import SCORERS

    class Task:
        def score(self, output, example):
            return SCORERS[example.state["scorer"]](output, example)

    ex = Example(task.id, task.prompt, task.reference, state=task.state.to_dict())
    return [d.reply for d in from_references(Task(), [ex])]


def test_a_trusted_users_thanks_makes_the_reply_the_tasks_reference():
    (task,), report = mine(accepted_rows("17 km", trusted=True), MineConfig())
    assert report.conversation.signals == {"acceptance": 1}
    assert task.messages == [user(ASK)] and not task.negative
    assert task.reference == "17 km" and task.state.scorer == "quantity"
    assert task.state.trust == "operator" and not task.state.has("no_demo")
    assert demos_of(task) == ["17 km"]  # the trusted user's own verdict: it may teach


def test_an_end_users_thanks_checks_the_task_but_gives_no_demo():
    (task,), _ = mine(accepted_rows("17 km", trusted=False), MineConfig())
    assert task.reference == "17 km" and task.state.scorer == "quantity"
    assert task.state.trust == "end_user" and task.state.no_demo
    assert demos_of(task) == []


def test_an_accepted_answer_is_a_reference_only_where_it_is_short_enough_to_check():
    for judge in (False, True):  # a number is the answer, judge or not
        tasks, _ = mine(accepted_rows("Answer: 4312", trusted=True), MineConfig(judge=judge))
        (task,) = [t for t in tasks if t.messages == [user(ASK)]]
        assert task.reference == "4312" and task.state.scorer == "numeric"
        assert demos_of(task) == ["Answer: 4312"]  # the reply the user accepted, whole
    (word,), _ = mine(accepted_rows("Canberra", trusted=True), MineConfig())
    assert word.reference == "Canberra" and word.state.scorer == "normalized"
    tasks, _ = mine(accepted_rows("Canberra", trusted=True), MineConfig(judge=True))
    (word,) = [t for t in tasks if t.messages == [user(ASK)]]
    assert word.state.rubric  # a word may be one right answer of several: the judge's
    prose = "You walk a total of seventeen kilometres, a nice long walk."
    tasks, report = mine(accepted_rows(prose, trusted=True), MineConfig())
    assert tasks == [] and all(why.startswith("no reference") for why in report.dropped)
    tasks, _ = mine(accepted_rows(prose, trusted=True), MineConfig(judge=True))
    (judged,) = [t for t in tasks if t.messages == [user(ASK)]]
    assert judged.state.rubric and judged.reference == prose  # the judge's, as before


# ---- re-asks -------------------------------------------------------------------------------


def reask_rows(gap: float, second: str = "key:alice") -> list[Interaction]:
    return [
        row([user("What is the capital of Australia?")], "Sydney", 100.0),
        row([user("what is the capital of australia")], "Canberra", 100 + gap, client=second),
    ]


@pytest.mark.parametrize(
    ("gap", "client", "marked"),
    [(60.0, "key:alice", True), (7200.0, "key:alice", False), (60.0, "key:bob", False)],
)
def test_the_same_request_again_from_the_same_user_in_time_marks_the_first_reply(
    gap: float, client: str, marked: bool
):
    rows, signals, _ = read_threads(reask_rows(gap, client), MineConfig())
    assert [s.kind for s in signals] == (["reask"] if marked else [])
    first = next(r for r in rows if r.reply == "Sydney")
    assert (first.feedback.thumb == "down") is marked
    if marked:
        assert signals[0].row_id == first.id and "australia" in signals[0].words


def test_a_reask_names_the_end_user_the_app_sends():
    rows = reask_rows(60.0)
    rows[0].meta = {"request": {"user": "u1"}}
    rows[1].meta = {"request": {"user": "u2"}}
    _, signals, _ = read_threads(rows, MineConfig())
    assert signals == []  # two people behind one app key asked the same thing


# ---- the reproducer: imported chats --------------------------------------------------------


def _chats(path: Path, corrected: int, plain: int) -> Path:
    lines = []
    for i in range(corrected + plain):
        a, b = 3 + i, 20 + 2 * i
        q = f"How far is it in total if I walk {a} km and then {b} km?"
        msgs = [user(q)]
        if i < corrected:
            msgs += [
                assistant(f"You walk a total of {a + b + 3} kilometers."),
                user(f"No, that's wrong: it's {a + b} km. Please answer with just the number."),
                assistant(f"{a + b} km"),
            ]
        else:
            msgs.append(assistant(f"The total is {a + b} km."))
        lines.append(json.dumps({"messages": msgs}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("trust", [False, True])
def test_imported_chats_corrected_in_the_next_turn_give_tasks(tmp_path: Path, trust: bool):
    chats = _chats(tmp_path / "chats.jsonl", corrected=30, plain=28)
    with TaskLog(tmp_path / "log.db") as log:
        import_file(chats, log, project="chat", trust_fields=trust)
        rows = log.query()
    tasks, report = mine(rows, MineConfig())
    assert report.tasks == 30 and report.by_check == {"reference": 30}
    assert report.conversation.signals == {"correction": 30}
    assert all(t.messages[-1]["content"].startswith("How far") for t in tasks)
    assert all(len(t.messages) == 1 for t in tasks)
    if trust:
        assert all(t.state.demo_source == "correction" for t in tasks)
        assert report.conversation.trusted == 30
    else:
        assert all(t.state.no_demo for t in tasks)
        assert report.conversation.untrusted == 30


def test_an_untrusted_file_cannot_claim_trusted_words(tmp_path: Path):
    path = tmp_path / "claims.jsonl"
    line = {"messages": [user(Q)], "reply": WRONG, "meta": {TRUSTED_WORDS: True}}
    path.write_text(json.dumps(line) + "\n")
    with TaskLog(tmp_path / "log.db") as log:
        import_file(path, log, project="chat")
        (it,) = log.query()
    assert TRUSTED_WORDS not in it.meta and it.meta["import_claims"][TRUSTED_WORDS] is True


# ---- the follow-up reader ------------------------------------------------------------------


def _corpus(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


@pytest.mark.parametrize("item", _corpus("followups_dev.jsonl"), ids=lambda d: d["followup"][:40])
def test_the_follow_up_reader_on_its_dev_corpus(item: dict):
    read = read_followup(item["followup"], item["reply"])
    assert (read.kind if read else "none") == item["kind"]
    if item["kind"] == "correction":
        assert read is not None and read.reference == item["reference"]


def test_yes_or_no_after_a_question_of_the_assistant_is_an_answer_not_feedback():
    assert read_followup("no, skip that", "Shall I also update the docs?") is None
    assert read_followup("No, skip that", "Updated the docs.") is not None


# ---- through the proxy: a chat app that resends its history ------------------------------


ASK = "Add 12 km and 5 km."


@pytest.mark.parametrize("trusted", [(), ("*",)])
def test_a_chat_app_correcting_in_the_next_turn_through_the_proxy(tmp_path, log_at, trusted):
    pytest.importorskip("fastapi")
    import openai

    from tests.fake_upstream import fake_proxy

    with fake_proxy(tmp_path / "home", log_at, trusted_clients=trusted) as (url, app, _):
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=20)
        history = [user(ASK)]  # the fake upstream echoes it: a reply that asks nothing
        first = client.chat.completions.create(model="fake-model", messages=history)
        history += [assistant(first.choices[0].message.content), user(CORRECTION)]
        client.chat.completions.create(model="fake-model", messages=history)
        app.state.proxy.writer.flush(30)
    rows = TaskLog(log_at).query()
    assert len(rows) == 2 and all((TRUSTED_WORDS in r.meta) == bool(trusted) for r in rows)
    (task,), report = mine(rows, MineConfig())
    assert task.messages == [user(ASK)] and task.reference == "17 km"
    assert report.conversation.linked_threads == 1
    if trusted:
        assert task.state.demo_source == "correction"
    else:
        assert task.state.no_demo


def test_named_trusted_clients_need_client_keys(tmp_path):
    from selftaught.sleep.intake.proxy import ProxyConfig, ProxyError

    with pytest.raises(ProxyError, match="--client-keys"):
        ProxyConfig(upstream="http://127.0.0.1:1#m", trusted_clients=("alice",))


# ---- a whole night on unlabeled traffic (scripted models) ---------------------------------


def test_a_night_on_unlabeled_chats_learns_from_the_next_turn(tmp_path, log_at):
    from selftaught.sleep.night.cycle import run_night
    from tests.test_sleep_cycle import ALPHA_NIGHT, config, models

    log = TaskLog(log_at)
    for i, rule in enumerate(ALPHA_NIGHT):
        a, b = i + 1, 7 * i + 3
        q, wrong = f"[needs {rule}] What is {a} + {b}?", f"Answer: {a + b + 1}"
        said = f"No, that's wrong: it's {a + b}."
        common = {"project": "demo", "source": "proxy", "client": "key:app"}
        log.add(Interaction([user(q)], wrong, created_at=1000.0 + i, **common))
        log.add(Interaction([user(q), assistant(wrong), user(said)], f"{a + b}",
                            created_at=1000.5 + i, **common))  # fmt: skip
    log.close()
    (night,) = run_night(config(tmp_path, log_at, since=0.0), models=models())
    assert night.status == "staged", night.report_dict().get("reason")
    report = json.loads((night.night_dir / "report.json").read_text())
    mining = report["mining"]
    assert mining["tasks"] == 12 and mining["by_check"] == {"reference": 12}
    assert mining["conversation"]["signals"] == {"correction": 12}
    assert mining["dropped"] == {REDONE: 12}
    tasks = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    assert all("wrong" not in t["prompt_head"] for t in tasks)
    assert all(t["signals"][0]["kind"] == "correction" for t in tasks)
    assert all(t["signals"][0]["words"].startswith("No, that's wrong") for t in tasks)
    md = (night.night_dir / "report.md").read_text()
    assert "12 correction" in md and "12 an end user's evidence" in md


def test_a_quiet_night_says_what_would_have_made_its_rows_tasks(tmp_path, log_at):
    from selftaught.sleep.night.cycle import run_night
    from tests.test_sleep_cycle import config, models

    log = TaskLog(log_at)
    for i in range(3):
        log.add(Interaction([user(f"Tell me a joke about {i} cats.")], "No.", project="demo",
                            source="proxy", created_at=1000.0 + i))  # fmt: skip
    log.close()
    (night,) = run_night(config(tmp_path, log_at, since=0.0), models=models())
    md = (night.night_dir / "report.md").read_text()
    assert "3 rows had no check" in md and "next turn" in md


def test_the_reply_an_operators_correction_drew_is_the_demo_when_it_passes_the_check():
    from selftaught.skill.demo_search import from_references
    from selftaught.tasks.base import Example
    from selftaught.tasks.scorers import quantity

    class Task:
        def score(self, output, example):
            return quantity(output, example)

    def drawn(reply: str, trusted: bool) -> list:
        meta = {TRUSTED_WORDS: True} if trusted else {}
        first = row([user(ASK)], "20 km", 1.0, meta=meta)
        second = row(
            [user(ASK), assistant("20 km"), user("No, it's 17 km.")], reply, 2.0, meta=meta
        )
        (task,), _ = mine([first, second], MineConfig())
        ex = Example(task.id, task.prompt, task.reference, state=task.state.to_dict())
        return [d.reply for d in from_references(Task(), [ex])]

    assert drawn("You are right: 12 km + 5 km = 17 km", trusted=True) == [
        "You are right: 12 km + 5 km = 17 km"
    ]
    assert drawn("Sorry, 18 km", trusted=True) == ["17 km"]  # it fails the check: the reference
    assert drawn("You are right: 12 km + 5 km = 17 km", trusted=False) == []  # an end user's


def test_the_reply_to_a_rejection_holding_a_number_is_not_a_task():
    said = "No, 17 km and 3 m is not right. Just the number and km."
    rows = [
        row([user(ASK)], "17 km and 3 m", 1.0),
        row([user(ASK), assistant("17 km and 3 m"), user(said)], "17 km", 2.0),
    ]
    tasks, report = mine(rows, MineConfig())
    assert report.conversation.signals == {"rejection": 1}
    assert report.dropped.get(REDONE) == 1
    assert all(len(t.messages) == 1 for t in tasks)  # nothing mined with the user's words in it


def test_two_corrections_in_the_same_words_are_not_a_reask():
    said = "No, that's wrong: it's 7 km."
    rows = []
    for i, q in enumerate(["Add 3 km and 4 km.", "Add 2 km and 5 km."]):
        rows += [
            row([user(q)], "9 km", 10.0 * i),
            row([user(q), assistant("9 km"), user(said)], "7 km", 10.0 * i + 1),
        ]
    _, signals, _ = read_threads(rows, MineConfig())
    assert sorted(s.kind for s in signals) == ["correction", "correction"]
