"""Tasks that check what the agent did: a JSONL line's `workspace` (copied afresh for each
attempt) and `check` (a command run in the sandbox on the files the agent left). The agent
here is a real process behind `cmd:` (a small Python script); the check is a real unittest run
under bubblewrap (or the resource-limits-only mode where bubblewrap is missing)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.api import evaluate
from selftaught.cli import app
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.tasks.base import TaskError
from selftaught.tasks.check import Check, pack_workspace, run_check
from selftaught.tasks.jsonl import JsonlTask
from selftaught.tasks.sandbox import BWRAP_ENV, SandboxError, find_bwrap, open_sandbox
from tests.scripted import ScriptedModel

UNSAFE = find_bwrap() is None  # CI installs bubblewrap; elsewhere run resource-limits only
UNSAFE_ARGS = ["--unsafe-exec"] if UNSAFE else []

CALC = "def add(a, b):\n    return a - b\n"
TEST_CALC = (
    "import unittest\nfrom calc import add\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
# The agent: fixes the sign only when the skill (in AGENTS.md) tells it to.
FIXER = """\
import pathlib, sys
prompt = sys.stdin.read()
rules = pathlib.Path("AGENTS.md").read_text() if pathlib.Path("AGENTS.md").exists() else ""
if "FIX-THE-SIGN" in rules:
    calc = pathlib.Path("calc.py")
    calc.write_text(calc.read_text().replace("a - b", "a + b"))
    print("fixed calc.py for: " + prompt.splitlines()[0])
else:
    print("looked around, changed nothing")
"""


def agent_spec(tmp_path: Path, source: str, name: str = "agent.py", args: str = "") -> str:
    script = tmp_path / name
    script.write_text(source)
    return f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(script))} {args}".strip()


def project(tmp_path: Path, rows: list[dict]) -> Path:
    proj = tmp_path / "tasks" / "proj"
    proj.mkdir(parents=True)
    (proj / "calc.py").write_text(CALC)
    (proj / "test_calc.py").write_text(TEST_CALC)
    path = tmp_path / "tasks" / "fix.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fix_rows(n: int = 2, **extra) -> list[dict]:
    return [
        {
            "id": f"fix{i}",
            "input": f"Make the tests pass (attempt {i}).",
            "workspace": "proj",
            "check": "python -m unittest -q test_calc",
            "split": "test",
            **extra,
        }
        for i in range(n)
    ]


def _eval(tasks: Path, model: str, out: Path, *extra: str) -> tuple[int, str, list[dict]]:
    result = CliRunner().invoke(
        app,
        ["eval", "--task", f"jsonl:{tasks}", "--model", model, "--split", "test"]
        + ["--output", str(out), *UNSAFE_ARGS, *extra],
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return result.exit_code, result.output, rows


def test_check_scores_the_files_the_agent_left_not_its_words(tmp_path):
    tasks = project(tmp_path, fix_rows())
    model = agent_spec(tmp_path, FIXER)
    skill = tmp_path / "skill.md"
    skill.write_text("When tests fail on addition, FIX-THE-SIGN in calc.py.\n")

    code, output, rows = _eval(tasks, model, tmp_path / "with.jsonl", "--skill", str(skill))
    assert code == 0, output
    assert [r["score"]["hard"] for r in rows] == [1.0, 1.0]
    assert all(r["error"] is None for r in rows)
    assert rows[0]["agent"]["files_changed"] == ["M calc.py (+1 -1)"]
    assert rows[0]["reply"].startswith("fixed calc.py for: Make the tests pass")
    assert "check passed" in rows[0]["score"]["feedback"]

    code, output, rows = _eval(tasks, model, tmp_path / "without.jsonl")
    assert code == 0, output
    assert [r["score"]["hard"] for r in rows] == [0.0, 0.0]
    assert rows[0]["agent"]["files_changed"] == []
    assert "check failed (exit 1)" in rows[0]["score"]["feedback"]
    assert "AssertionError: -1 != 5" in rows[0]["score"]["feedback"]
    # the line's folder itself is never touched: each attempt worked on a copy
    assert (tasks.parent / "proj" / "calc.py").read_text() == CALC
    assert sorted(p.name for p in (tasks.parent / "proj").iterdir()) == ["calc.py", "test_calc.py"]


def test_a_chat_model_on_a_check_task_is_scored_on_the_untouched_copy(tmp_path):
    task = JsonlTask(project(tmp_path, fix_rows()), unsafe_exec=UNSAFE)
    boaster = ScriptedModel(lambda m: "I fixed calc.py, all tests pass now.")
    result = evaluate(task, boaster, split="test")
    assert [r.score.hard for r in result.rollouts] == [0.0, 0.0]
    assert all("check failed" in r.score.feedback for r in result.rollouts)
    assert all(r.agent is None and not r.is_episode for r in result.rollouts)
    # the same honest 0 when the task is scored without a rollout (ReST, replays)
    example = task.examples("test")[0]
    assert task.score("I fixed it", example).hard == 0.0


def test_each_attempt_gets_a_fresh_copy(tmp_path):
    counter = """\
