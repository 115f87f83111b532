"""The proxy speaks the agents' APIs: Claude Code (Anthropic Messages) and Codex (OpenAI
Responses), the real pinned CLIs driven through the proxy to the scripted upstream
(`tests.agent_upstream`), streamed, and the same APIs non-streamed by raw requests. Every turn
is logged in the one message shape with its tools, tool calls and tool results, the client id
and the agent session; an adopted skill reaches the agent's upstream request and is not in
the log; a refused key is the proxy's 401; a session's rows chain into one episode; a
streamed reply's first byte reaches the client before the upstream has finished.

The CLIs come from `scripts/install-agent-clis.sh` (`$SELFTAUGHT_AGENT_CLIS`, default
~/.cache/selftaught/agent-clis); the tests that run them skip, saying so, without them."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.runs import atomic_write_text  # noqa: E402
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import (  # noqa: E402
    ID_HEADER,
    ProxyConfig,
    build_upstream,
    proxy_in_background,
)
from selftaught.sleep.intake.proxy_access import key_id  # noqa: E402
from selftaught.sleep.intake.sessions import collapse_sessions, last_turn  # noqa: E402
from selftaught.sleep.night.mine import MineConfig  # noqa: E402
from selftaught.sleep.night.replay import conversations, mine_tool_task  # noqa: E402
from selftaught.sleep.paths import adopted_dir  # noqa: E402
from tests.agent_upstream import (  # noqa: E402
    MODEL,
    AgentUpstream,
    agent_env,
    codex_config,
    find_cli,
    needs_skill,
    one_tool_then_answer,
)

PROJECT = "agents"
CLIENT_KEY = "sk-ant-client-" + "K3y" * 10  # what the agent sends: never in the log
MARKER = "SKILL-MARKER-5521"
CLI_TIMEOUT_S = 120


@contextlib.contextmanager
def stack(tmp_path: Path, policy: Any, **proxy: Any) -> Iterator[dict[str, Any]]:
    """The scripted upstream, and the proxy in front of it (the client's model passes)."""
    delay = proxy.pop("chunk_delay_s", 0.0)
    with AgentUpstream(policy, chunk_delay_s=delay) as up:
        config = ProxyConfig(
            upstream=up.root_url,
            project=PROJECT,
            port=0,
            log_path=tmp_path / "log.db",
            home=tmp_path / "home",
            **proxy,
        )
        with proxy_in_background(config) as (url, app):
            yield {"url": url, "root": url.removesuffix("/v1"), "up": up, "app": app}
            assert app.state.proxy.writer.flush(30)


def rows_of(tmp_path: Path) -> list[Interaction]:
    return TaskLog(tmp_path / "log.db").query(LogFilter(project=PROJECT, newest_first=False))


def adopt(tmp_path: Path, skill: str) -> None:
    folder = adopted_dir(PROJECT, tmp_path / "home")
    atomic_write_text(folder / "skill.md", skill)
    atomic_write_text(folder / "memory.md", "")
    atomic_write_text(folder / "version", "1\n")


def db_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(tmp_path.glob("log.db*")))


# ---- running the real CLIs --------------------------------------------------------------------


def need(name: str) -> str:
    path = find_cli(name)
    if path is None:
        pytest.skip(f"{name} CLI not installed: run scripts/install-agent-clis.sh")
    return path


def run_claude(s: dict[str, Any], workdir: Path, key: str = CLIENT_KEY) -> dict[str, Any]:
    """`claude -p` against the proxy; its JSON result."""
    claude = need("claude")
    workdir.mkdir(parents=True, exist_ok=True)
    env = agent_env(workdir.parent / "claude-home", ANTHROPIC_BASE_URL=s["root"],
                    ANTHROPIC_API_KEY=key)  # fmt: skip
    cmd = [claude, "-p", "run the check", "--output-format", "json", "--allowedTools", "Bash",
           "--model", MODEL]  # fmt: skip
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"is_error": True, "stdout": done.stdout, "stderr": done.stderr[-2000:]}


