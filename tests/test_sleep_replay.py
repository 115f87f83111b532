"""Replay of tool-using traffic (issue 19, part 4): the proxy and the log keep tools, tool_choice,
tool calls and tool turns; mining folds a conversation's steps into one episode task whose
fixtures are the tool results the agent really received; 'not recorded' for any other call;
corrected tool calls from feedback; `sleep import` and the harvesters keep tool calls; a night
replays the episodes sending exactly the logged tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from selftaught.policy import Policy  # noqa: E402
from selftaught.rollout import RolloutConfig, run_rollouts  # noqa: E402
from selftaught.sleep import log_interaction  # noqa: E402
from selftaught.sleep.intake.harvest import HarvestConfig, HarvestReport, harvesters  # noqa: E402
from selftaught.sleep.intake.harvest.import_jsonl import ImportFormatError, import_file  # noqa: E402
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog  # noqa: E402
from selftaught.sleep.intake.threads import tool_feedback  # noqa: E402
from selftaught.sleep.night.cycle import (  # noqa: E402
    NightConfig,
    NightModels,
    mine,
    run_night,
)
from selftaught.sleep.night.mine import MineConfig  # noqa: E402
from selftaught.sleep.night.replay import (  # noqa: E402
    ReplayNightTask,
    call_key,
    logged_tools,
    night_task,
    score_logged,
)
from selftaught.sleep.night.split import NightTask  # noqa: E402
from tests.scripted import ScriptedModel, calls_tools, canned_analyst, tool_call  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_replay  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
CALC = bench_replay.TOOLS[:1]
SYSTEM = {"role": "system", "content": "Use the tools."}


def calc_turn(expression: str, id: str) -> dict:
    call = tool_call("calculator", {"expression": expression}, id)
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def result(id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": id, "content": content}


def conversation_rows(question: str = "What is 1234 * 5678?", **feedback) -> list[Interaction]:
    """The three steps a tool-using agent logs through the proxy for one request."""
    user = {"role": "user", "content": question}
    first = calc_turn("1234 * 5678", "c1")
    second = calc_turn("7006652 + 0", "c2")
    steps = [
        ([SYSTEM, user], "", first["tool_calls"]),
        ([SYSTEM, user, first, result("c1", "7006652")], "", second["tool_calls"]),
        (
            [SYSTEM, user, first, result("c1", "7006652"), second, result("c2", "7006652")],
            "Answer: 7006652",
            None,
        ),
    ]
    return [
        Interaction(
            messages=m,
            reply=reply,
            project="demo",
            source="proxy",
            created_at=1000.0 + i,
            tools=CALC,
            tool_choice="auto",
            tool_calls=calls,
            feedback=Feedback(**feedback.get(f"step{i}", {})),
        )
        for i, (m, reply, calls) in enumerate(steps)
    ]


def mined(rows: list[Interaction]):
    tasks, report = mine(rows, MineConfig())
    for t in tasks:
        t.split = "train"
    return night_task("demo", {"train": tasks}), tasks, report


def replay_with(task, fn):
    model = ScriptedModel(fn)
    rollouts = run_rollouts(
        model, Policy(), task, task.examples("train"), RolloutConfig(progress=False)
    )
    return model, rollouts


# ---- the proxy and the log ----------------------------------------------------------------------


def test_the_proxy_logs_tools_tool_choice_tool_calls_and_tool_turns(tmp_path):
    plans = bench_replay.make_stream(6)  # calc (plain), wrong_expression (streamed), price,
    #  parallel (streamed, tool-call deltas without `index`), no_tool, wrong_item
    bench_replay.simulate(tmp_path / "log.db", plans, tmp_path / "home")
    log = TaskLog(tmp_path / "log.db")
    for plan in plans:
        rows = [log.get(i) for i in plan.ids]
        assert all(r.tools == bench_replay.TOOLS for r in rows)  # the `strict` field kept too
        assert all("tools" not in r.meta["request"] for r in rows)  # stored once
        assert rows[0].tool_choice == plan.tool_choice and rows[-1].tool_calls is None
        for step, row in enumerate(rows[:-1]):
            want = bench_replay._message(plan, step)["tool_calls"]
            assert row.tool_calls == want, (plan.kind, row.meta.get("stream"))
            assert row.meta.get("stream", False) == plan.stream
            nxt = rows[step + 1].messages  # the client sent the call and its result back
            assert nxt[-1 - len(want)]["tool_calls"] == want and nxt[-1]["role"] == "tool"
    parallel = next(p for p in plans if p.kind == "parallel")
    assert parallel.stream and parallel.omit_index
    assert len(log.get(parallel.ids[0]).tool_calls) == 2  # not glued into one call


def test_a_log_without_the_tool_columns_is_migrated_and_old_rows_still_replay(tmp_path):
    import sqlite3

    from selftaught.sleep.intake.log import MIGRATIONS, migrate

    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    migrate(conn, target=2)
    conn.close()
    log = TaskLog(tmp_path / "old.db")
    assert log.schema_version() == len(MIGRATIONS)  # the latest (3 added the tool columns)
    old = Interaction(
        messages=[{"role": "user", "content": "hi"}], meta={"request": {"tools": CALC}}
    )
    assert logged_tools(old) == CALC  # a row the proxy logged before the tools column
    call = tool_call("calculator", {"expression": "2 * 3"}, "c1")
    iid = log_interaction("2*3?", "", tools=CALC, tool_choice="auto", tool_calls=[call], log=log)
    row = log.get(iid)
    assert (row.tools, row.tool_choice, row.tool_calls) == (CALC, "auto", [call])
    assert row.to_dict()["tool_calls"] == [call]


# ---- fixtures and "not recorded" ----------------------------------------------------------------


def test_steps_of_one_conversation_fold_into_one_episode_task_with_its_fixtures():
    rows = conversation_rows(step2={"reference": "7006652"})
    task, tasks, report = mined(rows)
    (t,) = tasks
    assert isinstance(task, ReplayNightTask) and report.tasks == 1 and report.merged == 2
    assert t.sources == [rows[2].id, rows[1].id, rows[0].id]
    assert [m["role"] for m in t.messages] == ["system", "user"]  # the prompt ends at the request
    assert list(t.state.tools) == CALC and t.state.scorer == "numeric"
    assert [f["result"] for f in t.state.fixtures] == ["7006652", "7006652"]
    roles = [m["role"] for m in t.state.logged]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert t.logged_reply == "Answer: 7006652"
    (ex,) = task.examples("train")
    assert score_logged(ex).hard == 1.0


def test_the_same_call_returns_the_recorded_result_whatever_its_key_order():
    rows = conversation_rows(step2={"reference": "7006652"})
    rows[0].tools = rows[1].tools = rows[2].tools = [
        {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    ]
    for r in rows:  # the logged call had two arguments, in this order
        for m in r.messages + [{"tool_calls": r.tool_calls or []}]:
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.dumps({"expression": "1234 * 5678", "n": 1.0})
    task, _, _ = mined(rows)

    def agent(messages):
        if messages[-1]["role"] == "user":  # the same call, keys reordered, 1 for 1.0
            return calls_tools(tool_call("calculator", '{"n": 1, "expression": "1234 * 5678"}'))
        return f"Answer: {messages[-1]['content']}"

    _, (r,) = replay_with(task, agent)
    assert r.trajectory[1]["content"] == "7006652" and r.tool_errors == 0
    assert r.score.hard == 1.0 and r.score.soft == 1.0


def test_any_other_call_returns_not_recorded_and_counts_against_the_episode():
    task, _, _ = mined(conversation_rows(step2={"reference": "7006652"}))

    def agent(messages):
        if messages[-1]["role"] == "user":
            return calls_tools(tool_call("calculator", {"expression": "1234*5678"}))
        return "Answer: 7006652"  # right anyway

    _, (r,) = replay_with(task, agent)
    shown = r.trajectory[1]["content"]
    assert shown.startswith("error: not recorded: no result was logged for calculator(")
    assert "1234 * 5678" in shown  # it names the recorded calls
    assert r.tool_errors == 1 and r.score.hard == 1.0 and r.score.soft == pytest.approx(0.75)
    assert "failed tool call" in r.score.feedback


def test_a_call_made_twice_with_different_results_replays_them_in_order():
    from selftaught.sleep.night.replay import ReplayEnvironment

    fixtures = [
        {"name": "get", "arguments": {"key": "a"}, "result": "1"},
        {"name": "get", "arguments": {"key": "a"}, "result": "2"},
    ]
    env = ReplayEnvironment([{"type": "function", "function": {"name": "get"}}], fixtures)
    assert [env.answer("get", {"key": "a"}) for _ in range(3)] == ["1", "2", "2"]


# ---- corrected tool calls -----------------------------------------------------------------------


def test_feedback_shapes_for_a_corrected_tool_call():
    call = {"name": "calculator", "arguments": {"expression": "2 * 3"}}
    openai_shape = tool_call("calculator", {"expression": "2 * 3"})
    assert tool_feedback(json.dumps(call)).calls == [call]
    assert tool_feedback(openai_shape).calls == [call]
    both = tool_feedback({"tool_calls": [openai_shape], "answer": "6"})
    assert both.calls == [call] and both.answer == "6"
    assert tool_feedback("6") is None and tool_feedback({"name": "x"}) is None  # plain answers
    assert call_key("f", '{"a": 1, "b": [1, 2]}') == call_key("f", {"b": [1.0, 2], "a": 1})
    assert call_key("f", {"b": [1, 2]}) != call_key("f", {"b": [2, 1]})  # lists keep order


def test_a_corrected_call_on_an_intermediate_step_is_checked_against_the_episode():
    right = {"name": "calculator", "arguments": {"expression": "4321 * 5678"}}
    rows = conversation_rows(
        step0={"reference": json.dumps(right)}, step2={"reference": "24534638"}
    )
    task, (t,), report = mined(rows)
    assert report.tasks == 1 and t.state.expected_calls == (right,)
    assert t.state.scorer == "numeric" and t.reference == "24534638"
    (ex,) = task.examples("train")
    assert score_logged(ex).hard == 0.0  # the logged replies made the wrong call

    def corrected(messages):
        if messages[-1]["role"] == "user":  # the keys in another order do not matter
            return calls_tools(tool_call("calculator", '{"expression": "4321 * 5678"}'))
        return "Answer: 24534638"

    _, (good,) = replay_with(task, corrected)
    assert good.trajectory[1]["content"].startswith("not recorded: calculator(")  # a note...
    assert good.tool_errors == 0 and good.score.hard == 1.0  # ...that costs nothing

    def as_logged(messages):
        if messages[-1]["role"] == "user":
            return calls_tools(tool_call("calculator", {"expression": "1234 * 5678"}))
        return "Answer: 24534638"

    _, (bad,) = replay_with(task, as_logged)
    assert bad.score.hard == 0.0 and "corrected call calculator(" in bad.score.feedback


def test_a_corrected_call_alone_is_a_check_and_a_json_reference_without_tools_is_an_answer():
    right = {"name": "calculator", "arguments": {"expression": "2 * 2"}, "result": "4"}
    rows = conversation_rows(step0={"reference": right})
    _, (t,), _ = mined(rows)
    assert t.check == "tool_call" and not t.state.has("scorer")
    assert {"name": "calculator", "arguments": {"expression": "2 * 2"}, "result": "4"} in (
        t.state.fixtures
    )  # a corrected call with its result is a fixture too
    plain = Interaction(
        messages=[{"role": "user", "content": "Give me the JSON"}],
        reply="{}",
        feedback=Feedback(reference=json.dumps({"name": "a", "arguments": {}})),
    )
    task, (p,), _ = mined([plain])
    assert type(task) is NightTask and p.reference == json.dumps({"name": "a", "arguments": {}})


# ---- the night ----------------------------------------------------------------------------------


def test_replay_fidelity_on_a_stream_through_the_proxy():
    """The issue's target: every replayed episode sends the logged tools, and a replay of the
    logged replies scores what they scored live (the control proves the check can fail)."""
    result = bench_replay.run(12)
    assert result["tasks"] == 12 and result["replayed_requests"] >= 24
    assert result["requests_with_exactly_the_logged_tools"] == result["replayed_requests"]
    assert result["scores_equal_live"] == 12 and result["not_recorded_in_faithful_replay"] == 0
    assert 0 < result["soft_live"] < 1
    assert result["perturbed_failed_calls"] > 0 and result["soft_perturbed"] < result["soft_live"]


def test_a_night_replays_tool_traffic_as_episodes_and_logs_the_calls(tmp_path):
    home = tmp_path / "home"
    plans = bench_replay.make_stream(12)
    bench_replay.simulate(home / "log.db", plans, home)
    task, tasks, _ = bench_replay.mine_log(home / "log.db")
    logged = {t.prompt: [m for m in t.state.logged if m["role"] == "assistant"] for t in tasks}
    target = bench_replay.LoggedReplies(logged)
    config = NightConfig(
        home=home, log_path=home / "log.db", documents=("skill",), project="replay"
    )
    (night,) = run_night(config, models=NightModels(target, "scripted", canned_analyst(), "a"))
    assert night.status == "no_proposal", night.reason
    assert night.mining.tasks == 12
    assert all(p.tools == bench_replay.TOOLS for _, p in target.requests)
    price = [p for q, p in target.requests if "cost in EUR" in q]
    assert {p.tool_choice for p in price} == {"required", "auto"}  # forcing on the first turn
    d = night.night_dir
    evidence = [json.loads(line) for line in (d / "evidence.jsonl").read_text().splitlines()]
    calls = [e for e in evidence if e["role"] == "target" and e.get("tool_calls")]
    assert calls and all(e["params"]["tools"] == bench_replay.TOOLS for e in calls)
    diag = json.loads((d / "diagnostics.json").read_text())
    assert any(row.get("trajectory") for row in diag["val_before"])
    rows = [json.loads(line) for line in (d / "tasks.jsonl").read_text().splitlines()]
    assert all("episode: 2 tools" in r["checks"] for r in rows)


# ---- import and harvest -------------------------------------------------------------------------


def test_import_reads_openai_chat_lines_with_tool_turns(tmp_path):
    first = calc_turn("1234 * 5678", "c1")
    ask = {"role": "user", "content": "What is 1234 * 5678?"}
    answer = {"role": "assistant", "content": "Answer: 7006652"}
    lines = [
        {  # a whole conversation ending with the answer
            "messages": [SYSTEM, ask, first, result("c1", "7006652"), answer],
            "tools": CALC,
            "tool_choice": "auto",
            "reference": "7006652",
        },
        {  # one ending with a call
            "messages": [
                {"role": "user", "content": "What is 99 * 99?"},
                calc_turn("99 * 99", "c9"),
            ],
            "tools": CALC,
        },
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = TaskLog(tmp_path / "log.db")
    assert import_file(path, log).inserted == 2
    whole, ending = sorted(log.query(), key=lambda r: len(r.messages), reverse=True)
    assert whole.tools == CALC and whole.tool_choice == "auto" and whole.reply == "Answer: 7006652"
    assert whole.messages[2]["tool_calls"][0]["id"] == "c1" and whole.messages[3]["role"] == "tool"
    assert ending.reply == "" and ending.tool_calls[0]["function"]["name"] == "calculator"
    assert "tools" not in whole.meta
    _, tasks, _ = mined([whole])
    assert tasks[0].state.fixtures[0]["result"] == "7006652"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": lines[0]["messages"], "tools": "calculator"}) + "\n")
    with pytest.raises(ImportFormatError, match=r"bad.jsonl:1: `tools` must be a list"):
        import_file(bad, log)


def test_harvesters_keep_the_tool_calls_and_their_results(tmp_path):
    config = HarvestConfig(lookback_days=10**5)
    claude = harvesters()["claude-code"]
    (path,) = claude.session_files(FIXTURES / "claude_code" / "projects")
    first, second, *_ = claude.read_session(path, config, HarvestReport("claude-code", ""))
    assert [c["function"]["name"] for c in first.tool_calls] == ["Read", "Edit"]
    args = json.loads(first.tool_calls[0]["function"]["arguments"])
    assert args == {"file_path": "/home/dev/src/webapp/src/cli.py"}
    results = first.meta["tool_results"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in first.tool_calls]
    assert "import argparse" in results[0]["content"]
    assert [r["is_error"] for r in second.meta["tool_results"]] == [True, False]
    codex = harvesters()["codex"]
    path = next(p for p in codex.session_files(FIXTURES / "codex") if "2026" in str(p))
    turn = codex.read_session(path, config, HarvestReport("codex", ""))[0]
    assert [c["function"]["name"] for c in turn.tool_calls] == ["exec_command", "apply_patch"]
    assert json.loads(turn.tool_calls[1]["function"]["arguments"])["input"].startswith("*** Begin")
    assert turn.meta["tool_results"][1]["content"].startswith("Success. Updated")
    log = TaskLog(tmp_path / "log.db")
    log.add(turn)
    assert log.get(turn.id).tool_calls == turn.tool_calls  # stored with the row
