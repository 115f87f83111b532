"""The coding agent's own outcome: its test runs and builds read from its tool results
(`sleep.night.outcomes`), turned into signals on its episode (`agent_outcome.read_outcomes`)
and counted in the night's mining report. The outputs are the runners' real summary lines;
the Claude Code and Codex result shapes are the ones the real CLIs wrote (Claude Code
2.1.328's `Exit code N` first line, Codex 0.169.0's `Process exited with code N` header)."""

from __future__ import annotations

import json

import pytest

from selftaught.sleep.intake.log import Feedback, Interaction
from selftaught.sleep.night.agent_outcome import check_argv, read_outcomes
from selftaught.sleep.night.cycle import mine
from selftaught.sleep.night.mine import MineConfig
from selftaught.sleep.night.outcomes import (
    find_runner,
    read_command,
    read_session,
    tool_steps,
)

UNITTEST_RED = (
    "Exit code 1\n======================================================================\n"
    "FAIL: test_add (test_calc.T.test_add)\n"
    "----------------------------------------------------------------------\n"
    "AssertionError: -1 != 5\n\n"
    "----------------------------------------------------------------------\n"
    "Ran 1 test in 0.000s\n\nFAILED (failures=1)"
)
UNITTEST_GREEN = "----------------------------------------------------------------------\nRan 1 test in 0.000s\n\nOK"  # noqa: E501
CODEX_RED = (
    "Chunk ID: 57bfd8\nWall time: 0.0000 seconds\nProcess exited with code 1\n"
    "Original token count: 112\nOutput:\nFAIL: test_add\nRan 1 test in 0.000s\n\n"
    "FAILED (failures=1)\n"
)
CODEX_GREEN = (
    "Chunk ID: 51106a\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
    "Original token count: 9\nOutput:\nRan 1 test in 0.000s\n\nOK\n"
)