def run_codex(s: dict[str, Any], workdir: Path, key: str = CLIENT_KEY) -> dict[str, Any]:
    """`codex exec --json` against the proxy; its last agent message and the exit status."""
    codex = need("codex")
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir.parent / "codex-home"
    env = agent_env(home, X_KEY=key)
    codex_config(home / ".codex", s["url"], key_env="X_KEY")
    cmd = [codex, "exec", "--skip-git-repo-check", "--json", "run the check"]
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"]["text"] for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]  # fmt: skip
    thread = next((e["thread_id"] for e in events if e.get("type") == "thread.started"), None)
    errors = [json.dumps(e) for e in events if e.get("type") in ("error", "turn.failed")]
    return {"result": messages[-1] if messages else None, "rc": done.returncode,
            "session_id": thread, "errors": "\n".join(errors)}  # fmt: skip


RUNNERS = {"claude": run_claude, "codex": run_codex}
SHELL = {"claude": "Bash", "codex": "exec_command"}
WIRE = {"claude": "messages", "codex": "responses"}


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_a_real_agent_session_is_logged_turn_by_turn_with_tools_and_results(tmp_path, agent):
    policy = one_tool_then_answer("echo proxied-4242")
    with stack(tmp_path, policy, feedback_key="op-feedback-key-1") as s:
        out = RUNNERS[agent](s, tmp_path / "work")
        upstream_calls = list(s["up"].calls)
        assert s["app"].state.proxy.writer.flush(30)
        correction = {"session_id": out["session_id"], "reference": "proxied-4242"}
        fb = loopback.post(f"{s['url']}/feedback", json=correction,
                        headers={"x-api-key": "op-feedback-key-1"})  # fmt: skip
    assert "proxied-4242" in str(out.get("result")), out
    first, second = rows_of(tmp_path)
    assert fb.status_code == 200 and fb.json()["id"] == second.id
    for row in (first, second):
        assert row.error is None and row.meta["wire"] == WIRE[agent]
        assert row.client == key_id(CLIENT_KEY)
        assert row.session_id == out["session_id"]
        names = [t["function"]["name"] for t in row.tools]
        assert SHELL[agent] in names and all(t["type"] == "function" for t in row.tools)
        assert row.meta["request"]["stream"] is True and row.meta["stream"] is True
        assert row.prompt_tokens and row.completion_tokens
    (call,) = first.tool_calls
    assert call["function"]["name"] == SHELL[agent]
    assert "echo proxied-4242" in call["function"]["arguments"]
    assert second.reply.startswith("tool said:") and "proxied-4242" in second.reply
    # the second turn carries the first's call and the tool's result, in the OpenAI shape
    asked = next(m for m in second.messages if m.get("tool_calls"))
    assert asked["role"] == "assistant" and asked["tool_calls"][0]["id"] == call["id"]
    result = next(m for m in second.messages if m["role"] == "tool")
    assert result["tool_call_id"] == call["id"] and "proxied-4242" in result["content"]
    # the upstream got the client's own key (no key of the proxy's); the log never has it
    assert CLIENT_KEY in json.dumps([c["headers"] for c in upstream_calls])
    assert CLIENT_KEY.encode() not in db_bytes(tmp_path)
    # one session, one episode: the last turn, mined with the tool's result as a fixture
    (episode,) = collapse_sessions([first, second])
    assert episode.id == second.id and episode.meta["session_steps"] == [first.id]
    (group,) = conversations([episode])
    task, why = mine_tool_task(group, MineConfig(max_prompt_chars=200_000))  # Codex: ~20 KB
    assert why is None and task is not None
    (fixture,) = task.state.fixtures
    assert fixture["name"] == SHELL[agent] and "proxied-4242" in fixture["result"]


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_an_adopted_skill_reaches_the_agent_and_stays_out_of_the_log(tmp_path, agent):
    with stack(tmp_path / "bare", needs_skill(MARKER)) as s:
        bare = RUNNERS[agent](s, tmp_path / "bare" / "work")
    adopt(tmp_path, f"Always check the {MARKER} first.")
    with stack(tmp_path, needs_skill(MARKER)) as s:
        skilled = RUNNERS[agent](s, tmp_path / "work")
        sent = s["up"].requests_seen[-1]
    assert bare["result"] == "UNSOLVED" and skilled["result"] == "SOLVED"
    assert MARKER in sent.system  # Messages `system`, Responses `instructions`
    (row,) = rows_of(tmp_path)
    assert row.skill_version == "1" and row.reply == "SOLVED"
    assert MARKER not in json.dumps(row.messages)  # the client's request, as it sent it


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_a_refused_key_is_the_proxys_401(tmp_path, agent):
    with stack(tmp_path, one_tool_then_answer(), require_key="proxy-key-123456") as s:
        out = RUNNERS[agent](s, tmp_path / "work", key="not-the-proxy-key")
        assert s["up"].calls == []  # nothing reached the upstream
        ok = RUNNERS[agent](s, tmp_path / "work2", key="proxy-key-123456")
        forwarded = [c["headers"] for c in s["up"].calls]
    if agent == "claude":  # the agent reports the proxy's refusal in its own words
        assert out["is_error"] is True and out["api_error_status"] == 401, out
    else:
        assert out["rc"] != 0 and out["result"] is None and "401" in out["errors"], out
    assert "agent-upstream-ok" in str(ok["result"])
    assert "proxy-key-123456" not in json.dumps(forwarded)  # the proxy's own key stays home
    assert {r.client for r in rows_of(tmp_path)} == {key_id("proxy-key-123456")}


