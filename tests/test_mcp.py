"""`selftaught mcp` through the official SDK's stdio client, spawning `python -m selftaught mcp
--project P` as an agent would: feedback reaches the log on the session's last answered turn
(giver mcp, untrusted unless --trust-feedback), for a harvested transcript and for rows the
proxy logged; a session of another project or folder is not found and nothing of it leaks;
the adopted skill and the last night's report read what `read_adopted` and the night wrote;
bad input is an MCP tool error with one sentence; nothing adopts."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.errors import MissingDependency
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.mcp_server import NothingLogged, SleepTools, build_server
from selftaught.sleep.paths import read_adopted
from tests.agent_upstream import AgentRequest, AgentUpstream, Call, agent_env, find_cli
from tests.fake_upstream import FakeUpstream
from tests.test_sleep_night_cli import answer, fill

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
FIXTURES = Path(__file__).parent / "fixtures"
CLAUDE_SESSION = "7f3c2a91-5b4e-4c1d-9e8f-2a6b0c4d1e33"
PROXY_SESSION = "proxy-sess-1"
WEBAPP = "/home/dev/src/webapp"  # the fixture transcript's folder
T = TypeVar("T")


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, Path]:
    paths = {
        "home": tmp_path / "home",
        "log": tmp_path / "log.db",
        "claude": tmp_path / "claude",
        "codex": tmp_path / "codex",
    }
    shutil.copytree(FIXTURES / "claude_code" / "projects", paths["claude"] / "projects")
    for transcript in (paths["claude"] / "projects").glob("*/*.jsonl"):  # ran where the
        text = transcript.read_text().replace(WEBAPP, str(tmp_path))  # server runs
        transcript.write_text(text)
    paths["codex"].mkdir()
    monkeypatch.setenv("SELFTAUGHT_HOME", str(paths["home"]))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(paths["log"]))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(paths["claude"]))
    monkeypatch.setenv("CODEX_HOME", str(paths["codex"]))
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    monkeypatch.delenv("CODEX_THREAD_ID", raising=False)
    return paths


def with_server(
    env: dict[str, Path],
    talk: Callable[[Client], Awaitable[T]],
    *options: str,
    folder: Path | None = None,
    **extra_env: str,
) -> T:
    """Spawn `python -m selftaught mcp --project demo` over stdio (in the folder the fixture
    transcripts ran in) and run `talk` against it."""
    server_env = {
        "PYTHONPATH": str(SRC),
        "HOME": str(env["home"].parent),  # nothing of the real home is read
        "SELFTAUGHT_HOME": str(env["home"]),
        "SELFTAUGHT_LOG": str(env["log"]),
        "CLAUDE_CONFIG_DIR": str(env["claude"]),
        "CODEX_HOME": str(env["codex"]),
        **extra_env,
    }
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "selftaught", "mcp", "--project", "demo", *options],
        env=server_env,
        cwd=str(folder or env["home"].parent),
    )

    async def main() -> T:
        async with Client(params, read_timeout_seconds=60) as client:
            return await talk(client)

    return asyncio.run(main())


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def proxy_rows(log_path: Path) -> dict[str, Interaction]:
    """One agent session logged by the proxy (the last request still a tool call) and a
    newer row of another session."""
    rows = {
        "first": Interaction([{"role": "user", "content": "q1"}], "first answer", created_at=100),
        "final": Interaction([{"role": "user", "content": "q2"}], "final answer", created_at=200),
        "calling": Interaction(
            [{"role": "user", "content": "q3"}],
            None,
            created_at=300,
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "give_feedback"}}],
        ),
        "other": Interaction([{"role": "user", "content": "x"}], "x", created_at=400),
    }
    for name, row in rows.items():
        row.project, row.source = "demo", "proxy"
        row.session_id = "another-session" if name == "other" else PROXY_SESSION
    with TaskLog(log_path) as log:
        log.add_many(rows.values())
    return rows


def test_feedback_through_a_real_mcp_client_lands_on_the_sessions_last_turn(env):
    rows = proxy_rows(env["log"])

    async def talk(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {"tools": (await client.list_tools()).tools}
        out["harvested"] = await client.call_tool(
            "give_feedback",
            {
                "thumb": "down",
                "reference": "use sqlite in memory",
                "comment": "close, but the fixture is wrong",
                "session_id": CLAUDE_SESSION,
            },
        )
        out["from_env"] = await client.call_tool("give_feedback", {"thumb": "up"})
        out["empty"] = await client.call_tool("give_feedback", {"session_id": CLAUDE_SESSION})
        out["unknown"] = await client.call_tool(
            "give_feedback", {"thumb": "up", "session_id": "no-such-session"}
        )
        out["bad_id"] = await client.call_tool(
            "give_feedback", {"thumb": "up", "session_id": "../../x"}
        )
        out["bad_thumb"] = await client.call_tool("give_feedback", {"thumb": "sideways"})
        out["adopted"] = await client.call_tool("adopted_skill", {})
        out["night"] = await client.call_tool("last_night_report", {})
        return out

    out = with_server(env, talk, CLAUDE_CODE_SESSION_ID=PROXY_SESSION)
    tools = {t.name: t for t in out["tools"]}
    assert set(tools) == {"give_feedback", "adopted_skill", "last_night_report"}  # no adopt
    assert tools["adopted_skill"].annotations.read_only_hint is True

    # a Claude Code session on disk: harvested first (its last, unanswered turn left out)
    harvested = out["harvested"]
    assert not harvested.is_error, text_of(harvested)
    got = harvested.structured_content
    assert got["session_from"] == "argument" and got["harvested_new_turns"] == 2
    log = TaskLog(env["log"])
    turns = log.query(LogFilter(session_id=CLAUDE_SESSION, newest_first=False))
    assert len(turns) == 2 and got["attached_to"] == turns[-1].id
    fb = turns[-1].feedback
    assert (fb.thumb, fb.reference, fb.comment) == (
        "down",
        "use sqlite in memory",
        "close, but the fixture is wrong",
    )
    assert fb.giver == "mcp" and fb.trusted is False  # the agent's word is evidence
    assert got["trusted"] is False
    assert turns[0].feedback.empty() and turns[-1].project == "demo"

    # the session that started the server (CLAUDE_CODE_SESSION_ID), logged by the proxy: its
    # newest answered turn, not the tool call in flight nor another session's newer row
    from_env = out["from_env"].structured_content
    assert from_env["session_from"] == "CLAUDE_CODE_SESSION_ID"
    assert from_env["attached_to"] == rows["final"].id
    assert from_env["turn"]["reply"] == "final answer" and from_env["harvested_new_turns"] == 0
    final = log.get(rows["final"].id).feedback
    assert (final.thumb, final.giver, final.trusted) == ("up", "mcp", False)
    assert all(log.get(rows[n].id).feedback.empty() for n in ("first", "calling", "other"))

    # bad input: tool errors, one sentence each, and nothing stored
    assert out["empty"].is_error and "feedback is empty" in text_of(out["empty"])
    assert out["unknown"].is_error
    assert "nothing is logged for session no-such-session in project demo" in text_of(
        out["unknown"]
    )
    assert out["bad_id"].is_error and "invalid session id '../../x'" in text_of(out["bad_id"])
    assert out["bad_thumb"].is_error and "'up' or 'down'" in text_of(out["bad_thumb"])
    assert log.count(LogFilter(has_feedback=True)) == 2

    # nothing adopted, no night yet
    assert out["adopted"].structured_content == {
        "project": "demo",
        "version": None,
        "skill": "",
        "memory": "",
        "adapter": None,
    }
    assert out["night"].is_error
    assert "project 'demo' has not been through a night yet" in text_of(out["night"])


def test_adopted_skill_and_last_night_report_read_what_the_night_wrote(env, monkeypatch):
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()
    with FakeUpstream(answer) as upstream:
        fill(env["log"], upstream=f"{upstream.base_url}#fake-model")
        ran = runner.invoke(app, ["sleep", "run", "--max-tokens", "32"])
        assert ran.exit_code == 0, ran.output
    adopted = runner.invoke(app, ["sleep", "adopt", "--project", "demo"])
    assert adopted.exit_code == 0, adopted.output

    async def talk(client: Client) -> tuple[Any, Any]:
        skill = await client.call_tool("adopted_skill", {})
        night = await client.call_tool("last_night_report", {})
        return skill, night

    skill, night = with_server(env, talk)
    expected = read_adopted("demo")
    assert expected.version == "1" and "rule alpha" in expected.skill
    assert skill.structured_content == {
        "project": "demo",
        "version": expected.version,
        "skill": expected.skill,
        "memory": expected.memory,
        "adapter": None,
    }
    night_dir, last = staging.list_nights("demo")[-1]
    got = night.structured_content
    assert got["night"] == night_dir.name and got["status"] == last.status == "adopted"
    assert got["adopted_version"] == 1 and got["reason"] == last.reason
    assert got["report"] == (night_dir / "report.md").read_text()


def test_without_a_session_id_the_projects_newest_session_is_used(env):
    tools = SleepTools("demo", env["log"], env={})
    with pytest.raises(NothingLogged, match="no agent session is logged in project 'demo'"):
        tools.give_feedback(thumb="up")
    rows = proxy_rows(env["log"])
    done = tools.give_feedback(comment="nice")
    # the newest session in demo is "another-session" (its row is the newest)
    assert done["session_id"] == "another-session" and done["attached_to"] == rows["other"].id
    assert done["session_from"] == "newest session logged in project demo"


def test_a_session_of_another_project_or_folder_is_not_found_and_nothing_leaks(env, tmp_path):
    """A project is a wall: feedback naming another project's session, or a transcript of
    another repository, gets the answer a session that does not exist gets; nothing is
    stored, harvested or returned."""
    secret = Interaction(
        [{"role": "user", "content": "secret request of billing"}],
        "secret reply of billing",
        project="billing",
        source="proxy",
        session_id="billing-session",
    )
    with TaskLog(env["log"]) as log:
        log.add(secret)
    elsewhere = tmp_path / "other-repo"  # the server runs here; the transcript ran in tmp_path
    elsewhere.mkdir()
    sids = ("billing-session", CLAUDE_SESSION, "no-such-session")

    async def talk(client: Client) -> list[Any]:
        args = {"thumb": "up", "comment": "trust me"}
        return [await client.call_tool("give_feedback", {**args, "session_id": s}) for s in sids]

    results = with_server(env, talk, folder=elsewhere)
    assert all(r.is_error for r in results), [text_of(r) for r in results]
    answers = {text_of(r).replace(sid, "ID") for r, sid in zip(results, sids, strict=True)}
    assert len(answers) == 1, answers  # one answer: no oracle
    assert "secret" not in text_of(results[0])
    log = TaskLog(env["log"])
    assert log.count() == 1 and log.get(secret.id).feedback.empty()  # nothing harvested
    # the server in the transcript's own folder finds it (in its project, untrusted)
    done = SleepTools("demo", env["log"], env={}, folder=tmp_path).give_feedback(
        thumb="down", session_id=CLAUDE_SESSION
    )
    row = log.get(done["attached_to"])
    assert row.project == "demo" and (row.feedback.giver, row.feedback.trusted) == ("mcp", False)


def test_trust_feedback_makes_the_agents_feedback_the_operators(env):
    rows = proxy_rows(env["log"])

    async def talk(client: Client) -> Any:
        return await client.call_tool("give_feedback", {"thumb": "up"})

    done = with_server(env, talk, "--trust-feedback", CLAUDE_CODE_SESSION_ID=PROXY_SESSION)
    assert not done.is_error, text_of(done)
    assert done.structured_content["trusted"] is True
    fb = TaskLog(env["log"]).get(rows["final"].id).feedback
    assert (fb.thumb, fb.giver, fb.trusted) == ("up", "mcp", True)


def test_a_session_id_two_proxy_clients_logged_under_is_refused(env):
    """A session id is a client's: when bob's proxy rows carry alice's session id, the MCP
    feedback (the operator's with --trust-feedback) goes to neither, and says why."""
    proxy_rows(env["log"])
    forged = Interaction([{"role": "user", "content": "q9"}], "bob's answer", created_at=900)
    forged.project, forged.source, forged.session_id = "demo", "proxy", PROXY_SESSION
    forged.client = "bob"
    with TaskLog(env["log"]) as log:
        log.add(forged)
    tools = SleepTools("demo", env["log"], env={}, trust_feedback=True)
    with pytest.raises(ValueError, match="logged by 2 proxy clients in project demo"):
        tools.give_feedback(thumb="up", session_id=PROXY_SESSION)
    assert TaskLog(env["log"]).count(LogFilter(has_feedback=True)) == 0


def test_the_mcp_command_without_the_sdk_names_the_extra(env, monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)  # import fails
    with pytest.raises(MissingDependency, match=r"pip install 'selftaught\[mcp\]'"):
        build_server(SleepTools("demo"))
    result = CliRunner().invoke(app, ["mcp", "--project", "demo"])
    assert result.exit_code == 6 and "selftaught[mcp]" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["mcp", "--project", "../x"])
    assert result.exit_code == 2 and "invalid project name" in result.output


