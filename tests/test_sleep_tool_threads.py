"""A tool episode and the user's next turn are one thread (issue 62): an app offering a tool
through the proxy (chat completions, Anthropic Messages, OpenAI Responses: one logged shape)
logs each step of the episode as a row of its own, each resending the one before it; the
user's turn after the final answer judges that answer, and a night mines the episode as one
task replayed with the logged tool results, checked by the user's correction."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.sleep.intake.log import Interaction, TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background  # noqa: E402
from selftaught.sleep.intake.threads import build_threads  # noqa: E402
from selftaught.sleep.night.cycle import mine  # noqa: E402
from selftaught.sleep.night.mine import MineConfig  # noqa: E402
from selftaught.sleep.night.replay import night_task  # noqa: E402
from selftaught.sleep.night.signals import REDONE  # noqa: E402
from selftaught.tasks.base import Example  # noqa: E402
from tests.agent_upstream import AgentRequest, AgentUpstream, Call  # noqa: E402

MODEL = "scripted-agent-model"
KEY = "sk-app-key-" + "x" * 20
QUESTION = "What is 1234 + 3078? Use the calculator."
EXPRESSION = "1234 + 3078"
CORRECTION = "No, it's 4,312."
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}}


def calculator_agent(request: AgentRequest) -> str | Call:
    """Calls the calculator, then misreports its result by one; after the user's correction
    repeats the user's number."""
    said = [t["text"] for t in request.turns if t["role"] == "user"]
    if said and said[-1].startswith("No"):
        return "Answer: 4312"
    if request.tool_results:
        return f"Answer: {int(request.tool_results[-1].output) - 1}"
    return Call("calculator", {"expression": EXPRESSION})


def right_agent(request: AgentRequest) -> str | Call:
    """Calls the calculator and reports its result."""
    if request.tool_results:
        return f"Answer: {request.tool_results[-1].output}"
    return Call("calculator", {"expression": EXPRESSION})


def calculator(arguments: Any) -> str:
    expression = json.loads(arguments)["expression"] if isinstance(arguments, str) else ""
    a, b = expression.split("+")
    return str(int(a) + int(b))


# ---- one client per wire: run each tool call, send the result back, until a final answer ----


def _chat(url: str, convo: list[dict[str, Any]], said: str | None) -> list[dict[str, Any]]:
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": SCHEMA}}]
    if said is not None:
        convo = [*convo, {"role": "user", "content": said}]
    for _ in range(4):
        body = {"model": MODEL, "messages": convo, "tools": tools}
        got = _post(f"{url}/chat/completions", body)["choices"][0]["message"]
        turn = {"role": "assistant", "content": got.get("content")}
        calls = got.get("tool_calls") or []
        convo = [*convo, {**turn, "tool_calls": calls} if calls else turn]
        if not calls:
            return convo
        for call in calls:
            result = calculator(call["function"]["arguments"])
            convo.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise AssertionError("no final answer in 4 requests")


def _messages(url: str, convo: list[dict[str, Any]], said: str | None) -> list[dict[str, Any]]:
    tools = [{"name": "calculator", "description": "adds", "input_schema": SCHEMA}]
    if said is not None:
        convo = [*convo, {"role": "user", "content": said}]
    for _ in range(4):
        body = {"model": MODEL, "max_tokens": 100, "system": "Use the tools.", "tools": tools,
                "messages": convo}  # fmt: skip
        blocks = _post(f"{url}/messages", body)["content"]
        convo = [*convo, {"role": "assistant", "content": blocks}]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if not uses:
            return convo
        results = [
            {"type": "tool_result", "tool_use_id": b["id"],
             "content": calculator(json.dumps(b["input"]))}
            for b in uses
        ]  # fmt: skip
        convo.append({"role": "user", "content": results})
    raise AssertionError("no final answer in 4 requests")


def _responses(url: str, convo: list[dict[str, Any]], said: str | None) -> list[dict[str, Any]]:
    tools = [{"type": "function", "name": "calculator", "parameters": SCHEMA}]
    if said is not None:
        convo = [*convo, {"type": "message", "role": "user", "content": said}]
    for _ in range(4):
        body = {"model": MODEL, "instructions": "Use the tools.", "input": convo, "tools": tools}
        items = _post(f"{url}/responses", body)["output"]
        convo = [*convo, *items]
        calls = [i for i in items if i["type"] == "function_call"]
        if not calls:
            return convo
        for call in calls:
            convo.append({"type": "function_call_output", "call_id": call["call_id"],
                          "output": calculator(call["arguments"])})  # fmt: skip
    raise AssertionError("no final answer in 4 requests")