# ---- the wire formats without the CLIs: non-streamed, keys, errors --------------------------


def messages_turn(s: dict[str, Any], messages: list, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 100, "system": [{"type": "text", "text": "You code."}],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
            "messages": messages, "metadata": {"user_id": json.dumps({"session_id": "s-msg-1"})},
            **kw}  # fmt: skip
    headers = {"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"}
    return loopback.post(f"{s['url']}/messages?beta=true", json=body, headers=headers, timeout=20)


def responses_turn(s: dict[str, Any], items: list, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "instructions": "You code.", "input": items,
            "tools": [{"type": "function", "name": "exec_command", "parameters": {}},
                      {"type": "web_search"}], **kw}  # fmt: skip
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "session-id": "s-resp-1"}
    return loopback.post(f"{s['url']}/responses", json=body, headers=headers, timeout=20)


def test_messages_not_streamed_with_a_tool_round_trip(tmp_path):
    with stack(tmp_path, one_tool_then_answer("echo hi")) as s:
        ask = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
        first = messages_turn(s, ask)
        assert first.status_code == 200 and first.headers["content-type"] == "application/json"
        block = first.json()["content"][0]
        assert block["type"] == "tool_use" and block["input"]["command"] == "echo hi"
        result = {"type": "tool_result", "tool_use_id": block["id"], "content": "hi\n",
                  "cache_control": {"type": "ephemeral"}}  # fmt: skip
        turn2 = [*ask, {"role": "assistant", "content": [block]},
                 {"role": "user", "content": [result]}]  # fmt: skip
        second = messages_turn(s, turn2)
        assert second.json()["content"][0]["text"] == "tool said: hi"
        upstream = s["up"].calls[-1]
    assert upstream["path"] == "/v1/messages" and upstream["query"] == "beta=true"
    one, two = rows_of(tmp_path)
    assert one.session_id == two.session_id == "s-msg-1"
    assert one.messages == [{"role": "system", "content": "You code."},
                            {"role": "user", "content": "go"}]  # fmt: skip
    assert one.tool_calls[0]["function"] == {"name": "Bash",
                                             "arguments": json.dumps({"command": "echo hi",
                                             "description": "Run the command"})}  # fmt: skip
    assert two.messages[2:] == [
        {"role": "assistant", "content": None, "tool_calls": one.tool_calls},
        {"role": "tool", "tool_call_id": block["id"], "content": "hi\n"},
    ]
    assert two.reply == "tool said: hi" and two.meta["finish_reason"] == "end_turn"
    assert two.tools == [{"type": "function", "function": {
        "name": "Bash", "description": "run", "parameters": {"type": "object"}}}]  # fmt: skip
    assert "stream" not in two.meta and two.client == key_id(CLIENT_KEY)


