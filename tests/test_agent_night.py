"""A night for a coding agent: its sessions mined into tasks, the skill validated on the agent.

- Mining: a Claude Code / Codex row (logged by the proxy on the Messages / Responses wire, or
  harvested from a transcript) is the user's request; the harness's system / developer
  prompt, what it writes into user turns (CLAUDE.md and AGENTS.md among it) and its tool
  schemas are not part of the task, nor of its size check; one rule for both sources.
- Replay on the agent: with a CLI agent as the target, each task's request goes to the agent
  (its own tools, a fresh workspace, the skill in its instruction file); the gate's val runs
  are the agent's; the report shows what the agent did. A bare model replays the same tasks
  as episodes, with the tools and the recorded results.
- End to end: a `cmd:` agent (always runs), then Claude Code and Codex through the proxy
  (skipped without the CLIs): sessions → operator feedback → `sleep run --model <agent>` →
  staged → `sleep adopt` → the next session through the proxy is solved.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.intake.proxy_wire import WIRES, session_id
from selftaught.sleep.intake.sessions import is_agent_session, task_turns
from selftaught.sleep.night.agent_replay import (
    CONTEXT_HEAD,
    NOT_CHECKABLE,
    AgentNightTask,
    agent_prompt,
    for_agent,
)
from selftaught.sleep.night.cycle import NightConfig, NightModels, mine, run_night
from selftaught.sleep.night.mine import MineConfig
from selftaught.sleep.paths import read_adopted
from selftaught.tasks.episode import is_tool_task
from tests import loopback
from tests.agent_upstream import (
    Call,
    cli_dir,
    codex_config,
    find_cli,
    shell_arguments,
)
from tests.scripted import ScriptedModel, append, canned_analyst, edits_json, user_of

MARKER = "MARKER-NIGHT-4711"
RULE = f"Always check the {MARKER} first."
PROJECT = "agents"
# a harness prompt as long as the real ones (Claude Code ~16 KB, Codex ~20 KB), stating rules
# a miner must not take for the user's
HARNESS = "You are a coding agent. Respond in JSON. Use bullet points. " + "Be careful. " * 1800
CLAUDE_MD = (
    "<system-reminder>\nContents of /work/CLAUDE.md (project instructions):\n\nAnswer in "
    "French.\n</system-reminder>\n<system-reminder>\nAttribution for git commits.\n"
    "</system-reminder>"
)
AGENTS_MD = (
    "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\nAnswer in French.\n</INSTRUCTIONS>\n"
    "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"
)


# ---- rows as the proxy logs them ------------------------------------------------------------


def claude_body(request: str, session: str, steps: list[dict] = ()) -> dict[str, Any]:
    """A Claude Code request body: system blocks, CLAUDE.md in a <system-reminder> block of the
    user turn, the request, a trailing system turn, its tools, its session in metadata."""
    return {
        "model": "claude-x",
        "system": [{"type": "text", "text": HARNESS}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": CLAUDE_MD}, {"type": "text", "text": request}],
            },
            *steps,
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
            {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
        ],
        "metadata": {"user_id": json.dumps({"session_id": session})},
        "stream": True,
    }


def codex_body(request: str, session: str) -> dict[str, Any]:
    """A Codex request body: the harness prompt in developer items, AGENTS.md and the
    environment in a user item, then the request."""

    def item(role: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    return {
        "model": "gpt-x",
        "input": [
            item("developer", HARNESS),
            item("developer", "<permissions instructions>never</permissions instructions>"),
            item("user", AGENTS_MD),
            item("user", request),
        ],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "client_metadata": {"session_id": session},
        "stream": True,
    }


def proxy_row(wire: str, body: dict[str, Any], reply: str, **kw: Any) -> Interaction:
    """The row the proxy logs for `body` on `wire` (the same conversion it runs)."""
    logged = WIRES[wire].logged(body)
    return Interaction(
        messages=logged.messages,
        reply=reply,
        project=PROJECT,
        source="proxy",
        meta={"request": logged.request, "wire": wire},
        tools=logged.tools,
        tool_choice=logged.tool_choice,
        session_id=session_id({}, body),
        **kw,
    )


def corrected(reference: str = "SOLVED") -> Feedback:
    return Feedback(thumb="down", reference=reference)


# ---- mining -----------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["messages", "responses"])
def test_an_agent_request_is_mined_as_the_users_words_whatever_its_harness(wire):
    body = (claude_body if wire == "messages" else codex_body)("Fix bug 17 in parser.py", "s-1")
    row = proxy_row(wire, body, "UNSOLVED", feedback=corrected())
    assert len(json.dumps(row.messages)) > 20_000 and is_agent_session(row)
    tasks, report = mine([row], MineConfig())  # the default 12,000-character limit
    assert report.dropped == {}
    (task,) = tasks
    assert task.messages == [{"role": "user", "content": "Fix bug 17 in parser.py"}]
    assert task.state.rules == ()  # "Respond in JSON", "in French": the harness's, not a rule
    assert list(task.state.tools) == row.tools and task.reference == "SOLVED"
    # the user's own words still count: a request over the limit is still dropped
    long = (claude_body if wire == "messages" else codex_body)("y" * 12_001, "s-9")
    row = proxy_row(wire, long, "UNSOLVED", feedback=corrected())
    assert mine([row], MineConfig())[1].dropped == {"longer than 12000 characters": 1}


def test_a_session_and_its_transcript_are_one_task_by_one_rule():
    logged = proxy_row("messages", claude_body("Fix bug 17", "s-2"), "UNSOLVED")
    logged.feedback = corrected()
    harvested = Interaction(
        messages=[{"role": "user", "content": "Fix bug 17"}],
        reply="UNSOLVED",
        project=PROJECT,
        source="claude-code",
        session_id="s-2",
        private=True,
        feedback=corrected(),
    )
    assert is_agent_session(harvested) and task_turns(harvested) == harvested.messages
    (task,), report = mine([logged, harvested], MineConfig())
    assert report.tasks == 1 and set(task.origins) == {"proxy", "claude-code"}
    assert sorted(task.sources) == sorted([logged.id, harvested.id])


def test_an_app_on_the_messages_api_keeps_its_system_prompt():
    body = claude_body("Summarize this ticket", "unused")
    body.pop("metadata")  # an app calling the API: no agent session
    row = proxy_row("messages", body, "A summary", feedback=corrected("Short summary"))
    assert not is_agent_session(row)
    assert task_turns(row)[0] == {"role": "system", "content": HARNESS}
    assert mine([row], MineConfig())[1].dropped == {"longer than 12000 characters": 1}


def session_steps() -> list[Interaction]:
    """A Claude Code session: the request → a Bash call; its result → the answer; then a
    second request in the same session."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "make"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 errors"}
    first_steps = [
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    answered = [*first_steps, {"role": "assistant", "content": [{"type": "text", "text": "Done"}]}]
    second = [*answered, {"role": "user", "content": [{"type": "text", "text": "Now fix 2"}]}]
    return [
        proxy_row("messages", claude_body("Fix bug 1", "s-3"), None, tool_calls=[call]),
        proxy_row("messages", claude_body("Fix bug 1", "s-3", first_steps), "Done"),
        proxy_row(
            "messages", claude_body("Fix bug 1", "s-3", second), "UNSOLVED", feedback=corrected()
        ),  # fmt: skip
    ]


def test_earlier_turns_of_a_session_are_kept_and_quoted_to_an_agent():
    from selftaught.sleep.intake.sessions import collapse_sessions

    (episode,) = collapse_sessions(session_steps())
    (task,), _ = mine([episode], MineConfig())
    roles = [m["role"] for m in task.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert (
        task.messages[0]["content"] == "Fix bug 1" and task.messages[-1]["content"] == "Now fix 2"
    )
    assert list(task.state.fixtures) == [
        {"name": "Bash", "arguments": {"command": "make"}, "result": "3 errors"}
    ]
    (prompt,) = agent_prompt(task.messages)
    assert prompt["role"] == "user" and prompt["content"].startswith(CONTEXT_HEAD)
    for said in ("User: Fix bug 1", 'Assistant called Bash({"command": "make"})',
                 "Tool result: 3 errors", "Assistant: Done"):  # fmt: skip
        assert said in prompt["content"]
    assert prompt["content"].endswith("The request:\nNow fix 2")
    agent_task = AgentNightTask(PROJECT, {"train": [task]})
    assert not is_tool_task(agent_task)  # no tools, no fixtures: the agent brings its own
    assert agent_task.examples("train")[0].input == [prompt]


def test_a_corrected_tool_call_alone_is_not_checked_on_an_agent():
    rows = session_steps()[:2]
    only_call = json.dumps({"name": "Bash", "arguments": {"command": "make test"}})
    rows[1].feedback = Feedback(thumb="down", reference=only_call)
    tasks, _ = mine(rows, MineConfig())
    assert tasks[0].check == "tool_call"
    kept, left = for_agent(tasks)
    assert kept == [] and left == tasks
    both = json.dumps({"tool_calls": [json.loads(only_call)], "answer": "fixed"})
    rows[1].feedback = Feedback(thumb="down", reference=both)
    kept, left = for_agent(mine(rows, MineConfig())[0])
    assert left == [] and "not checked on the agent's run" in kept[0].notes[0]


# ---- a night on a bare model: the same tasks as episodes ----------------------------------------


def fill_agent_log(log_path: Path, n: int = 7, wire: str = "messages") -> None:
    """`n` sessions of a coding agent, each answered UNSOLVED and corrected to SOLVED by the
    operator, and one whose only correction is a tool call."""
    log = TaskLog(log_path)
    body = claude_body if wire == "messages" else codex_body
    for i in range(n):
        log.add(proxy_row(wire, body(f"Run check number {10 * i + 7}", f"s-{i}"), "UNSOLVED",
                          feedback=corrected()))  # fmt: skip
    log.add(proxy_row(wire, body("Run check number 999", "s-call"), "UNSOLVED",
                      feedback=Feedback(thumb="down", reference=json.dumps(
                          {"name": "Bash", "arguments": {"command": "make"}}))))  # fmt: skip
    log.close()


def marker_answer(messages: list[dict]) -> str:
    system = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    return "SOLVED" if MARKER in system else "UNSOLVED"


def learns_the_marker(messages: list[dict]) -> str:
    """The analyst: a rule with the marker when it sees UNSOLVED replies whose reference is
    SOLVED; nothing otherwise."""
    text = user_of(messages)
    return edits_json(append(RULE)) if "UNSOLVED" in text and "SOLVED" in text else '{"edits": []}'


def test_a_bare_model_replays_agent_sessions_as_episodes_without_the_harness(tmp_path):
    fill_agent_log(tmp_path / "log.db")
    target = ScriptedModel(marker_answer, "bare")
    models = NightModels(target, "bare", canned_analyst(failure=learns_the_marker), "analyst")
    config = NightConfig(home=tmp_path, log_path=tmp_path / "log.db", documents=("skill",))
    (night,) = run_night(config, models=models)
    assert night.status == "staged" and night.replay == "episode"
    assert night.mining.tasks == 8  # the tool-call task too: a bare model is checked
    assert target.calls and all(HARNESS not in json.dumps(m) for m in target.calls)
    assert all([t["function"]["name"] for t in p.tools] == ["Bash", "Read"] for p in target.params)


# ---- a night on a cmd: agent, through the CLI ----------------------------------------------------

AGENT_SCRIPT = f"""\
import pathlib, sys
prompt = sys.stdin.read()
pathlib.Path("checked.txt").write_text(prompt)  # the agent's work: a file in its workspace
rules = pathlib.Path("AGENTS.md").read_text() if pathlib.Path("AGENTS.md").exists() else ""
print("SOLVED" if "{MARKER}" in rules else "UNSOLVED, see AKIAIOSFODNN7EXAMPLE")
"""


@pytest.fixture
def night_env(tmp_path, monkeypatch):
    home, log = tmp_path / "home", tmp_path / "log.db"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log))
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())

    return home, log, invoke


