"""The miner that writes checks (`sleep/night/miner.py`): a scripted miner's check is kept only
when two-sided on the thread's evidence; "cannot check", a repaired reply, a pattern that runs
out of time (fails closed), a remote miner and a private row, the night's ledger and budget;
and, marked slow, the embedded model as miner (the plumbing only: a 135M model writes no
check)."""

from __future__ import annotations

import json
import time

import pytest

from selftaught.models.usage import Budget, TrackedModel, UsageLedger
from selftaught.sleep.intake.log import OPERATOR, Feedback, Interaction, TaskLog
from selftaught.sleep.night import checks
from selftaught.sleep.night.checks import (
    NO_REGEX_PACKAGE,
    Rule,
    describe_checks,
    pattern_problem,
)
from selftaught.sleep.night.cycle import NightConfig, NightModels, mine, run_night
from selftaught.sleep.night.mine import BARE_VERDICT, NO_CHECK, MineConfig
from selftaught.sleep.night.miner import (
    ONE_SIDED_BARE,
    Miner,
    MinerConfig,
    Pending,
    parse_check,
)
from selftaught.sleep.night.split import train_only
from selftaught.tasks.scorers import LlmJudge
from tests.scripted import ScriptedModel, canned_analyst, rule_target, user_of

Q = "What is the capital of Australia?"
WRONG, RIGHT = "Sydney.", "Canberra."


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def thread_row(
    q: str = Q, client: str = "key:alice", at: float = 100.0, thanks: str = "", **kw
) -> Interaction:
    """One chat: a reply the user rejects ("That's wrong."), the retry the user accepts, and
    a last reply nobody judged."""
    messages = [
        user(q),
        assistant(WRONG),
        user("That's wrong."),
        assistant(RIGHT),
        user(f"Thanks, that's right! {thanks}".strip()),
    ]
    kw.setdefault("project", "demo")
    return Interaction(
        messages=messages,
        reply="You're welcome.",
        created_at=at,
        source="proxy",
        client=client,
        **kw,
    )


def thumb_row(q: str, reply: str, thumb: str, at: float = 50.0, **kw) -> Interaction:
    kw.setdefault("project", "demo")
    return Interaction(
        messages=[user(q)],
        reply=reply,
        created_at=at,
        source="proxy",
        client=OPERATOR,
        feedback=Feedback(thumb=thumb),
        **kw,
    )


READS = "User's next message:"  # a next turn to read (`followup_model.py`)


def says(*replies: str | dict, reads: str = '{"kind": "none"}') -> ScriptedModel:
    """A scripted miner answering each call for a check with the next reply (the last one
    repeats; a dict is sent as JSON), and each next turn to read with `reads`."""
    texts = [r if isinstance(r, str) else json.dumps(r) for r in replies]
    asked: list[int] = []

    def answer(messages) -> str:
        if READS in user_of(messages):
            return reads
        asked.append(1)
        return texts[min(len(asked), len(texts)) - 1]

    return ScriptedModel(answer, "scripted-miner")


def checks_asked(model: ScriptedModel) -> list[list[dict]]:
    """The calls that asked for a check (not for reading a next turn)."""
    return [c for c in model.calls if READS not in user_of(c)]


def miner_of(model: ScriptedModel, **kw) -> Miner:
    """A miner that only writes checks (the next turns: `test_sleep_followup_model.py`)."""
    return Miner(
        model, "scripted-miner", MinerConfig(concurrent_calls=1, read_followups=False), **kw
    )


ANSWER = {"answer": {"kind": "text", "value": "Canberra"}, "why": "the user accepted Canberra"}


# ---- two-sided on the thread's evidence -----------------------------------------------------