def test_responses_not_streamed_with_a_tool_round_trip(tmp_path):
    with stack(tmp_path, one_tool_then_answer("echo hi")) as s:
        ask = [{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "go"}]}]  # fmt: skip
        first = responses_turn(s, ask)
        (item,) = first.json()["output"]
        assert item["type"] == "function_call" and json.loads(item["arguments"]) == {
            "cmd": "echo hi"
        }
        output = {"type": "function_call_output", "call_id": item["call_id"], "output": "hi"}
        second = responses_turn(s, [*ask, item, output])
        text = second.json()["output"][0]["content"][0]["text"]
    assert text == "tool said: hi"
    one, two = rows_of(tmp_path)
    assert one.session_id == "s-resp-1" and one.meta["hosted_tools"] == ["web_search"]
    assert one.messages == [{"role": "system", "content": "You code."},
                            {"role": "user", "content": "go"}]  # fmt: skip
    assert one.tool_calls == [{"id": item["call_id"], "type": "function",
                               "function": {"name": "exec_command",
                                            "arguments": item["arguments"]}}]  # fmt: skip
    assert two.messages[2:] == [
        {"role": "assistant", "content": None, "tool_calls": one.tool_calls},
        {"role": "tool", "tool_call_id": item["call_id"], "content": "hi"},
    ]
    assert two.reply == "tool said: hi" and two.prompt_tokens and two.completion_tokens
    assert [t["function"]["name"] for t in two.tools] == ["exec_command"]


@pytest.mark.parametrize("wire", ["messages", "responses"])
def test_upstream_errors_pass_through_with_their_status_and_are_logged(tmp_path, wire):
    with stack(tmp_path, needs_skill(MARKER)) as s:
        s["up"].faults.append("429")
        ask = [{"role": "user", "content": "go"}]
        turn = messages_turn if wire == "messages" else responses_turn
        answer = turn(s, ask, stream=True)
    assert answer.status_code == 429 and "injected 429" in answer.text
    (row,) = rows_of(tmp_path)
    assert row.error_status == 429 and "injected 429" in row.error and not row.is_task


def test_x_api_key_and_bearer_both_open_the_proxy(tmp_path):
    with stack(tmp_path, needs_skill(MARKER), require_key="proxy-key-123456") as s:
        ask = [{"role": "user", "content": "go"}]
        for headers in ({"x-api-key": "proxy-key-123456"},
                        {"authorization": "bearer proxy-key-123456"}):  # fmt: skip
            body = {"model": MODEL, "max_tokens": 10, "messages": ask}
            ok = loopback.post(f"{s['url']}/messages", json=body, headers=headers)
            assert ok.status_code == 200, ok.text
        wrong = loopback.post(f"{s['url']}/messages", json=body, headers={"x-api-key": "nope"})
        assert wrong.status_code == 401 and len(s["up"].calls) == 2
        assert "proxy-key-123456" not in json.dumps([c["headers"] for c in s["up"].calls])