def test_a_night_on_a_cmd_agent_validates_the_skill_on_the_agent(tmp_path, night_env):
    from tests.fake_upstream import FakeUpstream

    home, log, run = night_env
    fill_agent_log(log)
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    spec = f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    with FakeUpstream(canned_analyst(failure=learns_the_marker).fn) as analyst:
        night = ("--model", spec, "--optimizer-model", f"{analyst.base_url}#fake-model",
                 "--documents", "skill", "--allow-cmd-replay")  # fmt: skip
        code, planned = run("sleep", "plan", "--json", *night)
        assert code == 0 and not analyst.calls, planned
        code, text = run("sleep", "run", *night)
    assert code == 0, text
    # the plan counted the agent's runs: each replay is a run of it, and none was more
    plan = json.loads(planned)
    assert plan["roles"]["agent"] and plan["tasks"]["dropped"] == {NOT_CHECKABLE: 1}
    runs = [p for p in plan["phases"] if p["role"] == "target"]
    assert all("each a run of the agent" in p["note"] for p in runs)
    assert f"{PROJECT}: staged" in text
    report_md = Path(text.split("report: ")[1].split()[0])
    report = json.loads((report_md.parent / "report.json").read_text())
    assert report["replay"] == "agent" and report["models"]["target"] == spec
    assert report["mining"]["dropped"] == {NOT_CHECKABLE: 1}
    for role in ("target", "optimizer"):
        most = sum(p["calls"] for p in plan["phases"] if p["role"] == role)
        assert 0 < report["usage"][role]["calls"] <= most, role
    proposal = report["proposal"]
    assert proposal["val_before"]["hard"] == 0.0 and proposal["val_after"]["hard"] == 1.0
    # the val runs were the agent's: its CLI, the file it wrote, before and after
    diag = json.loads((report_md.parent / "diagnostics.json").read_text())
    for row in diag["val_before"] + diag["val_after"]:
        assert row["agent"]["cli"] == "cmd" and row["agent"]["files_changed"] == [
            "A checked.txt (+1)"
        ]
    assert {r["reply_head"] for r in diag["val_before"]} == {
        "UNSOLVED, see [REDACTED:aws_access_key_id]"
    }
    assert {r["reply_head"] for r in diag["val_after"]} == {"SOLVED"}
    md = report_md.read_text()
    assert "- replay: on the agent itself" in md and "## Agent runs on val" in md
    assert "adopted: failed · files changed: A checked.txt (+1) · answer: UNSOLVED, see [RED" in md
    assert "AKIA" not in md  # what the agent said is redacted as in diagnostics.json
    assert "candidate: solved · files changed: A checked.txt (+1) · answer: SOLVED" in md
    code, text = run("sleep", "adopt", "--project", PROJECT)
    assert code == 0 and read_adopted(PROJECT, home).skill.strip() == RULE