def test_a_check_two_sided_on_the_thread_is_kept_and_checks_the_task():
    """The rejected reply and the accepted retry of one chat: the miner's answer passes the
    accepted reply and fails the rejected one, so the chat's request becomes a task (the retry,
    a reply to the user's verdict, is its evidence, never a task of its own)."""
    model = says(ANSWER)
    tasks, report = mine([thread_row()], MineConfig(), miner=miner_of(model))
    written = report.miner
    assert written.miner == "scripted-miner"
    assert written.asked == 1 and written.kept == 1 and written.refused == {}
    assert written.kept_parts == {"answer:text": 1} and written.parse_rate == 1.0
    assert report.tasks == len(tasks) >= 1 and not report.dropped.get(NO_CHECK)
    first = next(t for t in tasks if len(t.messages) == 1)  # the request the user rejected
    assert first.reference == "Canberra" and first.state.scorer == "normalized"
    mined = first.state.mined_check
    assert mined is not None and mined.by == "scripted-miner" and mined.tested_on == "both"
    assert first.state.no_demo  # an end user's verdict: checks the task, teaches nothing
    assert describe_checks(first.state) == "reference (normalized), written by scripted-miner"
    prompt = user_of(model.calls[0])
    assert f'the reply the user rejected: "{WRONG}"' in prompt
    assert f'the reply the user accepted: "{RIGHT}"' in prompt
    assert "That's wrong." in prompt and f'- user: "{Q}"' in prompt


def test_a_bare_rejection_becomes_a_task_only_two_sided_and_for_training():
    """ "That's wrong." gives no value: the miner's check makes the request a task only when
    the thread has both sides (here the retry the user accepted), and that task trains only.
    Without the accepted retry, the same check is one-sided and refused."""
    tasks, report = mine([thread_row()], MineConfig(), miner=miner_of(says(ANSWER)))
    (first,) = [t for t in tasks if len(t.messages) == 1]
    assert train_only(first) == BARE_VERDICT and first.state.bare_verdict.signal == "rejection"
    assert first.state.mined_check.tested_on == "both"
    lone = Interaction(
        messages=[user(Q), assistant(WRONG), user("That's wrong.")],
        reply="Sorry about that.",
        source="proxy",
        client="key:alice",
        project="demo",
    )
    tasks, report = mine([lone], MineConfig(reask_window_s=0), miner=miner_of(says(ANSWER)))
    assert [t for t in tasks if len(t.messages) == 1] == []
    assert report.miner.refused == {ONE_SIDED_BARE: 1}


def test_without_a_miner_the_same_chat_gives_no_task():
    tasks, report = mine([thread_row()], MineConfig())
    assert tasks == [] and not report.miner.ran
    assert sum(report.dropped.values()) == 3


@pytest.mark.parametrize(
    ("check", "why"),
    [
        ({"rules": [{"kind": "max_words", "value": 50}]}, "the rejected reply passes it"),
        ({"answer": {"kind": "text", "value": "Sydney"}}, "the accepted reply fails it"),
    ],
)
def test_a_check_that_does_not_tell_the_replies_apart_is_refused_and_counted(check, why):
    tasks, report = mine([thread_row()], MineConfig(), miner=miner_of(says(check)))
    assert tasks == [] and report.miner.kept == 0
    ((reason, n),) = report.miner.refused.items()
    assert reason.startswith(why) and n == 1
    assert sum(n for r, n in report.dropped.items() if r.startswith(NO_CHECK)) == 2


def test_with_one_side_only_that_side_must_behave():
    """A thumbs-down alone: the check must fail the rejected reply."""
    rows = [thumb_row("What is 12 + 5 in km?", "20 km", "down")]
    kept, report = mine(
        rows, MineConfig(), miner=miner_of(says({"answer": {"kind": "quantity", "value": "17 km"}}))
    )
    assert report.miner.kept == 1 and kept[0].reference == "17 km"
    assert kept[0].state.mined_check.tested_on == "rejected"
    assert not kept[0].state.has("no_demo")  # the operator's own thumb
    _, report = mine(
        rows, MineConfig(), miner=miner_of(says({"answer": {"kind": "quantity", "value": "20 km"}}))
    )
    assert report.miner.refused == {"the rejected reply passes it (not two-sided)": 1}