def test_the_operators_key_goes_upstream_in_the_wire_formats_header(tmp_path, monkeypatch):
    operator = "sk-ant-operator-" + "Z9" * 12
    with stack(tmp_path, needs_skill(MARKER), api_key=operator) as s:
        ask = [{"role": "user", "content": "go"}]
        messages_turn(s, ask)
        responses_turn(s, ask)
        sent = [{k.lower(): v for k, v in c["headers"].items()} for c in s["up"].calls]
    assert sent[0]["x-api-key"] == operator and sent[0]["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent[0]
    assert sent[1]["authorization"] == f"Bearer {operator}" and "x-api-key" not in sent[1]
    assert CLIENT_KEY not in json.dumps(sent)  # the client's key is not passed on
    data = db_bytes(tmp_path)
    assert operator.encode() not in data and CLIENT_KEY.encode() not in data


def test_upstream_shortcuts_and_a_bare_server_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env-key-000")
    config = ProxyConfig(upstream="anthropic", log_path=tmp_path / "l.db")
    up = build_upstream(config)
    assert (up.base_url, up.key, up.model) == ("https://api.anthropic.com/v1",
                                               "sk-ant-env-key-000", None)  # fmt: skip
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    up = build_upstream(ProxyConfig(upstream="openai", log_path=tmp_path / "l.db"))
    assert (up.base_url, up.key, up.pass_client_auth) == ("https://api.openai.com/v1", None, True)
    up = build_upstream(ProxyConfig(upstream="http://127.0.0.1:9", log_path=tmp_path / "l.db"))
    assert (up.base_url, up.model) == ("http://127.0.0.1:9/v1", None)
    up = build_upstream(ProxyConfig(upstream="http://h:9/v1#m", log_path=tmp_path / "l.db"))
    assert (up.base_url, up.model) == ("http://h:9/v1", "m")


# ---- sessions -------------------------------------------------------------------------------


def test_feedback_on_a_session_attaches_to_its_last_turn(tmp_path):
    with stack(tmp_path, one_tool_then_answer("echo hi"), feedback_key="op-feedback-key-1") as s:
        ask = [{"role": "user", "content": "go"}]
        block = messages_turn(s, ask).json()["content"][0]
        result = {"type": "tool_result", "tool_use_id": block["id"], "content": "hi"}
        last = messages_turn(s, [*ask, {"role": "assistant", "content": [block]},
                                 {"role": "user", "content": [result]}])  # fmt: skip
        fb = loopback.post(f"{s['url']}/feedback",
                        json={"session_id": "s-msg-1", "thumb": "down", "reference": "hello"},
                        headers={"x-api-key": "op-feedback-key-1"})  # fmt: skip
        assert fb.status_code == 200 and fb.json()["id"] == last.headers[ID_HEADER]
        missing = loopback.post(f"{s['url']}/feedback", json={"session_id": "nope", "thumb": "up"})
        assert missing.status_code == 404
        both = loopback.post(f"{s['url']}/feedback",
                          json={"session_id": "s-msg-1", "id": "x", "thumb": "up"})  # fmt: skip
        assert both.status_code == 400
    log = TaskLog(tmp_path / "log.db")
    row = last_turn(log, PROJECT, "s-msg-1")
    assert row.id == last.headers[ID_HEADER]
    assert (row.feedback.thumb, row.feedback.giver, row.feedback.trusted) == (
        "down",
        "operator",
        True,
    )
    (episode,) = collapse_sessions(rows_of(tmp_path))
    assert episode.feedback.reference == "hello"


def test_a_sessions_rows_collapse_to_the_chains_last_turn_side_requests_stay():
    def turn(messages: list, session: str | None = "s1", **kw: Any) -> Interaction:
        return Interaction(messages=messages, reply="r", project="p", source="proxy",
                           session_id=session, **kw)  # fmt: skip

    user = {"role": "user", "content": "go"}
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "out"}
    step1 = turn([user], feedback=_fb(thumb="down", trusted=False))
    step2 = turn([user, call, tool])
    side = turn([{"role": "user", "content": "write a title"}])  # not a step of the chain
    other = turn([user], session="s2")  # another session
    harvested = Interaction(messages=[user], reply="r", project="p", source="claude-code",
                            session_id="s1")  # fmt: skip
    out = collapse_sessions([step1, side, step2, other, harvested])
    assert [it.id for it in out] == [side.id, step2.id, other.id, harvested.id]
    final = out[1]
    assert final.meta["session_steps"] == [step1.id]
    assert final.feedback.thumb == "down" and final.feedback.trusted is False
    assert step2.feedback.thumb is None  # the rows read are not changed


def _fb(**kw: Any) -> Any:
    from selftaught.sleep.intake.log import Feedback

    return Feedback(**kw)


# ---- streams pass through as they arrive ------------------------------------------------------


@pytest.mark.parametrize("wire", ["messages", "responses"])
def test_the_first_byte_reaches_the_client_before_the_upstream_finishes(tmp_path, wire):
    words = " ".join(f"w{i}" for i in range(12))
    with stack(tmp_path, lambda _: words, chunk_delay_s=0.1) as s:
        path = "messages" if wire == "messages" else "responses"
        body = {"model": MODEL, "max_tokens": 50, "stream": True}
        body.update({"messages": [{"role": "user", "content": "go"}]} if wire == "messages"
                    else {"input": "go"})  # fmt: skip
        started = time.perf_counter()
        first = None
        with loopback.stream("POST", f"{s['url']}/{path}", json=body, timeout=30) as response:
            chunks = []
            for chunk in response.iter_raw():
                first = first if first is not None else time.perf_counter() - started
                chunks.append(chunk)
        total = time.perf_counter() - started
    assert len(chunks) > 3  # passed through as it came, not one buffered body
    assert first is not None and first < 0.5 and total > 1.5  # ~20 events x 0.1 s
    (row,) = rows_of(tmp_path)
    assert row.reply == words and row.meta["stream"] is True