# (command, output, exit code recorded beside it, is_error, tool) -> (kind, status, summary)
READS = [
    # exit status first: Claude Code's first line, its is_error flag, Codex's header
    ("pytest -q", "Exit code 1\n..F\n1 failed, 2 passed in 0.12s", None, True, "Bash",
     ("test", "failed", "1 failed, 2 passed in 0.12s")),
    ("pytest -q", "...\n3 passed in 0.05s", None, False, "Bash",
     ("test", "passed", "3 passed in 0.05s")),
    ("python3 -m unittest -q test_calc", CODEX_RED, None, None, "exec_command",
     ("test", "failed", "Ran 1 test: FAILED (failures=1)")),
    ("python3 -m unittest -q test_calc", CODEX_GREEN, None, None, "exec_command",
     ("test", "passed", "Ran 1 test: OK")),
    ("go test ./...", "FAIL\texample.com/m\t0.002s", 1, None, "shell",  # Codex legacy
     ("test", "failed", "FAIL example.com/m 0.002s")),
    # an exit status that is not the runner's: the summary line decides
    ("python -m pytest tests 2>&1 | tail -3", "Exit code 0\n=== 1 failed, 4 passed in 0.3s ===",
     None, False, "Bash", ("test", "failed", "1 failed, 4 passed in 0.3s")),
    ("pytest || true", "Exit code 0\n2 passed in 0.1s", None, False, "Bash",
     ("test", "passed", "2 passed in 0.1s")),
    # the runners' summary lines (no exit status recorded: a proxy row)
    ("npm test", "Tests:       1 failed, 2 passed, 3 total\nnpm ERR! Test failed.", None, None,
     "Bash", ("test", "failed", "Tests: 1 failed, 2 passed, 3 total")),
    ("npx jest src", "Tests:       3 passed, 3 total", None, None, "Bash",
     ("test", "passed", "Tests: 3 passed, 3 total")),
    ("yarn vitest run", " Tests  1 failed | 2 passed (3)", None, None, "Bash",
     ("test", "failed", "Tests 1 failed | 2 passed (3)")),
    ("go test ./...", "--- FAIL: TestAdd (0.00s)\nFAIL\nFAIL\texample.com/m\t0.002s", None, None,
     "Bash", ("test", "failed", "FAIL example.com/m 0.002s")),
    ("go test ./...", "ok  \texample.com/m\t0.002s", None, None, "Bash",
     ("test", "passed", "ok example.com/m 0.002s")),
    ("cargo test", "test result: FAILED. 2 passed; 1 failed; 0 ignored", None, None, "Bash",
     ("test", "failed", "test result: FAILED. 2 passed; 1 failed; 0 ignored")),
    ("make test", "make: *** [Makefile:3: test] Error 2", None, None, "Bash",
     ("test", "failed", "make: *** [Makefile:3: test] Error 2")),
    ("bundle exec rspec", "3 examples, 1 failure", None, None, "Bash",
     ("test", "failed", "3 examples, 1 failure")),
    ("cd web && PYTHONPATH=. .venv/bin/python -m pytest", "4 passed in 1.02s", None, None,
     "Bash", ("test", "passed", "4 passed in 1.02s")),
    # could not test: a compiler error, nothing collected, no such command
    ("cargo test", "Exit code 101\nerror[E0308]: mismatched types\nerror: could not compile `m`",
     None, True, "Bash", ("test", "error", "error[E0308]: mismatched types")),
    ("go test ./...", "# example.com/m\n./a.go:3:5: undefined: x\nFAIL\texample.com/m [build failed]",  # noqa: E501
     None, None, "Bash", ("test", "error", "./a.go:3:5: undefined: x")),
    ("pytest", "Exit code 5\nno tests ran in 0.01s", None, True, "Bash",
     ("test", "error", "no tests ran in 0.01s")),
    ("pytest", "Exit code 127\nbash: pytest: command not found", None, True, "Bash",
     ("test", "error", "exit 127")),
    ("cargo build", "Exit code 101\nerror[E0425]: cannot find value `x` in this scope", None,
     True, "Bash", ("build", "error", "error[E0425]: cannot find value `x` in this scope")),
    ("tsc --noEmit", "src/a.ts(3,5): error TS2322: Type 'string' is not assignable", 2, None,
     "shell", ("build", "error", "src/a.ts(3,5): error TS2322: Type 'string' is not assignable")),
    ("gcc -o m m.c", "m.c:3:5: error: expected ';' before 'return'", None, None, "Bash",
     ("build", "error", "m.c:3:5: error: expected ';' before 'return'")),
    ("cargo build", "(Bash completed with no output)", None, False, "Bash",
     ("build", "passed", "exit 0")),
]  # fmt: skip


@pytest.mark.parametrize(("command", "output", "code", "is_error", "tool", "expected"), READS)
def test_a_test_run_or_build_is_read_from_its_exit_status_else_its_summary_line(
    command, output, code, is_error, tool, expected
):
    outcome = read_command(command, output, exit_code=code, is_error=is_error, tool=tool)
    assert outcome is not None
    assert (outcome.kind, outcome.status, outcome.summary) == expected


@pytest.mark.parametrize(
    ("command", "output"),
    [
        ("ls -la", "total 0"),
        ("git status", "nothing to commit, working tree clean"),
        ("cat tests/test_a.py", "def test_a():\n    assert 1\n1 failed, 2 passed in 0.1s"),
        ("pytest -q", "(still running)"),  # no exit status, no summary: nothing known
    ],
)
def test_other_commands_and_unreadable_runs_are_no_outcome(command, output):
    assert read_command(command, output) is None


def test_the_runner_is_found_behind_wrappers_and_before_pipes():
    assert find_runner("cd api && uv run pytest -x | tail -5") == ("test", "pytest", 1)
    assert find_runner("timeout 60 npm run test -- --watch=false") == ("test", "npm", 0)
    assert find_runner("npm run build && npm test") == ("test", "npm", 1)  # a test run first
    assert find_runner("echo pytest") is None


# ---- rows: a harvested turn, a proxy episode -------------------------------------------------


def _call(call_id: str, name: str, args: dict) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }  # noqa: E501