def _post(url: str, body: dict[str, Any]) -> Any:
    headers = {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
    answer = loopback.post(url, json=body, headers=headers, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.json()


CLIENTS = {"chat": _chat, "messages": _messages, "responses": _responses}
OPENING = {
    "chat": [{"role": "user", "content": QUESTION}],
    "messages": [{"role": "user", "content": QUESTION}],
    "responses": [{"type": "message", "role": "user", "content": QUESTION}],
}


@contextlib.contextmanager
def proxied(tmp_path: Path, log_at: Path | str, agent: Any = calculator_agent,
            **config: Any) -> Iterator[str]:  # fmt: skip
    with AgentUpstream(agent) as up:
        proxy = ProxyConfig(upstream=up.root_url, project="demo", port=0, log_path=log_at,
                            home=tmp_path / "home", **config)  # fmt: skip
        with proxy_in_background(proxy) as (url, app):
            yield url
            assert app.state.proxy.writer.flush(30)


def episode_then(wire: str, tmp_path: Path, log_at: Path | str, said: str) -> list[Interaction]:
    """The app's episode through the proxy, then the user's next turn (and the agent's answer
    to it); the rows logged."""
    with proxied(tmp_path, log_at) as url:
        episode = CLIENTS[wire](url, OPENING[wire], None)
        CLIENTS[wire](url, episode, said)
    return TaskLog(log_at).query()


# ---- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["chat", "messages", "responses"])
def test_a_correction_after_a_tool_episode_gives_an_episode_task(tmp_path, log_at, wire):
    rows = episode_then(wire, tmp_path, log_at, CORRECTION)
    assert len(rows) == 3  # the call, the final answer, the answer to the correction
    (thread,) = build_threads(rows)
    assert len(thread.rows) == 3 and thread.how == "history"
    judged = thread.turns[0]
    assert judged.reply == "Answer: 4311" and judged.followup == CORRECTION
    assert [m["role"] for m in judged.steps] == ["assistant", "tool"]

    tasks, report = mine(rows, MineConfig())
    assert report.conversation.signals == {"correction": 1}
    assert report.dropped == {REDONE: 1}  # the answer to the correction is no task
    (task,) = tasks
    assert task.messages[-1] == {"role": "user", "content": QUESTION}
    assert task.reference == "4,312" and task.state.scorer == "numeric"
    assert task.negative and task.logged_reply == "Answer: 4311"
    assert task.state.no_demo  # an end user's correction
    assert [t["function"]["name"] for t in task.state.tools] == ["calculator"]
    assert list(task.state.fixtures) == [
        {"name": "calculator", "arguments": {"expression": EXPRESSION}, "result": "4312"}
    ]
    first_step = min(rows, key=lambda r: r.created_at)
    assert first_step.tool_calls and first_step.id in task.sources

    # replayed with the logged result as its fixture, an episode that reads it right passes
    task.split = "train"
    (ex,) = night_task("demo", {"train": [task]}).examples("train")
    assert isinstance(ex, Example) and ex.state["tools"]


def test_a_trusted_users_thanks_after_a_tool_episode_makes_its_answer_the_reference(
    tmp_path, log_at
):
    with proxied(tmp_path, log_at, right_agent, trusted_clients=("*",)) as url:
        episode = _chat(url, OPENING["chat"], None)
        _chat(url, episode, "Thanks, that's right.")
    (task,), report = mine(TaskLog(log_at).query(), MineConfig())
    assert report.conversation.signals == {"acceptance": 1}
    assert task.reference == "4312" and task.state.trust == "operator"
    assert not task.state.has("no_demo") and not task.negative
    assert task.state.fixtures[0]["result"] == "4312"


def test_a_tool_episode_followed_by_a_new_question_is_no_redo(tmp_path, log_at):
    with proxied(tmp_path, log_at) as url:
        episode = _chat(url, OPENING["chat"], None)
        _chat(url, episode, "What is 2 + 2?")  # a new question: no verdict on the answer
    rows = TaskLog(log_at).query()
    (thread,) = build_threads(rows)
    assert [t.followup for t in thread.turns] == ["What is 2 + 2?", None]
    _, report = mine(rows, MineConfig())
    assert REDONE not in report.dropped and not report.conversation.signals


def _call(expression: str, id: str) -> dict[str, Any]:
    fn = {"name": "calculator", "arguments": json.dumps({"expression": expression})}
    return {"id": id, "type": "function", "function": fn}


def test_a_retry_that_calls_the_tool_again_is_no_task_nor_are_its_steps():
    """After the correction the agent runs the tool again: that episode's rows (the call and
    the answer) repeat the judged request with the user's words in it, so neither is a task."""
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": SCHEMA}}]
    ask, redo = {"role": "user", "content": QUESTION}, {"role": "user", "content": CORRECTION}
    call, again = _call(EXPRESSION, "c1"), _call("3078 + 1234", "c2")
    called = {"role": "assistant", "content": None, "tool_calls": [call]}
    recalled = {"role": "assistant", "content": None, "tool_calls": [again]}
    answered = {"role": "assistant", "content": "Answer: 4311"}
    steps = [
        ([ask], None, [call]),
        ([ask, called, _result("c1")], "Answer: 4311", None),
        ([ask, called, _result("c1"), answered, redo], None, [again]),
        ([ask, called, _result("c1"), answered, redo, recalled, _result("c2")], "4312", None),
    ]
    rows = [
        Interaction(
            messages=m,
            reply=reply,
            tool_calls=calls,
            tools=tools,
            project="demo",
            source="proxy",
            client="key:app",
            created_at=100.0 + i,
        )  # fmt: skip
        for i, (m, reply, calls) in enumerate(steps)
    ]
    (thread,) = build_threads(rows)
    assert [t.step_rows for t in thread.turns] == [(rows[0].id,), (rows[2].id,)]
    tasks, report = mine(rows, MineConfig())
    assert report.dropped == {REDONE: 2}
    (task,) = tasks
    assert task.reference == "4,312" and sorted(task.sources) == sorted([rows[0].id, rows[1].id])

    # the retry under way (its call logged, no answer yet) is no task either
    (thread,) = build_threads(rows[:3])
    assert thread.open_steps == (rows[2].id,)
    tasks, report = mine(rows[:3], MineConfig())
    assert len(tasks) == 1 and report.dropped == {REDONE: 1}


def _result(id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id, "content": "4312"}
