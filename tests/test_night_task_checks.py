"""A mined task's checks are typed (`records.TaskChecks`, issue 64), and stored as the dict
they always were: the recall pool's rows of older versions load through `MinedTask.from_dict`
and are written back key for key (keys this version does not type kept), and the one place a
task becomes an `Example` (`split.example_of`) gives its scorer the dict it always had."""

from __future__ import annotations

import json

from selftaught.sleep.intake.log import Feedback, Interaction
from selftaught.sleep.kinds_file import kind_tag
from selftaught.sleep.night import recall
from selftaught.sleep.night.checks import describe_checks
from selftaught.sleep.night.mine import MineConfig, MinedTask, mine_one
from selftaught.sleep.night.split import example_of, train_only
from selftaught.sleep.night.trust import Trust, label_trust
from selftaught.sleep.records import TaskChecks, WeakLabel, WorkspaceCheck

# a recall row as versions before typed checks wrote it: every key of a task's state, in the
# order their writers gave them, and one no version of this one knows
OLD_STATE = {
    "rules": [{"kind": "max_words", "arg": 20, "said": "in under 20 words"}],
    "evidence": '"always answer in French"',
    "scorer": "numeric",
    "no_demo": "checked by an end user's correction",
    "trust": "end_user",
    "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {}}}],
    "tool_choice": None,
    "fixtures": [{"name": "calculator", "arguments": {"expression": "2 * 2"}, "result": "4"}],
    "logged": [{"role": "assistant", "content": "4"}],
    "expected_calls": [{"name": "calculator", "arguments": {"expression": "2 * 2"}}],
    "tags": ["billing"],
    "mined_check": {
        "by": "scripted-miner",
        "tested_on": "both",
        "answer": {"kind": "number", "value": "4"},
        "rules": [],
        "rubric": None,
        "why": "the user accepted 4",
    },
    "bare_verdict": {"signal": "rejection", "check": "miner"},
    "workspace": {
        "path": "/w/files",
        "check": ["make", "test"],
        "timeout_s": 60.0,
        "session": "s-1",
        "commit": "abc",
    },  # fmt: skip
    "judge_hint": {"from": "a newer version"},
}
OLD_ROW = {
    "id": "t-1",
    "messages": [{"role": "user", "content": "What is 2 * 2? Answer in under 20 words."}],
    "reference": "4",
    "state": OLD_STATE,
    "sources": ["i-2", "i-1"],
    "origins": ["proxy"],
    "clients": ["key:mallory"],
    "negative": True,
    "logged_reply": "4",
    "created_at": 12.5,
    "split": "val",
    "notes": [],
    "signals": [],
    "kind": "k-sums",
}


def test_an_old_recall_row_is_read_typed_and_written_back_key_for_key():
    task = MinedTask.from_dict(json.loads(json.dumps(OLD_ROW)))
    s = task.state
    assert s.scorer == "numeric" and s.rules[0]["arg"] == 20 and s.trust == "end_user"
    assert s.tags == ("billing",) and s.tool_choice is None and s.has("tool_choice")
    assert s.expected_calls[0]["name"] == "calculator" and len(s.fixtures) == 1
    assert s.workspace == WorkspaceCheck(
        path="/w/files", check=("make", "test"), session="s-1", commit="abc"
    )
    assert s.mined_check is not None and s.mined_check.by == "scripted-miner"
    assert s.bare_verdict is not None and train_only(task) == "bare_verdict"
    assert s.extra == {"judge_hint": {"from": "a newer version"}}  # kept, not typed
    assert not s.has("comment") and s.comment is None
    # stored as it was read: the same keys, values and order
    assert json.dumps(task.to_dict()) == json.dumps(OLD_ROW)
    assert describe_checks(s) == (
        "workspace check `make test`, reference (numeric), rule max_words=20, written by "
        "scripted-miner, corrected tool call (1), episode: 1 tools, 1 recorded results"
    )


def test_an_old_rows_example_state_is_the_dict_the_scorer_always_read():
    task = MinedTask.from_dict(json.loads(json.dumps(OLD_ROW)))
    ex = example_of(task)
    assert (ex.id, ex.input, ex.reference) == ("t-1", OLD_ROW["messages"], "4")
    # as `NightTask` made it of the dict: the state, the sources, the kind's tag last
    want = {**OLD_STATE, "sources": OLD_ROW["sources"], "tags": ["billing", kind_tag("k-sums")]}
    assert json.dumps(ex.state) == json.dumps(want)


def test_a_pool_written_before_trust_and_clients_were_recorded_still_loads(tmp_path):
    """The oldest pool rows: no clients (every comment then counted as the operator's), no
    trust, no signals or kind; the comment becomes evidence, the label is read from the row."""
    row = {
        "id": "t-old",
        "messages": [{"role": "user", "content": "What is 6 * 7?"}],
        "reference": "42",
        "state": {
            "rules": [
                {"kind": "language", "arg": "French", "said": "answer in French"},
                {"kind": "max_words", "arg": 5, "said": "in 5 words"},
            ],
            "comment": "answer in French",
            "scorer": "numeric",
            "retired_key": 1,
        },
        "sources": ["i-1"],
        "origins": ["import"],
        "negative": False,
        "logged_reply": None,
        "created_at": 1.0,
        "split": "train",
        "notes": [],
    }
    path = recall.recall_path("demo", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"night": "n0", "task": row}) + "\n")
    (back,) = recall.load("demo", tmp_path)
    s = back.task.state
    assert s.comment is None and s.evidence == '"answer in French"'
    assert s.rules == ()  # rules only the comment stated are dropped (`distrust_legacy`)
    assert s.trust == "operator" and label_trust(back.task) == Trust.OPERATOR
    stored = back.task.to_dict()["state"]
    assert list(stored) == ["rules", "scorer", "retired_key", "evidence", "trust"]
    assert back.to_dict()["task"]["state"]["retired_key"] == 1


def test_checks_made_in_code_hold_the_keys_given_in_the_order_given():
    made = TaskChecks(scorer="numeric", weak=WeakLabel(agreement=1.0, k=3))
    assert made.to_dict() == {
        "scorer": "numeric",
        "weak": {"agreement": 1.0, "k": 3, "answers": {}},
    }
    built = TaskChecks.empty().but(rules=()).but(tool_choice=None, trust="operator")
    assert list(built.to_dict()) == ["rules", "tool_choice", "trust"]  # empty and None kept
    assert built.has("rules") and not built.has("scorer")
    less = built.but(scorer="numeric").without("tool_choice", "rules")
    assert less.to_dict() == {"trust": "operator", "scorer": "numeric"}
    kept = less.keep("scorer", "rules", "trust")  # in the order asked, those it holds
    assert kept.to_dict() == {"scorer": "numeric", "trust": "operator"}


def test_a_mined_tasks_checks_are_stored_in_the_order_they_were_found():
    it = Interaction(
        messages=[{"role": "user", "content": "What is 2 + 2? Answer in under 5 words."}],
        reply="5",
        feedback=Feedback(reference="4", comment="it is 4", trusted=True),
        project="demo",
    )
    task, why = mine_one(it, MineConfig())
    assert why is None and task is not None
    assert list(task.to_dict()["state"]) == ["rules", "comment", "scorer", "demo_source", "trust"]
    assert task.state.demo_source == "correction" and task.state.trust == "operator"