# ---- Claude Code and Codex through the proxy: the whole loop ------------------------------------

CLI_TIMEOUT_S = 120
PROGRAMS = {"claude-code": "claude", "codex": "codex"}
LIVE_FILES = {"claude-code": "CLAUDE.md", "codex": "AGENTS.md"}


def check_then_needs_skill(marker: str):
    """The scripted model: first runs `echo checked > check.txt` with the agent's shell tool,
    then answers SOLVED when the marker is in what the agent put before it, else UNSOLVED."""

    def policy(request):
        tool = request.shell_tool()
        if not request.tool_results and tool is not None:
            return Call(tool, shell_arguments(tool, "echo checked > check.txt"))
        return "SOLVED" if marker in request.context() else "UNSOLVED"

    return policy


def run_agent(kind: str, prompt: str, workdir: Path, proxy_url: str) -> dict[str, Any]:
    """One session of the real CLI through the proxy: its answer and session id."""
    from tests.agent_upstream import MODEL, agent_env

    workdir.mkdir(parents=True, exist_ok=True)
    if kind == "claude-code":
        env = agent_env(workdir.parent / "claude-home",
                        ANTHROPIC_BASE_URL=proxy_url.removesuffix("/v1"),
                        ANTHROPIC_API_KEY="sk-ant-client-key-123456")  # fmt: skip
        cmd = [find_cli("claude"), "-p", prompt, "--output-format", "json", "--allowedTools",
               "Bash", "--model", MODEL]  # fmt: skip
    else:
        home = workdir.parent / "codex-home"
        env = agent_env(home, X_KEY="sk-client-key-123456")
        codex_config(home / ".codex", proxy_url, key_env="X_KEY")
        cmd = [find_cli("codex"), "exec", "--skip-git-repo-check", "--json", prompt]
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    if kind == "claude-code":
        out = json.loads(done.stdout)
        return {"result": out.get("result"), "session_id": out.get("session_id")}
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    said = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"]  # fmt: skip
    thread = next((e["thread_id"] for e in events if e.get("type") == "thread.started"), None)
    return {"result": said[-1] if said else done.stderr[-500:], "session_id": thread}