def test_the_night_reads_one_row_per_agent_session(tmp_path):
    """Where the night gathers rows (`cycle.window_rows`), a session's steps are one row."""
    from selftaught.sleep.night.cycle import NightConfig, window_rows

    with stack(tmp_path, one_tool_then_answer("echo hi")) as s:
        ask = [{"role": "user", "content": "go"}]
        block = messages_turn(s, ask).json()["content"][0]
        result = {"type": "tool_result", "tool_use_id": block["id"], "content": "hi"}
        messages_turn(s, [*ask, {"role": "assistant", "content": [block]},
                          {"role": "user", "content": [result]}])  # fmt: skip
        responses_turn(s, [{"role": "user", "content": "another session"}])
    log = TaskLog(tmp_path / "log.db")
    config = NightConfig(project=PROJECT, home=tmp_path / "home", since=0)
    ((_, rows),) = window_rows(log, config, tmp_path / "home", time.time() + 1).values()
    assert log.count() == 3 and len(rows) == 2
    assert sorted(r.session_id for r in rows) == ["s-msg-1", "s-resp-1"]
    episode = next(r for r in rows if r.session_id == "s-msg-1")
    assert episode.reply == "tool said: hi" and len(episode.meta["session_steps"]) == 1


def test_a_canary_shadow_answer_on_the_messages_wire_gets_the_staged_skill(tmp_path):
    from tests.test_probation import PROJECT as STAGED_PROJECT
    from tests.test_probation import stage

    home = tmp_path / "home"
    stage(home, "n1", f"Staged rule {MARKER}.")
    with AgentUpstream(needs_skill(MARKER)) as up:
        config = ProxyConfig(upstream=up.root_url, project=STAGED_PROJECT, port=0,
                             log_path=tmp_path / "log.db", home=home, canary_share=1.0)  # fmt: skip
        with proxy_in_background(config) as (url, app):
            body = {"model": MODEL, "max_tokens": 10, "stream": True,
                    "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
            served = loopback.post(f"{url}/messages", json=body, timeout=20)
            writer, deadline = app.state.proxy.writer, time.monotonic() + 20
            while writer.snapshot()["submitted"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # the shadow answer is asked for after the served one
            assert writer.flush(30)
    assert "UNSOLVED" in served.text  # the client got the adopted (empty) version's answer
    systems = sorted(r.system for r in up.requests_seen)
    assert systems[0] == "" and MARKER in systems[1]
    rows = TaskLog(tmp_path / "log.db").query()
    shadow = next(r for r in rows if r.shadow_of)
    assert shadow.reply == "SOLVED" and shadow.skill_version == "staged:n1"
    assert shadow.meta["wire"] == "messages" and shadow.shadow_of == served.headers[ID_HEADER]


def test_last_turn_pages_back_through_the_log(tmp_path, monkeypatch):
    from selftaught.sleep.intake import sessions

    monkeypatch.setattr(sessions, "LOOKUP_PAGE", 3)
    log = TaskLog(tmp_path / "log.db")

    def row(t: float, session: str | None, **kw: Any) -> Interaction:
        kw.setdefault("project", "p")
        return Interaction(messages=[{"role": "user", "content": "q"}], reply="a",
                           source="proxy", created_at=t, session_id=session, **kw)  # fmt: skip

    old, newer = row(1.0, "s1"), row(2.0, "s1")
    failed = row(9.0, "s1", error="HTTP 500")
    noise = [row(10.0 + i, "other") for i in range(8)] + [row(5.0, None) for _ in range(4)]
    log.add_many([old, newer, failed, *noise, row(3.0, "s1", project="q")])
    assert last_turn(log, "p", "s1").id == newer.id  # not the failed one, not project q's
    assert last_turn(log, "p", "nope") is None