def test_a_row_without_a_verdict_is_not_shown():
    model = says(ANSWER)
    row = Interaction(messages=[user(Q)], reply=RIGHT, source="proxy", project="demo")
    tasks, report = mine([row], MineConfig(), miner=miner_of(model))
    assert model.calls == [] and tasks == []
    assert report.miner.skipped == {"no verdict: nothing to test a check on": 1}


# ---- what the miner answers -----------------------------------------------------------------


def test_cannot_check_is_counted_and_the_rows_stay_dropped():
    model = says({"cannot_check": "the conversation does not say what is right"})
    tasks, report = mine([thread_row()], MineConfig(), miner=miner_of(model))
    assert tasks == [] and report.miner.cannot_check == 1 and report.miner.answered == 1
    assert report.miner.examples[0].outcome.startswith("cannot check: the conversation")


def test_a_reply_that_is_not_json_gets_one_repair():
    model = says("The capital is Canberra, so check for that.", ANSWER, "still not JSON")
    row = thumb_row(Q, WRONG, "down")
    tasks, report = mine([row], MineConfig(), miner=miner_of(model))
    assert len(model.calls) == 2 and "## Reply to repair" in user_of(model.calls[1])
    assert "The capital is Canberra" in user_of(model.calls[1])
    assert report.miner.repaired == 1 and report.miner.kept == 1
    assert tasks[0].reference == "Canberra"
    model = says("no JSON here", "nor here")
    tasks, report = mine([row], MineConfig(), miner=miner_of(model))
    assert len(model.calls) == 2 and tasks == []
    assert report.miner.parse_failures == 1 and report.miner.parse_rate == 0.0


def test_parts_outside_the_vocabulary_are_dropped_not_obeyed():
    check, cannot, invalid = parse_check(
        json.dumps(
            {
                "answer": {"kind": "number", "value": "<a number>"},
                "rules": [
                    {"kind": "run_python", "value": "import os"},
                    {"kind": "max_words", "value": 0},
                    {"kind": "regex_must", "value": "x" * 300},
                    {"kind": "regex_must", "value": "((a{1000}){1000}){1000}"},
                    {"kind": "language", "value": "klingon"},
                    {"kind": "regex_must_not", "value": "<a pattern the reply must not match>"},
                    {"kind": "contains", "value": "Canberra"},
                    {"kind": "regex_must", "value": r"(?P<n>\d+) km"},
                ],
            }
        )
    )
    assert cannot is None and check is not None
    assert check.answer is None and [r.kind for r in check.rules] == ["contains", "regex_must"]
    whys = " | ".join(i["why"] for i in invalid)
    assert "run_python" in whys and "over 200" in whys and "counted repeats" in whys
    assert "klingon" in whys and whys.count("placeholder") == 2 and len(invalid) == 7
    assert parse_check('{"answer": {"kind": "number", "value": "seventeen"}}')[0] is None


# ---- patterns a model wrote -----------------------------------------------------------------


def test_a_catastrophic_pattern_runs_out_of_time_and_fails_closed():
    slow = "(a|aa)+$"
    text = "a" * 60 + "b"
    t0 = time.monotonic()
    for kind in ("regex_must", "regex_must_not"):
        ok, why = Rule(kind, slow).check(text)
        assert not ok and "failed closed" in why  # never passes, whichever way it is meant
    assert time.monotonic() - t0 < 30  # generous: each search stops after REGEX_TIMEOUT_S
    # a reply of many words: no short answer of its own to check it by (`row_label`)
    row = thumb_row("Spell a long run of a's", f"Here is a long run of them: {text}", "up")
    miner = miner_of(says({"rules": [{"kind": "regex_must", "value": slow}]}))
    tasks, report = mine([row], MineConfig(), miner=miner)
    assert tasks == [] and report.miner.refused == {
        "it cannot tell the accepted reply (a pattern ran out of time)": 1
    }