def point_the_night_at(kind: str, up, tmp_path: Path, monkeypatch) -> None:
    """The night's agent talks to the upstream directly (not through the proxy: its replays
    are not traffic)."""
    for var in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SELFTAUGHT_AGENT_CLIS", str(cli_dir()))
    if not (shutil.which("bwrap") and shutil.which("socat")):  # Claude Code's sandbox needs them
        monkeypatch.setenv("SELFTAUGHT_CLAUDE_SANDBOX", "0")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", up.root_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-night-key-123456")
    codex_config(tmp_path / "night-codex", up.base_url, model=up.model, key_env="X_KEY")
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "night-codex"))
    monkeypatch.setenv("X_KEY", "sk-night-key-123456")


# 8 sessions and ~20 night runs of the real CLI: measured 21 s (Claude Code) and 13 s (Codex)
# at load 4.9 on 2 cores
@pytest.mark.parametrize("kind", ["claude-code", "codex"])
def test_an_agent_through_the_proxy_learns_a_skill_validated_on_itself(
    kind, tmp_path, monkeypatch, night_env
):
    pytest.importorskip("fastapi")
    if find_cli(PROGRAMS[kind]) is None or shutil.which("node") is None:
        pytest.skip(f"{PROGRAMS[kind]} not installed: run scripts/install-agent-clis.sh")
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background
    from tests.agent_upstream import MODEL, AgentUpstream
    from tests.fake_upstream import FakeUpstream

    home, log, run = night_env
    op_key = "op-feedback-key-7781"
    with (
        AgentUpstream(check_then_needs_skill(MARKER)) as up,
        FakeUpstream(canned_analyst(failure=learns_the_marker).fn) as analyst,
    ):
        config = ProxyConfig(upstream=up.root_url, project=PROJECT, port=0, log_path=log,
                             home=home, feedback_key=op_key)  # fmt: skip
        with proxy_in_background(config) as (url, proxy):
            sessions = [
                run_agent(kind, f"Run check number {n}", tmp_path / "work", url)
                for n in (11, 23, 37, 41, 59, 62, 78)
            ]
            assert {s["result"] for s in sessions} == {"UNSOLVED"}, sessions
            assert proxy.state.proxy.writer.flush(30)
            for s in sessions:  # the operator marks each answer wrong: it should be SOLVED
                fb = loopback.post(f"{url}/feedback", headers={"x-api-key": op_key},
                                json={"session_id": s["session_id"], "thumb": "down",
                                      "reference": "SOLVED"})  # fmt: skip
                assert fb.status_code == 200, fb.text
            served = len(up.requests_seen)
            point_the_night_at(kind, up, tmp_path, monkeypatch)
            code, text = run("sleep", "run", "--model", f"{kind}:{MODEL}", "--optimizer-model",
                             f"{analyst.base_url}#fake-model", "--documents", "skill",
                             "--demos-max", "0")  # fmt: skip
            assert code == 0, text
            assert f"{PROJECT}: staged" in text, text
            night_requests = up.requests_seen[served:]
            live = tmp_path / "live" / LIVE_FILES[kind]
            live.parent.mkdir()
            code, adopted = run("sleep", "adopt", "--project", PROJECT, "--target-skill-path",
                                str(live))  # fmt: skip
            assert code == 0, adopted
            after = run_agent(kind, "Run check number 90", tmp_path / "after", url)
    report_md = Path(text.split("report: ")[1].split()[0])
    report = json.loads((report_md.parent / "report.json").read_text())
    assert report["replay"] == "agent" and report["mining"]["tasks"] == 7
    assert report["proposal"]["val_before"]["hard"] == 0.0
    assert report["proposal"]["val_after"]["hard"] == 1.0
    # the replays ran on the agent: its runs called its shell tool and wrote check.txt, and
    # the candidate skill reached the model through the agent's instruction file
    diag = json.loads((report_md.parent / "diagnostics.json").read_text())
    for row in diag["val_before"] + diag["val_after"]:
        assert row["agent"]["cli"] == kind and row["tool_calls"] >= 1
        assert any("check.txt" in f for f in row["agent"]["files_changed"])
    assert any(MARKER in r.context() for r in night_requests)
    assert any(MARKER not in r.context() for r in night_requests)
    assert all(r.tools for r in night_requests)  # the agent's own tools, offered by the CLI
    assert "## Agent runs on val" in report_md.read_text()
    # adopted: the live file holds the rule, the next session through the proxy is solved
    assert RULE in live.read_text() and read_adopted(PROJECT, home).skill.strip() == RULE
    assert after["result"] == "SOLVED"


def test_each_claude_code_run_has_its_own_temporary_folder(tmp_path):
    """Claude Code keeps its sandbox settings in $TMPDIR/claude-<uid>/ under a name every run
    shares; runs in parallel (a night's val runs) deleted it under each other."""
    from selftaught.models.agents.claude import ClaudeCodeAgent

    agent = ClaudeCodeAgent("m")
    one, two = tmp_path / "one", tmp_path / "two"
    for home in (one, two):
        home.mkdir()
    tmp_one, tmp_two = agent.home_env(one, {})["TMPDIR"], agent.home_env(two, {})["TMPDIR"]
    assert Path(tmp_one).is_dir() and Path(tmp_one).parent == one
    assert Path(tmp_two).is_dir() and Path(tmp_two).parent == two
