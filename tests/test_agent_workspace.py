"""A coding agent's session as a workspace task: the hooks record the repository the session
worked in (its commit and uncommitted changes at the start and at the end, ignored and
`.env`-like files left out), and a night turns a solved session into a task whose check (the
test command the agent ran) is proven two-sided in the sandbox: it fails on the session's
start and passes on its end. Last, the whole path with the real Claude Code and Codex CLIs
against a scripted upstream (skipped when `scripts/install-agent-clis.sh` has not installed
them, or bubblewrap is missing)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from selftaught.sleep.intake import hook_install
from selftaught.sleep.intake.hooks import HOOK_MODULE
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.intake.repo_state import (
    RepoStateError,
    capture,
    load_record,
    materialise,
    record_end,
    record_start,
)
from selftaught.sleep.night import agent_outcome as ao
from selftaught.sleep.night.agent_replay import AgentNightTask
from selftaught.sleep.night.checks import describe_checks
from selftaught.sleep.night.cycle import mine
from selftaught.sleep.night.mine import MineConfig
from selftaught.tasks.check import Check, run_check
from selftaught.tasks.sandbox import find_bwrap, open_sandbox
from tests.agent_upstream import (
    AgentUpstream,
    Call,
    agent_env,
    codex_config,
    find_cli,
    shell_arguments,
)

SRC = Path(__file__).resolve().parents[1] / "src"
NO_BWRAP = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b  # fixed\n"
TEST_CALC = (
    "import unittest\nfrom calc import add\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
TEST_CMD = "python3 -m unittest -q test_calc"
FIX_CMD = f"printf {shlex.quote(FIXED)} > calc.py"  # another size: no stale bytecode
SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS key id: redacted wherever it is stored


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def repo(root: Path) -> Path:
    """A repository whose test fails, with files a record must leave out: an ignored build
    output, a `.env`, a private key; and a tracked `.env.example`."""
    root.mkdir(parents=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "test_calc.py").write_text(TEST_CALC)
    (root / ".gitignore").write_text("build/\n__pycache__/\n")
    (root / ".env.example").write_text("API_KEY=\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    (root / "build").mkdir()
    (root / "build" / "out.log").write_text("IGNORED-CONTENT\n")
    (root / ".env").write_text("API_KEY=ENV-FILE-CONTENT\n")
    (root / "keys").mkdir()
    (root / "keys" / "id_rsa").write_text("PRIVATE-KEY-CONTENT\n")
    return root


def objects(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root / ".git" / "objects"))


# ---- the record --------------------------------------------------------------------------------


def test_a_record_holds_the_commit_and_changes_but_no_ignored_or_secret_file(tmp_path):
    root = repo(tmp_path / "repo")
    (root / "calc.py").write_text(FIXED)  # tracked, changed
    (root / "notes.md").write_text(f"todo: rotate {SECRET}\n")  # untracked
    (root / "sub").mkdir()
    (root / "sub" / "server.pem").write_text("PEM-CONTENT\n")
    index = (root / ".git" / "index").read_bytes()
    before = objects(root)

    state = capture(root / "sub")
    assert state.commit == git(root, "rev-parse", "HEAD").strip()
    assert (state.root, state.cwd) == (str(root.resolve()), "sub")
    assert "+    return a + b  # fixed" in state.diff and "notes.md" in state.diff
    for secret in ("IGNORED-CONTENT", "ENV-FILE-CONTENT", "PRIVATE-KEY-CONTENT", "PEM-CONTENT"):
        assert secret not in state.diff
    assert state.left_out == [".env", "keys/id_rsa", "sub/server.pem"]
    assert SECRET not in state.diff and state.redactions == 1  # redacted like any stored text
    # reading the repository wrote nothing to it
    assert objects(root) == before and (root / ".git" / "index").read_bytes() == index

    rebuilt = tmp_path / "rebuilt"
    materialise(state, rebuilt, 10 * 2**20)
    files = sorted(str(p.relative_to(rebuilt)) for p in rebuilt.rglob("*") if p.is_file())
    assert files == [".gitignore", "calc.py", "notes.md", "test_calc.py"]  # no .env.example
    assert (rebuilt / "calc.py").read_text() == FIXED
    assert "[REDACTED" in (rebuilt / "notes.md").read_text()


def test_the_start_is_recorded_once_and_the_end_each_time(tmp_path):
    root, home = repo(tmp_path / "repo"), tmp_path / "home"
    assert record_start("s-1", root, home) is not None
    (root / "calc.py").write_text(FIXED)
    assert record_start("s-1", root, home) is None  # a resumed session keeps its start
    record_end("s-1", root, home)
    record = load_record("s-1", home)
    assert record is not None and record.start.diff == "" and "a + b" in record.end.diff
    assert oct((home / "sessions" / "s-1" / "start.json").stat().st_mode & 0o777) == "0o600"
    assert load_record("../x", home) is None and load_record("nope", home) is None
    with pytest.raises(RepoStateError, match="not a git repository"):
        capture(tmp_path)
    gone = record.end
    gone.commit = "0" * 40
    with pytest.raises(RepoStateError):
        materialise(gone, tmp_path / "nowhere", 2**20)


# ---- the hooks ---------------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    return {"home": home, "log": tmp_path / "log.db", "claude": tmp_path / "claude"}


def run_hook(command: str | list[str], stdin: str = "") -> None:
    done = subprocess.run(
        command,
        shell=isinstance(command, str),
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "", done.stderr


def test_claude_code_gets_a_session_start_hook_that_records_the_repository(env, tmp_path):
    root = repo(tmp_path / "repo")
    hook_install.install("claude-code", project="calc")
    settings = json.loads((env["claude"] / "settings.json").read_text())
    (start,) = settings["hooks"]["SessionStart"][0]["hooks"]
    (end,) = settings["hooks"]["SessionEnd"][0]["hooks"]
    assert start == end and HOOK_MODULE in start["command"]
    assert hook_install.state("claude-code").records_start is True

    payload = {"session_id": "cc-1", "cwd": str(root), "transcript_path": str(tmp_path / "t")}
    run_hook(start["command"], json.dumps({**payload, "hook_event_name": "SessionStart"}))
    (root / "calc.py").write_text(FIXED)
    run_hook(end["command"], json.dumps({**payload, "hook_event_name": "SessionEnd"}))
    record = load_record("cc-1", env["home"])
    assert record.start.diff == "" and "a + b" in record.end.diff
    lines = (env["home"] / "hooks.log").read_text().splitlines()
    assert "workspace start recorded" in lines[0]
    assert "workspace end recorded" in lines[1]  # then the harvest failed: no transcript here
    assert "the claude-code transcript" in lines[2]

    elsewhere = {**payload, "session_id": "cc-2", "cwd": str(tmp_path)}  # not a repository
    run_hook(start["command"], json.dumps({**elsewhere, "hook_event_name": "SessionStart"}))
    assert "workspace not recorded" in (env["home"] / "hooks.log").read_text().splitlines()[3]
    assert load_record("cc-2", env["home"]) is None

    hook_install.uninstall("claude-code")
    assert not (env["claude"] / "settings.json").exists()  # both entries gone with the file


def test_an_older_install_without_the_start_hook_says_so_and_install_adds_it(env):
    hook_install.install("claude-code")
    path = env["claude"] / "settings.json"
    settings = json.loads(path.read_text())
    del settings["hooks"]["SessionStart"]
    path.write_text(json.dumps(settings))
    found = hook_install.state("claude-code")
    assert found.installed and found.records_start is False
    assert "no SessionStart hook" in found.describe()
    assert hook_install.install("claude-code").changed
    assert hook_install.state("claude-code").records_start is True


def test_codex_records_its_start_at_the_first_notify(env, tmp_path):
    root = repo(tmp_path / "repo")
    hook_install.install("codex")
    argv = hook_install._codex_state(tmp_path / "codex" / "config.toml")[1]["notify"]
    payload = {
        "type": "agent-turn-complete",
        "thread-id": "cx-1",
        "turn-id": "t1",
        "cwd": str(root),
    }
    (root / "calc.py").write_text(FIXED)  # the first turn's change: already in the start
    run_hook([*argv, json.dumps(payload)])
    (root / "notes.md").write_text("second turn\n")
    run_hook([*argv, json.dumps({**payload, "turn-id": "t2"})])
    record = load_record("cx-1", env["home"])
    assert "a + b" in record.start.diff and "notes.md" not in record.start.diff
    assert "notes.md" in record.end.diff
    log = (env["home"] / "hooks.log").read_text().splitlines()
    assert "workspace start recorded (first notify)" in log[0] and "first notify" not in log[1]


# ---- the night ---------------------------------------------------------------------------------


def _call(call_id: str, command: str) -> dict:
    args = json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": args}}


def solved_row(
    session: str, check: str = TEST_CMD, prompt: str = "make the calc test pass"
) -> Interaction:
    """A harvested Claude Code turn: the test fails, the agent fixes it, the test passes."""
    red = "Exit code 1\nFAIL: test_add\nRan 1 test in 0.000s\n\nFAILED (failures=1)"
    runs = [(check, red, True), (FIX_CMD, "(Bash completed with no output)", False),
            (check, "Ran 1 test in 0.000s\n\nOK", False)]  # fmt: skip
    return Interaction(
        messages=[{"role": "user", "content": prompt}],
        reply="Fixed: add() subtracted.",
        project="calc",
        source="claude-code",
        session_id=session,
        tool_calls=[_call(f"c{i}", c) for i, (c, _, _) in enumerate(runs)],
        meta={
            "tool_results": [
                {"tool_call_id": f"c{i}", "content": o, "is_error": e}
                for i, (_, o, e) in enumerate(runs)
            ]
        },  # fmt: skip
    )


def session(tmp_path: Path, home: Path, sid: str, *, fix_first: bool = False) -> Path:
    """A repository whose session the hooks recorded: the start, the fix, the end."""
    root = repo(tmp_path / sid)
    if fix_first:
        (root / "calc.py").write_text(FIXED)
    record_start(sid, root, home)
    (root / "calc.py").write_text(FIXED)
    record_end(sid, root, home)
    return root


@NO_BWRAP
def test_a_solved_session_becomes_a_workspace_task_with_a_two_sided_check(tmp_path):
    home = tmp_path / "home"
    session(tmp_path, home, "s-ok")
    miner = ao.WorkspaceMiner("calc", home)
    tasks, report = mine([solved_row("s-ok")], MineConfig(), workspaces=miner)
    (task,) = tasks
    assert task.check == "workspace" and report.by_check == {"workspace": 1}
    assert report.agent.workspace_tasks == 1 and report.conversation.signals == {"solved": 1}
    ws = task.state.workspace
    assert ws is not None and list(ws.check) == TEST_CMD.split() and ws.session == "s-ok"
    folder = Path(ws.path)
    assert folder.is_relative_to(home / "projects" / "calc" / "workspaces")
    assert (folder / "calc.py").read_text() == BUGGY  # the start: what the agent is given
    assert not (folder / ".env").exists() and not (folder / "build").exists()
    assert describe_checks(task.state) == "workspace check `python3 -m unittest -q test_calc`"
    proof = json.loads((folder.parent / "proof.json").read_text())
    assert (proof["start"]["score"], proof["end"]["score"]) == (0.0, 1.0)

    night = AgentNightTask("calc", {"train": [task], "val": [], "test": []})
    (example,) = night.examples("train")
    assert night.workspace_for(example).source == folder
    assert night.score("I fixed it", example).hard == 0.0  # words change no files
    fixed = tmp_path / "agent-left"
    fixed.mkdir()
    for name in ("calc.py", "test_calc.py"):
        (fixed / name).write_text((folder / name).read_text())
    (fixed / "calc.py").write_text(FIXED)
    assert night.score_workspace("done", example, fixed).hard == 1.0
    assert (folder / "calc.py").read_text() == BUGGY  # scoring never touches the start
    # a proof is kept: the next night does not run it again (nor count it in its budget)
    again = ao.WorkspaceMiner("calc", home, max_proofs=0)
    assert [t.check for t in mine([solved_row("s-ok")], MineConfig(), workspaces=again)[0]] == [
        "workspace"
    ]
    session(tmp_path, home, "s-new")
    _, report = mine([solved_row("s-new")], MineConfig(), workspaces=again)
    assert report.agent.not_workspace == {ao.OVER_BUDGET: 1}
    # a chat-model night leaves it out (it edits no files): nothing else checks it
    assert ao.for_target([task], agent=False) == ([], [task])
    assert ao.for_target([task], agent=True) == ([task], [])


@NO_BWRAP
def test_a_check_that_is_not_two_sided_leaves_a_plain_task_and_says_why(tmp_path):
    home = tmp_path / "home"
    session(tmp_path, home, "s-early", fix_first=True)  # the start passes already
    root = repo(tmp_path / "s-red-end")
    record_start("s-red-end", root, home)
    record_end("s-red-end", root, home)  # ended as it began: the end fails
    session(tmp_path, home, "s-shell")
    rows = [
        solved_row("s-early", prompt="the add test is red, fix it"),
        solved_row("s-red-end", prompt="why does test_calc fail?"),
        solved_row("s-shell", check=f"{TEST_CMD} $EXTRA", prompt="get CI green again"),
        solved_row("s-none", prompt="please repair calc.add"),  # no hook ran for it
    ]
    tasks, report = mine(rows, MineConfig(judge=True), workspaces=ao.WorkspaceMiner("calc", home))
    assert [t.check for t in tasks] == ["rubric"] * 4  # plain tasks, thumbs up
    assert report.agent.workspace_tasks == 0
    assert report.agent.not_workspace == {
        ao.START_PASSES: 1,
        ao.FIXED_FAILS: 1,
        ao.NEEDS_SHELL: 1,
        ao.NO_RECORD: 1,
    }


# ---- end to end: the real agents ----------------------------------------------------------------

STEPS = [TEST_CMD, FIX_CMD, TEST_CMD]


def fail_fix_pass(request) -> str | Call:
    """The scripted model: run the failing test, fix calc.py, run the test again, answer."""
    done = len(request.tool_results)
    if done < len(STEPS):
        tool = request.shell_tool()
        return Call(tool, shell_arguments(tool, STEPS[done]))
    return "Fixed add(): " + request.tool_results[-1].output.strip().splitlines()[-1]


def prove(record, check: Check, tmp_path: Path) -> tuple[float, float]:
    """The check's hard score on the session's start and end, rebuilt, in the sandbox."""
    sandbox = open_sandbox()
    scores = []
    for name, state in (("start", record.start), ("end", record.end)):
        materialise(state, tmp_path / f"proof-{name}", 2**24)
        scores.append(run_check(sandbox, check, tmp_path / f"proof-{name}").hard)
    return scores[0], scores[1]


@NO_BWRAP
@pytest.mark.skipif(find_cli("claude") is None, reason="Claude Code is not installed")
def test_real_claude_code_session_becomes_a_two_sided_workspace_task(env, tmp_path):
    """Claude Code 2.1.328 with our hooks, against the scripted upstream, in a repository
    whose test fails: it runs the test (red), fixes calc.py, runs it again (green). The hooks
    record the start and the end and harvest the session; a night's mining turns it into a
    workspace task whose check fails on the original and passes on the fixed repository."""
    started = time.monotonic()
    root = repo(tmp_path / "calc")
    hook_install.install("claude-code", project="calc")
    with AgentUpstream(fail_fix_pass) as up:
        agent = agent_env(
            tmp_path / "agent-home",
            PYTHONPATH=str(SRC),
            CLAUDE_CONFIG_DIR=str(env["claude"]),
            ANTHROPIC_BASE_URL=up.root_url,
            ANTHROPIC_API_KEY="test-key",
        )
        argv = [str(find_cli("claude")), "-p", "make the calc test pass", "--output-format",
                "json", "--model", up.model, "--allowedTools", "Bash"]  # fmt: skip
        done = subprocess.run(
            argv, cwd=root, env=agent, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session_id"]
    assert (root / "calc.py").read_text() == FIXED

    (row,) = TaskLog(env["log"]).query(LogFilter(session_id=sid))
    record = load_record(sid, env["home"])
    assert record is not None and record.start.diff == "" and "a + b" in record.end.diff
    tasks, report = mine([row], MineConfig(), workspaces=ao.WorkspaceMiner("calc", env["home"]))
    (task,) = tasks
    assert task.check == "workspace" and task.messages[-1]["content"] == "make the calc test pass"
    assert report.conversation.signals == {"solved": 1}
    check = Check(task.state.workspace.check)
    assert check.argv == tuple(TEST_CMD.split())
    assert prove(record, check, tmp_path) == (0.0, 1.0)  # fails on the original, passes fixed
    assert time.monotonic() - started < 60


@NO_BWRAP
@pytest.mark.skipif(find_cli("codex") is None, reason="Codex is not installed")
def test_real_codex_session_is_solved_but_its_start_is_recorded_after_the_first_turn(env, tmp_path):
    """Codex 0.169.0: the same session in one turn. Its notify records the start after that
    turn, fix included, so the check is not two-sided: the session is a solved plain task,
    and the report says why (what the docs say Codex misses)."""
    root = repo(tmp_path / "calc")
    with AgentUpstream(fail_fix_pass) as up:
        codex_config(tmp_path / "codex", up.base_url)
        hook_install.install("codex", project="calc")
        agent = agent_env(tmp_path / "agent-home", PYTHONPATH=str(SRC),
                          CODEX_HOME=str(tmp_path / "codex"), X_KEY="test-key")  # fmt: skip
        argv = [str(find_cli("codex")), "exec", "--json", "make the calc test pass"]
        done = subprocess.run(argv, cwd=root, env=agent, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = TaskLog(env["log"])
    deadline = time.monotonic() + 30  # Codex does not wait for its notify program
    while log.count() == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    (row,) = log.query()
    record = load_record(row.session_id, env["home"])
    assert record is not None and "a + b" in record.start.diff  # after the first turn
    tasks, report = mine([row], MineConfig(judge=True),
                         workspaces=ao.WorkspaceMiner("calc", env["home"]))  # fmt: skip
    assert [t.check for t in tasks] == ["rubric"]
    assert report.conversation.signals == {"solved": 1}
    assert report.agent.not_workspace == {ao.START_PASSES: 1}


@NO_BWRAP
@pytest.mark.skipif(find_cli("claude") is None, reason="Claude Code is not installed")
def test_real_claude_code_through_the_proxy_gives_the_same_workspace_task(env, tmp_path):
    """The same session with Claude Code talking through the logging proxy: its steps are
    proxy rows, collapsed into one episode whose tool turns hold the runs; the hooks (their
    harvest into another log) recorded the repository under the same session id."""
    pytest.importorskip("fastapi")
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background
    from selftaught.sleep.intake.sessions import collapse_sessions

    root = repo(tmp_path / "calc")
    hook_install.install("claude-code", project="calc", log=tmp_path / "harvested.db")
    with AgentUpstream(fail_fix_pass) as up:
        config = ProxyConfig(upstream=up.root_url, project="calc", port=0,
                             log_path=env["log"], home=env["home"])  # fmt: skip
        with proxy_in_background(config) as (url, app):
            agent = agent_env(
                tmp_path / "agent-home",
                PYTHONPATH=str(SRC),
                CLAUDE_CONFIG_DIR=str(env["claude"]),
                ANTHROPIC_BASE_URL=url.removesuffix("/v1"),
                ANTHROPIC_API_KEY="test-key",
            )
            argv = [str(find_cli("claude")), "-p", "make the calc test pass", "--output-format",
                    "json", "--model", up.model, "--allowedTools", "Bash"]  # fmt: skip
            done = subprocess.run(
                argv, cwd=root, env=agent, capture_output=True, text=True, timeout=120
            )
            assert app.state.proxy.writer.flush(30)
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session_id"]
    rows = collapse_sessions(TaskLog(env["log"]).query(LogFilter(session_id=sid)))
    (episode,) = rows
    assert episode.source == "proxy" and episode.meta["wire"] == "messages"
    tasks, report = mine(rows, MineConfig(), workspaces=ao.WorkspaceMiner("calc", env["home"]))
    (task,) = tasks
    assert task.check == "workspace" and report.conversation.signals == {"solved": 1}
    assert task.messages == [{"role": "user", "content": "make the calc test pass"}]
    record = load_record(sid, env["home"])
    check = Check(task.state.workspace.check)
    assert prove(record, check, tmp_path) == (0.0, 1.0)


def test_a_project_scoped_hook_records_no_repository_outside_its_folder(env, tmp_path):
    mine, other = repo(tmp_path / "mine"), repo(tmp_path / "other")
    hook_install.install("claude-code", scope="project", project="calc", folder=mine)
    settings = json.loads((mine / ".claude" / "settings.json").read_text())
    (start,) = settings["hooks"]["SessionStart"][0]["hooks"]
    outside = {"session_id": "cc-9", "cwd": str(other), "hook_event_name": "SessionStart"}
    run_hook(start["command"], json.dumps(outside))
    assert load_record("cc-9", env["home"]) is None
    assert "works outside" in (env["home"] / "hooks.log").read_text()
    inside = {**outside, "session_id": "cc-10", "cwd": str(mine)}
    run_hook(start["command"], json.dumps(inside))
    assert load_record("cc-10", env["home"]) is not None