def _chat(rejected: str, accepted: str) -> Interaction:
    """One chat: a reply the user rejects, then the retry the user accepts."""
    messages = [user("Spell a run of a's."), assistant(rejected), user("That's wrong."),
                assistant(accepted), user("Thanks, that's right!")]  # fmt: skip
    return Interaction(messages, "You're welcome.", project="demo", source="proxy",
                       client=OPERATOR, created_at=100.0)  # fmt: skip


SLOW, LONG = "(a|aa)+$", "a" * 60 + "b"  # a catastrophic pattern, and a text it hangs on


@pytest.mark.parametrize(
    ("rows", "check"),
    [
        # a thumbs-down alone: the pattern runs out of time on the rejected reply
        ([thumb_row("Spell a run of a's.", LONG, "down")], {"kind": "regex_must", "value": SLOW}),
        ([thumb_row("Spell a run of a's.", LONG, "down")],
         {"kind": "regex_must_not", "value": SLOW}),
        # both sides: the accepted reply matches at once, the rejected one hangs
        ([_chat(LONG, "aaaa")], {"kind": "regex_must", "value": SLOW}),
    ],
)  # fmt: skip
def test_a_pattern_that_runs_out_of_time_on_the_rejected_reply_is_refused(rows, check):
    """Issue #63.3: the timeout on the rejected reply once counted as "the rejected reply
    fails" and the check was kept; a timeout on either side refuses it, with the reason."""
    miner = miner_of(says({"rules": [check]}))
    tasks, report = mine(rows, MineConfig(), miner=miner)
    assert report.miner.kept == 0 and not any(t.state.has("mined_check") for t in tasks)
    assert report.miner.refused == {
        "it cannot tell the rejected reply (a pattern ran out of time)": 1
    }
    (example,) = report.miner.examples
    assert example.outcome.startswith("refused: it cannot tell the rejected reply")


def test_a_timed_out_part_refuses_a_check_whose_other_part_tells_the_sides_apart():
    """The answer part fails the rejected reply on its own, but the pattern beside it ran out
    of time there: the pattern was never shown to fail it, so the whole check is refused."""
    row = thumb_row("Spell a run of a's.", LONG, "down")
    check = {"answer": {"kind": "text", "value": "aaaa"},
             "rules": [{"kind": "regex_must_not", "value": SLOW}]}  # fmt: skip
    tasks, report = mine([row], MineConfig(), miner=miner_of(says(check)))
    assert report.miner.kept == 0 and tasks == []


def test_without_the_regex_package_a_written_pattern_is_refused(monkeypatch):
    monkeypatch.setattr(checks, "_regex", None)
    assert pattern_problem(r"\d+ km") == NO_REGEX_PACKAGE
    ok, why = Rule("regex_must_not", r"\d").check("no digits")
    assert not ok and NO_REGEX_PACKAGE in why
    check, _, invalid = parse_check('{"rules": [{"kind": "regex_must", "value": "Canberra"}]}')
    assert check is None and NO_REGEX_PACKAGE in invalid[0]["why"]


# ---- rubrics --------------------------------------------------------------------------------


def test_a_rubric_is_tested_by_the_judge_and_refused_without_one():
    rubric = {"rubric": "The reply names Canberra as the capital."}

    def judge_says(messages):
        return '{"score": 9, "reason": "ok"}' if RIGHT in user_of(messages) else '{"score": 1}'

    judge = ScriptedModel(judge_says, "scripted-judge")
    tasks, report = mine(
        [thread_row()], MineConfig(), miner=miner_of(says(rubric), judge=LlmJudge(judge))
    )
    assert report.miner.kept == 1 and len(judge.calls) == 2  # 1 check x 2 replies
    assert tasks[0].state.rubric == rubric["rubric"] and tasks[0].check == "rubric"
    _, report = mine([thread_row()], MineConfig(), miner=miner_of(says(rubric)))
    assert report.miner.refused == {"a rubric needs a judge model (--judge-model)": 1}