def harvested(
    runs: list[tuple[str, str, bool]], *, session: str = "s-1", at: float = 1.0, **kw
) -> Interaction:
    """A Claude Code turn as the harvester stores it: (command, result, is_error) per Bash
    call, plus a Read call that is not a command."""
    calls = [_call("r0", "Read", {"file_path": "calc.py"})]
    results = [{"tool_call_id": "r0", "content": "def add(a, b): ...", "is_error": False}]
    for i, (command, output, is_error) in enumerate(runs):
        calls.append(_call(f"b{i}", "Bash", {"command": command}))
        results.append({"tool_call_id": f"b{i}", "content": output, "is_error": is_error})
    return Interaction(
        messages=[{"role": "user", "content": "make the tests pass"}],
        reply="done",
        source="claude-code",
        session_id=session,
        created_at=at,
        tool_calls=calls,
        meta={"tool_results": results},
        **kw,
    )


def proxy_episode(runs: list[tuple[str, str]]) -> Interaction:
    """A Codex session through the proxy, collapsed: the tool turns are in its messages."""
    messages: list[dict] = [{"role": "user", "content": "fix the build"}]
    for i, (command, output) in enumerate(runs):
        call = _call(f"c{i}", "exec_command", {"cmd": command})
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
    return Interaction(
        messages=messages,
        reply="fixed",
        source="proxy",
        session_id="codex-1",
        meta={"wire": "responses"},
    )


RED = ("python3 -m unittest -q test_calc", UNITTEST_RED, True)
GREEN = ("python3 -m unittest -q test_calc", UNITTEST_GREEN, False)
EDIT = ("sed -i 's/a - b/a + b/' calc.py", "(Bash completed with no output)", False)


def test_steps_come_from_a_harvested_turn_and_from_a_proxy_episode():
    steps = tool_steps(harvested([RED, EDIT, GREEN]))
    assert [s.index for s in steps] == [1, 2, 3]  # the Read call is not a command
    assert steps[0].is_error is True and steps[0].command == RED[0]
    steps = tool_steps(proxy_episode([("python3 -m unittest", CODEX_RED)]))
    assert [(s.tool, s.is_error) for s in steps] == [("exec_command", None)]


def test_a_session_is_solved_when_its_last_run_passes_after_a_red_one():
    solved, red, green_only, no_runs = (
        harvested([RED, EDIT, GREEN], session="a"),
        harvested([GREEN, EDIT, RED], session="b"),
        harvested([GREEN], session="c"),
        harvested([EDIT], session="d"),
    )
    got = read_session([solved, red, green_only, no_runs])
    assert got[solved.id].verdict == "solved" and got[solved.id].check.command == GREEN[0]
    assert got[red.id].verdict == "failed" and got[red.id].last.summary.endswith(
        "FAILED (failures=1)"
    )  # noqa: E501
    assert got[green_only.id].verdict == "none" and got[no_runs.id].verdict == "none"
    # a later turn of the same session that fixes what the earlier one left red is solved
    first, second = harvested([RED], session="e", at=1.0), harvested([GREEN], session="e", at=2.0)
    got = read_session([second, first])
    assert (got[first.id].verdict, got[second.id].verdict) == ("failed", "solved")
    # a proxy episode of Codex, read from its tool turns
    episode = proxy_episode(
        [("python3 -m unittest", CODEX_RED), ("python3 -m unittest", CODEX_GREEN)]
    )  # noqa: E501
    assert read_session([episode])[episode.id].verdict == "solved"