@pytest.mark.skipif(find_cli("claude") is None, reason="Claude Code is not installed")
def test_real_claude_code_gives_feedback_through_the_mcp_server(env, tmp_path):
    """Claude Code 2.1.328 with the server in its --mcp-config, against the scripted upstream:
    turn 1 answers "4"; resumed, the user says it was wrong and the model calls
    give_feedback. The server (started by Claude Code, which sets CLAUDE_CODE_SESSION_ID)
    harvests the session and attaches the feedback to turn 1, not to the turn in flight."""
    tool = "mcp__selftaught__give_feedback"

    def policy(request: AgentRequest) -> str | Call:
        said = next(t["text"] for t in reversed(request.turns) if t["role"] == "user")
        if "wrong" not in said:
            return "4"
        if request.tool_results and request.tool_results[-1].name == tool:
            return "noted: " + request.tool_results[-1].output
        return Call(tool, {"thumb": "down", "reference": "5"}) if tool in request.tools else "?"

    server = {
        "command": sys.executable,
        "args": ["-m", "selftaught", "mcp", "--project", "demo", "--trust-feedback"],
        "env": {"PYTHONPATH": str(SRC), "SELFTAUGHT_HOME": str(env["home"])},
    }
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"selftaught": server}}))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with AgentUpstream(policy) as up:
        agent = agent_env(
            tmp_path / "agent-home",
            CLAUDE_CONFIG_DIR=str(env["claude"]),
            ANTHROPIC_BASE_URL=up.root_url,
            ANTHROPIC_API_KEY="test-key",
            SELFTAUGHT_LOG=str(env["log"]),  # inherited by the server Claude Code starts
            ENABLE_TOOL_SEARCH="false",  # MCP tools up front (a scripted model cannot search)
        )
        claude = [str(find_cli("claude")), "--output-format", "json", "--model", up.model]
        first = subprocess.run(
            [*claude, "-p", "what is 2+2?"],
            cwd=workspace, env=agent, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        session = json.loads(first.stdout)["session_id"]
        second = subprocess.run(
            [*claude, "-p", "that was wrong, it is 5", "--resume", session,
             "--mcp-config", str(config), "--allowedTools", tool],
            cwd=workspace, env=agent, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    result = json.loads(second.stdout)["result"]
    assert result.startswith("noted: ") and '"session_from":"CLAUDE_CODE_SESSION_ID"' in result
    (turn,) = TaskLog(env["log"]).query(LogFilter(session_id=session))  # the running one: not
    assert turn.messages[-1]["content"] == "what is 2+2?" and turn.reply == "4"
    fb = turn.feedback
    assert (fb.thumb, fb.reference, fb.giver, fb.trusted) == ("down", "5", "mcp", True)