def test_a_negative_row_with_only_a_generic_rubric_gets_the_written_check():
    """With a judge, a thumbs-down row is a task checked by a generic rubric; the miner's
    answer replaces it."""
    row = thumb_row(Q, WRONG, "down")
    tasks, _ = mine([row], MineConfig(judge=True))
    assert tasks[0].check == "rubric"
    tasks, report = mine([row], MineConfig(judge=True), miner=miner_of(says(ANSWER)))
    assert report.miner.kept == 1 and tasks[0].check == "reference"
    assert tasks[0].reference == "Canberra" and not tasks[0].state.has("rubric")


# ---- privacy, ledger, budget ----------------------------------------------------------------


def test_a_private_row_is_never_shown_to_a_remote_miner():
    model = says(ANSWER)
    row = thumb_row(Q, WRONG, "down", private=True)
    miner = miner_of(model, send_private=False)
    tasks, report = mine([row], MineConfig(), miner=miner)
    assert model.calls == [] and tasks == []
    assert report.miner.skipped == {"private row: the miner is a remote model": 1}
    reviewed = thumb_row(Q, WRONG, "down", private=True, reviewed=True)
    _, report = mine([reviewed], MineConfig(), miner=miner_of(model, send_private=False))
    assert len(model.calls) == 1 and report.miner.kept == 1


def test_a_fatal_backend_error_stops_the_miner_and_is_counted():
    from tests.scripted import fatal

    model = says(ANSWER)
    model.fail_at[0] = fatal()
    rows = [thumb_row(f"{Q} ({i})", WRONG, "down", at=float(i)) for i in range(3)]
    tasks, report = mine(rows, MineConfig(), miner=miner_of(model))
    assert len(model.calls) == 1 and tasks == []
    assert report.miner.backend_errors == 1 and "401" in report.miner.first_error
    ((reason, n),) = report.miner.skipped.items()
    assert n == 2 and reason.startswith("the miner's backend failed")


def test_the_miner_stops_when_the_nights_budget_is_spent():
    ledger = UsageLedger(budget=Budget(calls=2))
    model = says(ANSWER)
    rows = [thumb_row(f"{Q} ({i})", WRONG, "down", at=float(i)) for i in range(4)]
    miner = miner_of(TrackedModel(model, ledger, "miner"))
    tasks, report = mine(rows, MineConfig(), miner=miner)
    assert len(model.calls) == 2 and ledger.roles["miner"].calls == 2
    assert report.miner.asked == 2 and len(tasks) == 2
    ((reason, n),) = report.miner.skipped.items()
    assert n == 2 and "budget" in reason


def night_log(tmp_path, private: bool = False) -> None:
    log = TaskLog(tmp_path / "log.db")
    for i in range(4):  # distinct last turns: the same one again would read as a re-ask
        q = f"What is the capital of country number {i}?"
        log.add(thread_row(q, at=100.0 + i, thanks=f"({i})"))
    if private:
        log.add(thumb_row("Review my private key handling", "looks fine", "down", private=True))
    log.close()