def test_solved_and_red_sessions_become_agent_signals_counted_in_the_mining_report():
    solved = harvested([RED, EDIT, GREEN], session="a")
    red = harvested([RED], session="b")
    explicit = harvested([RED], session="c", feedback=Feedback(thumb="up"))  # the operator's
    chat = Interaction(messages=[{"role": "user", "content": "2+2?"}], reply="4")
    rows, signals, report = read_outcomes([solved, red, explicit, chat])
    by_row = {s.row_id: s for s in signals}
    assert (by_row[solved.id].kind, by_row[solved.id].thumb) == ("solved", "up")
    assert (by_row[red.id].kind, by_row[red.id].thumb) == ("ended_red", "down")
    assert {s.source for s in signals} == {"agent"} and all(s.trusted for s in signals)
    assert by_row[solved.id].words.startswith("python3 -m unittest -q test_calc → Ran 1 test: OK")
    out = {it.id: it for it in rows}
    assert out[solved.id].feedback.thumb == "up" and out[red.id].feedback.thumb == "down"
    assert out[explicit.id].feedback.thumb == "up"  # explicit feedback wins
    assert out[solved.id].meta["outcome"]["check"] == GREEN[0]
    assert chat.id in out and "outcome" not in out[chat.id].meta
    assert report.signals == {"solved": 1, "ended_red": 2}
    assert report.runs == {"failed": 3, "passed": 1} and report.with_runs == 3

    tasks, mined = mine([solved, red], MineConfig(judge=True), rejected={by_row[red.id].id})
    assert mined.conversation.signals == {"solved": 1}  # the rejected one is not used
    assert mined.agent.rejected_by_operator == 1
    assert mined.negative == 0 and all(t.check == "rubric" for t in tasks)


def test_an_untrusted_clients_agent_signal_is_evidence_only():
    row = proxy_episode([("python3 -m unittest", CODEX_RED)])
    row.client = "key:end-user"
    _, (signal,), _ = read_outcomes([row])
    assert signal.kind == "ended_red" and signal.trusted is False and signal.giver == "key:end-user"


# ---- the check a solved run becomes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "cwd", "argv"),
    [
        ("python3 -m unittest -q test_calc", ".", ("python3", "-m", "unittest", "-q", "test_calc")),
        ("pytest -q 2>&1 | tail -5", ".", ("pytest", "-q")),
        ("PYTHONPATH=src python -m unittest", ".", ("env", "PYTHONPATH=src", "python", "-m", "unittest")),  # noqa: E501
        ("cd /repo/api && go test ./...", ".",
         ("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", "api", "go", "test", "./...")),
        ("make test", "web", ("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", "web", "make", "test")),  # noqa: E501
        ("pytest tests/*.py", ".", None),  # a glob needs a shell
        ("pytest $TESTS", ".", None),
        ("pip install -e . && pytest", ".", None),  # something else ran first
        ("cd /elsewhere && pytest", ".", None),  # outside the repository
        ("cd .. && pytest", ".", None),
        ("ls", ".", None),
    ],
)  # fmt: skip
def test_the_check_is_the_runners_command_alone(command, cwd, argv):
    assert check_argv(command, "/repo", cwd) == argv


# ---- what the harvesters keep for it -----------------------------------------------------------


def test_harvested_results_keep_codexs_exit_code_and_a_long_outputs_summary_line(tmp_path):
    from pathlib import Path

    from selftaught.sleep.intake.harvest import HarvestConfig, HarvestReport, harvesters
    from selftaught.sleep.intake.harvest.common import RESULT_CHARS, AgentTurn

    fixtures = Path(__file__).parent / "fixtures" / "codex"
    (rollout,) = fixtures.rglob("rollout-*-019cd2e1-7a40-*.jsonl")
    report = HarvestReport("codex", str(rollout.parent))
    rows = harvesters()["codex"].read_session(rollout, HarvestConfig(since=0), report)
    results = [r for row in rows for r in row.meta.get("tool_results", [])]
    assert results and results[0]["exit_code"] == 0  # the legacy `metadata.exit_code`
    assert results[0]["content"].startswith("def total(items):")

    turn = AgentTurn(prompt="run the tests", created_at=0.0, key="k")
    long = "collected 900 items\n" + "." * 20_000 + "\n1 failed, 899 passed in 9.1s"
    turn.add_result("c1", long, is_error=True)
    kept = turn.results[0]["content"]
    assert len(kept) < RESULT_CHARS + 100 and kept.startswith("collected 900 items")
    assert kept.endswith("1 failed, 899 passed in 9.1s") and "[... cut:" in kept
    assert read_command("pytest", kept, is_error=True, tool="Bash").summary.startswith("1 failed")
