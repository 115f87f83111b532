"""Session-end hooks: `sleep hook install / uninstall / status` edit the agents' real settings
files (Claude Code's settings.json, Codex's config.toml) without touching anything else, and
the command they install, fed the JSON the agent sends, harvests that session into the log
(the transcript fixtures the harvesters' tests use). The hook never fails the agent."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.intake import hook_install
from selftaught.sleep.intake.harvest import HarvestConfig, harvest
from selftaught.sleep.intake.hooks import HOOK_MODULE, harvest_session, last_answered_turn
from selftaught.sleep.intake.log import LogFilter, TaskLog
from tests.agent_upstream import (
    AgentUpstream,
    agent_env,
    codex_config,
    find_cli,
    one_tool_then_answer,
)

SRC = Path(__file__).resolve().parents[1] / "src"
FIXTURES = Path(__file__).parent / "fixtures"
CLAUDE_SESSION = "7f3c2a91-5b4e-4c1d-9e8f-2a6b0c4d1e33"
CODEX_SESSION = "019cd2e1-7a40-7c12-b3a8-5e0f6a1b2c3d"
CODEX_TURN = "019cd2e1-9b10-7e01-a1b2-c3d4e5f60002"

CLAUDE_SETTINGS = """{
  "model": "opus",
  "env": {"DISABLE_TELEMETRY": "1"},
  "permissions": {"allow": ["Bash(make test)"]},
  "hooks": {
    "SessionEnd": [
      {"matcher": "clear", "hooks": [{"type": "command", "command": "notify-send bye"}]}
    ],
    "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}]
  }
}
"""
CODEX_CONFIG = """# my codex settings
model = "gpt-5-codex"  # the default
approval_policy = "never"

[model_providers.local]
base_url = "http://127.0.0.1:8080/v1"
wire_api = "responses"
args = [
  ["nested", "array"],
]