def test_a_nights_miner_calls_are_on_its_ledger_evidence_and_report(tmp_path):
    night_log(tmp_path)
    miner = says(ANSWER, reads='{"value": null}')  # the default reading: only a value
    models = NightModels(
        rule_target(),
        "scripted-target",
        canned_analyst(),
        "scripted-analyst",
        miner=miner,
        miner_spec="scripted-miner",
    )
    config = NightConfig(
        home=tmp_path,
        log_path=tmp_path / "log.db",
        since=0.0,
        miner=MinerConfig(read_followups=True),
    )
    (night,) = run_night(config, models=models)
    assert night.models.miner == "scripted-miner"
    written = night.mining.miner
    assert written is not None and written.asked == len(checks_asked(miner)) == 4
    assert written.kept == 4
    read = night.mining.conversation.model  # each "That's wrong." read by the miner too
    assert (
        read is not None and read.asked == 4 and read.outcomes == {"kept the rules' rejection": 4}
    )
    assert len(miner.calls) == 8
    assert night.usage["miner"]["calls"] == 8  # the night's one ledger (and budget)
    evidence = (night.night_dir / "evidence.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["role"] == "miner" for line in evidence) == 8
    md = (night.night_dir / "report.md").read_text()
    assert "miner `scripted-miner`: 8 rows without a strong check, 4 shown" in md
    assert "checks kept 4" in md


def test_a_remote_miner_keeps_private_rows_out_of_the_night(tmp_path):
    night_log(tmp_path, private=True)
    miner = says(ANSWER)
    models = NightModels(
        rule_target(),
        "local",
        canned_analyst(),
        "local",
        miner=miner,
        miner_spec="openai:gpt-4o-mini",
    )
    (night,) = run_night(
        NightConfig(home=tmp_path, log_path=tmp_path / "log.db", since=0.0), models=models
    )
    assert night.mining.withheld_private == 1 and miner.calls
    assert not any("private key" in user_of(call) for call in miner.calls)
    assert any("openai:gpt-4o-mini is a remote model" in note for note in night.notes)


@pytest.mark.parametrize(
    ("miner_model", "named", "asked"), [(None, "opt", 4), ("m", "m", 4), ("off", None, 0)]
)
def test_the_miner_is_the_optimizer_unless_named_or_off(tmp_path, miner_model, named, asked):
    night_log(tmp_path)
    loaded: dict[str, ScriptedModel] = {}

    def loader(spec):
        model = {"t": rule_target, "opt": canned_analyst}.get(spec, lambda: says(ANSWER))()
        return loaded.setdefault(spec, model)

    config = NightConfig(
        model="t",
        optimizer_model="opt",
        miner_model=miner_model,
        home=tmp_path,
        log_path=tmp_path / "log.db",
        since=0.0,
    )
    (night,) = run_night(config, loader=loader)
    assert night.models.miner == named
    written = night.mining.miner
    assert written is not None and written.asked == asked and written.ran == bool(named)
    if named == "m":
        assert len(checks_asked(loaded["m"])) == 4 and written.kept == 4
    if named == "opt":  # the analyst answers a miner prompt with no check: none is kept
        assert written.parse_failures == 4


# ---- the embedded model as miner ------------------------------------------------------------


@pytest.mark.local
@pytest.mark.slow  # the embedded model answers ~8 miner prompts: about a minute on 2 busy cores
def test_the_embedded_model_as_miner_plumbing(tmp_path):
    """A 135M model cannot write checks; this asserts only that its calls are made, counted
    on the night's ledger, and reported under its name."""
    pytest.importorskip("transformers")
    from selftaught.models import load_model
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    night_log(tmp_path)
    models = NightModels(
        rule_target(),
        "scripted-target",
        canned_analyst(),
        "scripted-analyst",
        miner=load_model("local"),
        miner_spec="local",
    )
    config = NightConfig(
        home=tmp_path,
        log_path=tmp_path / "log.db",
        since=0.0,
        miner=MinerConfig(check_max_tokens=96),
    )
    (night,) = run_night(config, models=models)
    written = night.mining.miner
    assert written is not None and written.miner == "local" and written.candidates == 8
    # rows without a verdict are not shown (nothing to test a check on); the rest are asked
    assert written.asked + sum(written.skipped.values()) == written.candidates
    assert written.asked >= 1
    calls = night.usage["miner"]["calls"] + night.usage["miner"]["errors"]
    assert calls >= written.asked
    assert written.kept + sum(written.refused.values()) + written.cannot_check + (
        written.parse_failures + written.backend_errors
    ) == written.asked  # fmt: skip
    assert "miner `local`" in (night.night_dir / "report.md").read_text()


def test_pending_rows_keep_their_order_and_outcome():
    """Rows the miner does not check come back as they were, in order."""
    rows = [thumb_row(Q, WRONG, "down", at=1.0), thumb_row("What is 2 + 2?", "5", "down", at=2.0)]
    pending = [Pending(r, None, NO_CHECK) for r in rows]
    found, report = miner_of(says({"cannot_check": "no"})).resolve(pending, rows)
    assert found == [(None, NO_CHECK), (None, NO_CHECK)]
    assert report.asked == 2 and report.kept == 0