import pathlib
seen = pathlib.Path("runs.txt")
n = int(seen.read_text()) + 1 if seen.exists() else 1
seen.write_text(str(n))
print(f"run {n}")
"""
    rows = [
        {
            "id": "c",
            "input": "Count.",
            "workspace": "proj",
            "check": [
                "python",
                "-c",
                "import pathlib; assert pathlib.Path('runs.txt').read_text() == '1'",
            ],
            "split": "test",
        }
    ]
    task = JsonlTask(project(tmp_path, rows), unsafe_exec=UNSAFE)
    from selftaught.models import load_model

    model = load_model(agent_spec(tmp_path, counter))
    out = run_rollouts(
        model, Policy(), task, task.examples("test"), RolloutConfig(samples=3, progress=False)
    )
    assert [r.reply for r in out] == ["run 1"] * 3
    assert [r.score.hard for r in out] == [1.0] * 3


def test_a_workspace_line_without_check_is_scored_on_the_reply(tmp_path):
    reader = "import pathlib\nprint(pathlib.Path('calc.py').read_text().split()[1])\n"
    rows = [{"id": "r", "input": "Name the function.", "workspace": "proj", "reference": "add(a,"}]
    rows[0]["split"] = "test"
    task = JsonlTask(project(tmp_path, rows), scorer="exact")
    assert task.sandbox is None  # no check: nothing to run in a sandbox
    from selftaught.models import load_model

    result = evaluate(task, load_model(agent_spec(tmp_path, reader)), split="test")
    assert result.rollouts[0].reply == "add(a,"
    assert result.hard == 1.0


def test_a_check_that_gives_no_verdict_is_an_error_not_a_zero(tmp_path):
    rows = [
        {"id": "missing", "input": "a", "check": "no-such-checker --run", "split": "test"},
        {
            "id": "slow",
            "input": "b",
            "check": ["python", "-c", "import time; time.sleep(60)"],
            "check_timeout": 1,
            "split": "test",
        },
    ]
    task = JsonlTask(project(tmp_path, rows), unsafe_exec=UNSAFE)
    result = evaluate(task, ScriptedModel(lambda m: "done"), split="test")
    by_id = {r.example_id: r for r in result.rollouts}
    assert all(r.score is None and r.error_source == "scorer" for r in by_id.values())
    assert "`no-such-checker --run` could not start: No such file" in by_id["missing"].error
    assert "timed out after 1s" in by_id["slow"].error
    assert result.n == 0 and result.n_scorer_errors == 2


def test_check_may_run_a_shell_and_system_programs(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "out.txt").write_text("hello\n")
    sandbox = open_sandbox(unsafe_exec=UNSAFE)
    ok = run_check(
        sandbox, Check(("sh", "-c", "grep -q hello out.txt && echo found")), tmp_path / "ws"
    )
    assert (ok.hard, ok.feedback) == (1.0, "check passed: found")
    bad = run_check(sandbox, Check(("sh", "-c", "echo nope >&2; exit 4")), tmp_path / "ws")
    assert (bad.hard, bad.feedback) == (0.0, "check failed (exit 4): nope")


def test_links_out_of_the_workspace_do_not_travel(tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "inside.txt").write_text("in")
    (ws / "out").symlink_to("/etc/hostname")
    (ws / "in").symlink_to("sub/inside.txt")
    import tarfile

    tar = tmp_path / "w.tar"
    pack_workspace(ws, tar)
    with tarfile.open(tar) as archive:
        assert sorted(archive.getnames()) == ["in", "sub", "sub/inside.txt"]
    sandbox = open_sandbox(unsafe_exec=UNSAFE)
    probe = "import os; assert not os.path.lexists('out'); assert open('in').read() == 'in'"
    assert run_check(sandbox, Check(("python", "-c", probe)), ws).hard == 1.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"workspace": "nowhere"}, "workspace 'nowhere' is not a folder"),
        ({"workspace": ""}, "`workspace` must be a folder path"),
        ({"check": ""}, "`check` is empty"),
        ({"check": 3}, "`check` must be a command string or a list of strings"),
        ({"check": "python 'unclosed"}, "`check` cannot be split"),
        ({"check": "true", "scorer": "exact"}, "scored by it; drop `scorer`"),
        ({"check_timeout": 5}, "`check_timeout` without a `check`"),
        ({"check": "true", "check_timeout": -1}, "`check_timeout` must be a number"),
    ],
)
def test_bad_workspace_or_check_fields_name_the_line(tmp_path, extra, message):
    rows = [{"id": "ok", "input": "x", "reference": "y"}, {"id": "bad", "input": "z", **extra}]
    if "check" not in extra:
        rows[1]["reference"] = "y"
    path = project(tmp_path, rows)
    with pytest.raises(TaskError, match="fix.jsonl:2: ") as err:
        JsonlTask(path, unsafe_exec=True)
    assert message in str(err.value)


def test_a_check_line_needs_no_reference(tmp_path):
    task = JsonlTask(project(tmp_path, fix_rows(1)), unsafe_exec=UNSAFE)
    (example,) = task.examples("test")
    assert example.reference is None
    assert task.workspace_for(example).source == (tmp_path / "tasks" / "proj").resolve()


def test_check_tasks_refuse_to_load_without_bubblewrap_unless_unsafe(tmp_path, monkeypatch):
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-bwrap"))
    path = project(tmp_path, fix_rows(1))
    with pytest.raises(SandboxError, match="bubblewrap .* is not installed"):
        JsonlTask(path)
    task = JsonlTask(path, unsafe_exec=True)
    assert task.name == "fix[unsafe-exec]"
    (example,) = task.examples("test")
    assert task.score("", example).hard == 0.0  # the check still runs, with limits only


def test_a_task_without_score_workspace_is_refused_in_a_sentence(tmp_path):
    # a plugin that gives workspaces (`workspace_for`) but cannot score one: a TaskError
    # naming the task, never an AttributeError from deep in the rollout
    from selftaught.rollout import score_in_workspace
    from tests.scripted import ToyTask

    task = ToyTask()
    example = task.examples("train")[0]
    with pytest.raises(TaskError, match="has no score_workspace"):
        score_in_workspace(task, "4", example, False, tmp_path)