[features]
web_search = true
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private home, log, Claude Code config dir and Codex home; the CLI runner."""
    paths = {
        "home": tmp_path / "home",
        "log": tmp_path / "log.db",
        "claude": tmp_path / "claude",
        "codex": tmp_path / "codex",
    }
    monkeypatch.setenv("SELFTAUGHT_HOME", str(paths["home"]))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(paths["log"]))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(paths["claude"]))
    monkeypatch.setenv("CODEX_HOME", str(paths["codex"]))
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())

    paths["run"] = invoke  # type: ignore[assignment]
    return paths


def our_handlers(settings: dict) -> list[dict]:
    return [
        h
        for group in settings.get("hooks", {}).get("SessionEnd", [])
        for h in group["hooks"]
        if HOOK_MODULE in h["command"]
    ]


def run_hook_command(command: str | list[str], stdin: str = "", **env: str) -> float:
    """Run an installed hook command as the agent would (a shell line for Claude Code, an
    argv for Codex) with this tree on the path; returns its wall time, checks exit 0."""
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **env}
    started = time.monotonic()
    done = subprocess.run(
        command,
        shell=isinstance(command, str),
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # a hook's stdout can reach the agent: say nothing there
    return time.monotonic() - started


# ---- the harvest of one session ---------------------------------------------------------------


def test_harvested_turns_carry_their_session_and_are_found_by_it(tmp_path):
    log = TaskLog(tmp_path / "log.db")
    harvest("claude-code", log, HarvestConfig(since=0), root=FIXTURES / "claude_code" / "projects")
    harvest("codex", log, HarvestConfig(since=0), root=FIXTURES / "codex")
    claude = log.query(LogFilter(session_id=CLAUDE_SESSION))
    codex = log.query(LogFilter(session_id=CODEX_SESSION, newest_first=False))
    assert len(claude) == 3 and {r.source for r in claude} == {"claude-code"}
    assert [r.messages[-1]["content"][:14] for r in codex] == ["invoice totals", "write a one-li"]
    assert log.count(LogFilter(session_id="nope")) == 0
    # the newest turn with an answer: the Claude session's last request was interrupted
    turn = last_answered_turn(log, CLAUDE_SESSION, "webapp")
    assert last_answered_turn(log, CLAUDE_SESSION, "billing-service") is None  # one project
    assert turn is not None and turn.reply and turn.reply.startswith("The tests now use")


def test_a_live_session_leaves_its_running_turn_out(tmp_path):
    log = TaskLog(tmp_path / "log.db")
    root = FIXTURES / "claude_code" / "projects"
    live = harvest_session(
        "claude-code", log, session_id=CLAUDE_SESSION, root=root, leave_open_turn=True
    )
    assert (live.found, live.inserted, live.left_open) == (2, 2, True)
    ended = harvest_session("claude-code", log, session_id=CLAUDE_SESSION, root=root)
    assert (ended.found, ended.inserted, ended.left_open) == (3, 1, False)  # idempotent
    with pytest.raises(ValueError, match="invalid session id"):
        harvest_session("claude-code", log, session_id="../../etc/passwd", root=root)
    with pytest.raises(ValueError, match="no claude-code transcript for session 'abc'"):
        harvest_session("claude-code", log, session_id="abc", root=root)


def test_claude_codes_api_error_message_is_not_an_answer(tmp_path):
    """What Claude Code 2.1.328 writes when its upstream refuses the call (seen live)."""
    base = {"sessionId": "s-1", "cwd": "/w/app", "isSidechain": False}
    records = [
        {**base, "type": "user", "uuid": "u1", "message": {"role": "user", "content": "hi"}},
        {
            **base,
            "type": "assistant",
            "uuid": "a1",
            "message": {
                "model": "<synthetic>",
                "role": "assistant",
                "content": [{"type": "text", "text": "API Error: Connection refused"}],
            },
            "apiError": "connection_failed",
            "error": "server_error",
            "isApiErrorMessage": True,
        },
    ]
    path = tmp_path / "s-1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    log = TaskLog(tmp_path / "log.db")
    assert harvest_session("claude-code", log, transcript=path).inserted == 1
    (row,) = log.query()
    assert row.reply is None and row.meta["answered"] is False
    assert row.meta["api_error"] == "connection_failed" and row.session_id == "s-1"


# ---- Claude Code -------------------------------------------------------------------------------


def test_claude_code_install_twice_keeps_one_entry_and_the_rest_and_uninstall_restores(env):
    run = env["run"]
    settings = env["claude"] / "settings.json"
    settings.parent.mkdir()
    settings.write_text(CLAUDE_SETTINGS)
    code, text = run("sleep", "hook", "install", "--agent", "claude-code", "--project", "web")
    assert code == 0 and f"hook installed in {settings}" in text and "backed up" in text
    first = settings.read_text()
    code, text = run("sleep", "hook", "install", "--agent", "claude-code", "--project", "web")
    assert code == 0 and "already installed" in text
    assert settings.read_text() == first  # idempotent: not even rewritten

    data = json.loads(first)
    original = json.loads(CLAUDE_SETTINGS)
    (mine,) = our_handlers(data)
    assert mine["type"] == "command" and mine["timeout"] == 30
    argv = shlex.split(mine["command"])
    assert argv[:4] == [sys.executable, "-m", HOOK_MODULE, "claude-code"]
    assert argv[argv.index("--project") + 1] == "web"
    assert argv[argv.index("--log") + 1] == str(env["log"].resolve())
    assert {k: v for k, v in data.items() if k != "hooks"} == {
        k: v for k, v in original.items() if k != "hooks"
    }
    assert data["hooks"]["PreToolUse"] == original["hooks"]["PreToolUse"]
    assert original["hooks"]["SessionEnd"][0] in data["hooks"]["SessionEnd"]  # theirs kept
    backup = settings.with_name("settings.json.selftaught-backup")
    assert backup.read_text() == CLAUDE_SETTINGS

    code, text = run("sleep", "hook", "status")
    assert code == 0 and f"claude-code (user): installed in {settings}" in text
    assert "codex (user): not installed" in text

    code, text = run("sleep", "hook", "uninstall", "--agent", "claude-code")
    assert code == 0 and "the original file is back" in text
    assert settings.read_text() == CLAUDE_SETTINGS  # byte for byte
    code, text = run("sleep", "hook", "uninstall", "--agent", "claude-code")
    assert code == 0 and "no selftaught hook" in text


def test_claude_code_project_scope_creates_and_removes_its_file(env, tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    folder.mkdir()
    monkeypatch.chdir(folder)
    run = env["run"]
    code, _ = run("sleep", "hook", "install", "--agent", "claude-code", "--scope", "project")
    settings = folder / ".claude" / "settings.json"
    assert code == 0 and len(our_handlers(json.loads(settings.read_text()))) == 1
    assert oct(settings.stat().st_mode & 0o777) == "0o600"
    assert not (env["claude"] / "settings.json").exists()  # the user's file is untouched
    code, _ = run("sleep", "hook", "uninstall", "--agent", "claude-code", "--scope", "project")
    assert code == 0 and not settings.exists()  # we created it, so none is left


def test_claude_code_edits_other_settings_of_ours_too_and_writes_through_a_symlink(env, tmp_path):
    real = tmp_path / "dotfiles" / "claude.json"
    real.parent.mkdir()
    real.write_text('{"theme": "dark"}')
    env["claude"].mkdir()
    link = env["claude"] / "settings.json"
    link.symlink_to(real)
    hook_install.install("claude-code", project="a")
    hook_install.install("claude-code", project="b")  # a new project replaces ours
    assert link.is_symlink()
    data = json.loads(real.read_text())
    (mine,) = our_handlers(data)
    assert "--project b" in mine["command"] and data["theme"] == "dark"


def test_status_says_when_the_hooks_python_is_gone(env):
    hook_install.install("claude-code")
    settings = env["claude"] / "settings.json"
    data = json.loads(settings.read_text())
    (mine,) = our_handlers(data)
    mine["command"] = mine["command"].replace(sys.executable, "/gone/venv/bin/python", 1)
    settings.write_text(json.dumps(data))
    code, text = env["run"]("sleep", "hook", "status")
    assert code == 0 and "its Python is gone: install it again" in text
    hook_install.install("claude-code")  # re-installing replaces the broken entry
    assert len(our_handlers(json.loads(settings.read_text()))) == 1
    assert hook_install.state("claude-code").runnable is True


def test_bad_settings_are_refused_in_one_sentence_and_left_alone(env):
    run = env["run"]
    settings = env["claude"] / "settings.json"
    settings.parent.mkdir()
    settings.write_text("{not json")
    code, text = run("sleep", "hook", "install", "--agent", "claude-code")
    assert code == 2 and "is not valid JSON" in text and "Traceback" not in text
    settings.write_text('{"hooks": []}')
    code, text = run("sleep", "hook", "install", "--agent", "claude-code")
    assert code == 2 and "'hooks' is not an object" in text
    assert settings.read_text() == '{"hooks": []}'
    code, text = run("sleep", "hook", "install", "--agent", "cursor")
    assert code == 2 and "unknown agent 'cursor'" in text
    code, text = run("sleep", "hook", "install", "--agent", "codex", "--scope", "project")
    assert code == 2 and "codex takes --scope user only" in text


# ---- Codex -------------------------------------------------------------------------------------


def test_codex_install_twice_keeps_one_notify_and_uninstall_restores_the_bytes(env):
    run = env["run"]
    config = env["codex"] / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_CONFIG)
    for _ in range(2):
        code, text = run("sleep", "hook", "install", "--agent", "codex")
        assert code == 0, text
    text_now = config.read_text()
    assert text_now.count("notify") == 1 and text_now.endswith(CODEX_CONFIG)  # comments kept
    parsed = tomllib.loads(text_now)
    assert parsed["notify"][:4] == [sys.executable, "-m", HOOK_MODULE, "codex"]
    assert {k: v for k, v in parsed.items() if k != "notify"} == tomllib.loads(CODEX_CONFIG)
    code, text = run("sleep", "hook", "status")
    assert f"codex (user): installed in {config}" in text
    code, text = run("sleep", "hook", "uninstall", "--agent", "codex")
    assert code == 0 and "the original file is back" in text
    assert config.read_text() == CODEX_CONFIG


def test_codex_notify_of_another_program_is_never_taken(env):
    run = env["run"]
    config = env["codex"] / "config.toml"
    config.parent.mkdir()
    theirs = 'notify = ["notify-send", "codex"]\n' + CODEX_CONFIG
    config.write_text(theirs)
    code, text = run("sleep", "hook", "install", "--agent", "codex")
    assert code == 2 and "already runs another notify program" in text
    assert config.read_text() == theirs
    code, text = run("sleep", "hook", "status")
    assert "notify is another program's" in text
    code, text = run("sleep", "hook", "uninstall", "--agent", "codex")
    assert code == 0 and "no selftaught hook" in text and config.read_text() == theirs


def test_codex_notify_edited_to_a_string_shows_as_written(env):
    # Codex's notify is a list; one edited to a string is still ours, shown as it is (it was
    # shown one character per word: shlex.join of a string)
    config = env["codex"] / "config.toml"
    config.parent.mkdir()
    config.write_text(f'notify = "python -m {HOOK_MODULE} codex"\n')
    found = hook_install.state("codex")
    assert found.installed and found.command == f"python -m {HOOK_MODULE} codex"


def test_codex_install_creates_the_config_and_uninstall_removes_it(env):
    hook_install.install("codex")
    config = env["codex"] / "config.toml"
    assert config.read_text().startswith("notify = [")
    assert hook_install.uninstall("codex").restored and not config.exists()


# ---- the installed command, fed what the agent sends ---------------------------------------


def test_claude_code_session_end_hook_harvests_that_session(env):
    projects = env["claude"] / "projects"
    shutil.copytree(FIXTURES / "claude_code" / "projects", projects)
    hook_install.install("claude-code", project="web")
    (mine,) = our_handlers(json.loads((env["claude"] / "settings.json").read_text()))
    transcript = next(projects.glob(f"*/{CLAUDE_SESSION}.jsonl"))
    payload = {
        "session_id": CLAUDE_SESSION,
        "transcript_path": str(transcript),
        "cwd": "/home/dev/src/webapp",
        "hook_event_name": "SessionEnd",
        "reason": "prompt_input_exit",
    }
    # the agent's environment need not name our home or log: the command carries them
    seconds = run_hook_command(
        mine["command"], json.dumps(payload), SELFTAUGHT_HOME="", SELFTAUGHT_LOG=""
    )
    rows = TaskLog(env["log"]).query(LogFilter(session_id=CLAUDE_SESSION))
    assert len(rows) == 3 and {r.project for r in rows} == {"web"}
    assert all(r.private and r.source == "claude-code" for r in rows)
    run_hook_command(mine["command"], json.dumps(payload))  # again: nothing new
    assert TaskLog(env["log"]).count() == 3
    lines = (env["home"] / "hooks.log").read_text().splitlines()
    assert "3 new of 3 turns" in lines[0] and "0 new of 3 turns" in lines[1]
    print(f"claude-code hook: {seconds:.2f} s")  # measured: see the report


def test_a_project_scope_hook_harvests_only_sessions_of_its_folder(env, tmp_path, monkeypatch):
    """A project is a wall: the hook in a repository's .claude/settings.json, handed a
    session that ran in another repository, stores nothing of it."""
    projects = env["claude"] / "projects"
    shutil.copytree(FIXTURES / "claude_code" / "projects", projects)
    transcript = next(projects.glob(f"*/{CLAUDE_SESSION}.jsonl"))  # ran in /home/dev/src/webapp
    folder = tmp_path / "repo"
    folder.mkdir()
    monkeypatch.chdir(folder)
    hook_install.install("claude-code", scope="project", project="repo")
    (mine,) = our_handlers(json.loads((folder / ".claude" / "settings.json").read_text()))
    payload = {"session_id": CLAUDE_SESSION, "transcript_path": str(transcript)}
    run_hook_command(mine["command"], json.dumps(payload))
    assert TaskLog(env["log"]).count() == 0
    assert "ran outside" in (env["home"] / "hooks.log").read_text()
    transcript.write_text(transcript.read_text().replace("/home/dev/src/webapp", str(folder)))
    run_hook_command(mine["command"], json.dumps(payload))  # a session of this folder: stored
    rows = TaskLog(env["log"]).query()
    assert len(rows) == 3 and {r.project for r in rows} == {"repo"}


def test_a_postgres_log_stays_a_url_and_its_password_stays_out_of_the_settings(
    env, tmp_path, monkeypatch
):
    """The hook once wrote `Path(url).resolve()`: the password in clear in settings.json and
    config.toml, and rows in a SQLite file under a folder named `postgresql:`."""
    url = "postgresql://app:Ab/Secret9@127.0.0.1:1/db"
    monkeypatch.setenv("SELFTAUGHT_LOG", url)
    monkeypatch.chdir(tmp_path)
    hook_install.install("claude-code")
    hook_install.install("codex")
    settings = (env["claude"] / "settings.json").read_text()
    config = (env["codex"] / "config.toml").read_text()
    assert "Secret9" not in settings + config, settings + config
    (mine,) = our_handlers(json.loads(settings))
    argv = shlex.split(mine["command"])
    secret = Path(argv[argv.index("--log-from") + 1])
    assert secret.read_text().strip() == url and secret.parent == env["home"]
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    notify = tomllib.loads(config)["notify"]
    assert notify[notify.index("--log-from") + 1] == str(secret)
    shutil.copytree(FIXTURES / "claude_code" / "projects", env["claude"] / "projects")
    transcript = next((env["claude"] / "projects").glob(f"*/{CLAUDE_SESSION}.jsonl"))
    payload = {"session_id": CLAUDE_SESSION, "transcript_path": str(transcript)}
    run_hook_command(mine["command"], json.dumps(payload), SELFTAUGHT_LOG="")
    note = (env["home"] / "hooks.log").read_text()
    assert "error" in note and "postgresql://app@127.0.0.1:1/db" in note  # tried the URL
    assert "Secret9" not in note and not list(tmp_path.rglob("postgresql:*"))
    # a URL without a password stays in the command as it is
    monkeypatch.setenv("SELFTAUGHT_LOG", "postgresql://app@db.internal:5432/sleep")
    argv = hook_install.hook_argv("claude-code")
    assert argv[argv.index("--log") + 1] == "postgresql://app@db.internal:5432/sleep"


def test_the_hook_writes_to_postgres_through_its_url_file(env, pg_url, monkeypatch):
    url = pg_url.replace("://selftaught@", "://selftaught:S3cret-pw@", 1)  # trust: any password
    monkeypatch.setenv("SELFTAUGHT_LOG", url)
    hook_install.install("claude-code", project="web")
    settings = (env["claude"] / "settings.json").read_text()
    assert "S3cret-pw" not in settings
    (mine,) = our_handlers(json.loads(settings))
    shutil.copytree(FIXTURES / "claude_code" / "projects", env["claude"] / "projects")
    transcript = next((env["claude"] / "projects").glob(f"*/{CLAUDE_SESSION}.jsonl"))
    payload = {"session_id": CLAUDE_SESSION, "transcript_path": str(transcript)}
    run_hook_command(mine["command"], json.dumps(payload), SELFTAUGHT_LOG="")
    rows = TaskLog(pg_url).query(LogFilter(session_id=CLAUDE_SESSION))
    assert len(rows) == 3 and {r.project for r in rows} == {"web"}, (
        env["home"] / "hooks.log"
    ).read_text()


def test_codex_notify_hook_harvests_the_finished_turns(env):
    sessions = env["codex"] / "sessions"
    shutil.copytree(FIXTURES / "codex" / "sessions", sessions)
    hook_install.install("codex")
    argv = tomllib.loads((env["codex"] / "config.toml").read_text())["notify"]
    payload = {
        "type": "agent-turn-complete",
        "thread-id": CODEX_SESSION,
        "turn-id": CODEX_TURN,
        "cwd": "/home/dev/src/billing-service",
        "input-messages": ["write a one-line commit message"],
        "last-assistant-message": "billing: round invoice totals once",
    }
    run_hook_command([*argv, json.dumps(payload)])
    rows = TaskLog(env["log"]).query(LogFilter(session_id=CODEX_SESSION, newest_first=False))
    assert [r.meta["answered"] for r in rows] == [True, True]
    assert rows[-1].dedupe_key.endswith(CODEX_TURN) and rows[0].project == "billing-service"
    assert TaskLog(env["log"]).count() == 2  # the other rollout (another session) is not read


def test_the_hook_never_fails_the_agent_and_says_why_in_its_log(env):
    base = [sys.executable, "-m", HOOK_MODULE]
    run_hook_command([*base, "claude-code"], "not json")
    run_hook_command([*base, "claude-code"], json.dumps({"session_id": "gone-session"}))
    run_hook_command([*base, "codex", json.dumps({"thread-id": "../x", "turn-id": "t"})])
    run_hook_command([*base, "cursor"], "{}")  # a command line it does not know
    lines = (env["home"] / "hooks.log").read_text().splitlines()
    assert "input is not JSON" in lines[0]
    assert "no claude-code transcript for session 'gone-session'" in lines[1]
    assert "invalid session id '../x'" in lines[2]
    assert "bad hook command line" in lines[3]
    assert all(" error" in line for line in lines)
    assert oct((env["home"] / "hooks.log").stat().st_mode & 0o777) == "0o600"
    code, text = env["run"]("sleep", "hook", "status")
    assert code == 0 and "last run:" in text and "bad hook command line" in text


# ---- the real agents (skipped when `scripts/install-agent-clis.sh` has not installed them) ----


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_agent(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(find_cli("claude") is None, reason="Claude Code is not installed")
def test_real_claude_code_runs_the_installed_hook_when_its_session_ends(env, tmp_path):
    """Claude Code 2.1.328 against the scripted upstream: one Bash call, then the answer; the
    SessionEnd hook we installed harvests the session, tool call and answer included."""
    hook_install.install("claude-code", project="cc")
    with AgentUpstream(one_tool_then_answer("echo hook-test-ok")) as up:
        agent = agent_env(
            tmp_path / "agent-home",
            PYTHONPATH=str(SRC),
            CLAUDE_CONFIG_DIR=str(env["claude"]),
            ANTHROPIC_BASE_URL=up.root_url,
            ANTHROPIC_API_KEY="test-key",
        )
        claude = [str(find_cli("claude")), "-p", "check the tool", "--output-format", "json"]
        done = run_agent(
            [*claude, "--model", up.model, "--allowedTools", "Bash"], tmp_path / "ws", agent
        )
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    (row,) = TaskLog(env["log"]).query()
    assert (row.source, row.project, row.session_id) == ("claude-code", "cc", session)
    assert row.messages[-1]["content"] == "check the tool"
    assert row.reply == "tool said: hook-test-ok"
    assert [c["function"]["name"] for c in row.tool_calls] == ["Bash"]
    assert "ok claude-code session" in (env["home"] / "hooks.log").read_text()


@pytest.mark.skipif(find_cli("claude") is None, reason="Claude Code is not installed")
def test_real_claude_code_failed_call_is_harvested_without_an_answer(env, tmp_path):
    """The upstream refuses the connection (no retries): the session still ends, the hook
    runs, and Claude Code's "API Error: ..." line is not stored as the agent's answer."""
    hook_install.install("claude-code", project="cc")
    agent = agent_env(
        tmp_path / "agent-home",
        PYTHONPATH=str(SRC),
        CLAUDE_CONFIG_DIR=str(env["claude"]),
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{closed_port()}",
        ANTHROPIC_API_KEY="test-key",
        CLAUDE_CODE_MAX_RETRIES="0",
    )
    run_agent([str(find_cli("claude")), "-p", "say hi"], tmp_path / "ws", agent)
    (transcript,) = (env["claude"] / "projects").glob("*/*.jsonl")
    (row,) = TaskLog(env["log"]).query()
    assert (row.project, row.session_id, row.reply) == ("cc", transcript.stem, None)
    assert row.meta["api_error"] == "connection_failed"


@pytest.mark.skipif(find_cli("codex") is None, reason="Codex is not installed")
def test_real_codex_runs_the_installed_notify_after_its_turn(env, tmp_path):
    """Codex 0.169.0 against the scripted upstream: one exec_command call, then the answer;
    the notify program we installed (fire-and-forget) harvests the finished turn."""
    with AgentUpstream(one_tool_then_answer("echo notify-test-ok")) as up:
        codex_config(env["codex"], up.base_url)
        hook_install.install("codex", project="cx")
        agent = agent_env(
            tmp_path / "agent-home",
            PYTHONPATH=str(SRC),
            CODEX_HOME=str(env["codex"]),
            X_KEY="test-key",
        )
        codex = [str(find_cli("codex")), "exec", "--skip-git-repo-check", "--json"]
        done = run_agent([*codex, "check the tool"], tmp_path / "ws", agent)
    assert done.returncode == 0, done.stderr
    log = TaskLog(env["log"])
    deadline = time.monotonic() + 30  # Codex does not wait for its notify program
    while log.count() == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    (row,) = log.query()
    assert (row.source, row.project) == ("codex", "cx")
    assert row.messages[-1]["content"] == "check the tool"
    assert row.reply.startswith("tool said:") and row.reply.endswith("notify-test-ok")
    assert "exec_command" in row.meta["tools"]
