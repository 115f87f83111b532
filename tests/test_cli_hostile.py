"""Issue 63, class 8: hostile numbers and bytes on the command line get one sentence, never a
traceback, and what a command prints as JSON is always JSON.

- an argument (or a `SELFTAUGHT_*` variable) that is not UTF-8: Python reads it as lone
  surrogates, which reached an SQL parameter as a traceback (`sleep log forget --id`,
  `--tag`, `--session`, `--client`, `sleep feedback ID --reject-signal`); now one check
  before any command runs, exit 2;
- a feedback score must be a finite number from 0 to 1 (NaN and ±Infinity were stored);
- `sleep log --json` printed `NaN` / `-Infinity` (not JSON) for a stored NaN or infinity.

On both log backends (`log_at`, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import selftaught
from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog

BAD = "\udcff"  # what Python makes of the byte 0xff in argv (surrogateescape)


def strict(line: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture
def env(tmp_path, monkeypatch, log_at):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))
    monkeypatch.setattr(cli.out, "width", 250)
    monkeypatch.setattr(cli.console, "width", 250)
    with TaskLog(log_at) as log:
        row = Interaction(
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            reply="5",
            project="demo",
            tags=["t"],
            session_id="s1",
            client="key:abc",
            meta={"nan": float("nan"), "inf": float("inf"), "deep": [{"x": float("-inf")}]},
        )
        log.add(row)

    def invoke(*args: str) -> tuple[int, str, object]:
        result = CliRunner().invoke(app, list(args))
        return result.exit_code, result.output, result.exception

    return log_at, row.id, invoke


def one_sentence_exit_2(code: int, output: str, exception: object, words: str) -> None:
    assert code == 2, output
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], output


@pytest.mark.parametrize(
    "args",
    [
        ["sleep", "log", "forget", "--id", BAD, "--yes"],
        ["sleep", "log", "forget", "--tag", "t" + BAD, "--yes"],
        ["sleep", "log", "forget", "--session", BAD, "--yes"],
        ["sleep", "log", "forget", f"--client=key:{BAD}", "--yes"],
        ["sleep", "feedback", BAD, "--reject-signal"],
        ["sleep", "feedback", "{id}", "--comment", "wrong" + BAD],
        ["sleep", "log", "--project", BAD],
        ["eval", "--task", "gym:" + BAD, "--model", "local"],
    ],
    ids=["id", "tag", "session", "client", "reject-signal", "comment", "log", "eval"],
)
def test_an_argument_that_is_not_utf8_is_one_sentence_and_exit_2(env, args):
    log_at, row, invoke = env
    code, output, exception = invoke(*[a.replace("{id}", row) for a in args])
    one_sentence_exit_2(code, output, exception, "is not UTF-8 text")
    with TaskLog(log_at) as log:
        kept = log.get(row)
    assert kept.feedback.empty() and kept.reply == "5"  # nothing forgotten, nothing attached


def test_a_variable_that_is_not_utf8_is_one_sentence_and_exit_2(env, monkeypatch):
    _, _, invoke = env
    monkeypatch.setenv("SELFTAUGHT_LOG", "/tmp/log" + BAD)
    one_sentence_exit_2(*invoke("sleep", "log"), "$SELFTAUGHT_LOG is not UTF-8 text")


def test_real_bytes_from_a_shell_are_refused_the_same_way(env, tmp_path):
    """The same through a real process: argv bytes 0xff 0xfe, as a shell passes them."""
    log_at, row, _ = env
    environ = {**os.environ, "PYTHONPATH": str(Path(selftaught.__file__).parents[1])}
    argv = [sys.executable.encode(), b"-m", b"selftaught.cli", b"sleep", b"log", b"forget"]
    argv += [b"--session", b"\xff\xfe", b"--yes"]
    done = subprocess.run(argv, capture_output=True, env=environ, timeout=120)
    assert done.returncode == 2 and b"Traceback" not in done.stderr, done.stderr
    assert b"--session is not UTF-8 text (\\xff\\xfe)" in done.stderr


@pytest.mark.parametrize("score", ["nan", "inf", "-inf", "1e400", "1.5", "-0.25"])
def test_a_feedback_score_must_be_a_finite_number_from_0_to_1(env, score):
    log_at, row, invoke = env
    code, output, exception = invoke("sleep", "feedback", row, "--score", score)
    one_sentence_exit_2(code, output, exception, "score must be a number from 0 to 1")
    code, output, _ = invoke("sleep", "feedback", row, "--score", "0.25")
    assert code == 0, output
    with TaskLog(log_at) as log:
        assert log.get(row).feedback.score == 0.25
    for bad in (float("nan"), float("inf"), 2, True, "0.5"):
        with pytest.raises(ValueError, match="score must be a number from 0 to 1"):
            Feedback(score=bad)  # type: ignore[arg-type]


def test_json_output_is_always_json(env, tmp_path):
    """A row holding NaN and infinities (in `meta`, as the Python API stores them; a score
    stored before scores were checked): each line of `sleep log --json` and of an export
    parses as JSON, the numbers JSON cannot spell written null."""
    log_at, row, invoke = env
    with TaskLog(log_at) as log:
        log.add_feedback(row, Feedback(comment="old"))
        with log._backend.write() as conn:  # a score stored before the check existed
            log._exec(conn, "UPDATE feedback SET score = ?", [float("-inf")])
        assert log.get(row).feedback.score == float("-inf")
    code, output, _ = invoke("sleep", "log", "--json")
    assert code == 0, output
    printed = [strict(line) for line in output.splitlines() if line.strip()]
    assert len(printed) == 1
    assert printed[0]["meta"] == {"nan": None, "inf": None, "deep": [{"x": None}]}
    assert printed[0]["feedback"]["score"] is None
    code, output, _ = invoke("sleep", "log", "--export", str(tmp_path / "rows.jsonl"))
    assert code == 0, output
    exported = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert [strict(line)["meta"]["inf"] for line in exported] == [None]


def test_every_command_refuses_an_argument_that_is_not_utf8(tmp_path, monkeypatch):
    """Every command and group (those added since round four's hostile-bytes test among them:
    `sleep log forget`, `sleep feedback --reject-signal`, `sleep resume`, `doctor`, `mcp`,
    `watch`): the one check runs before any of them."""
    from selftaught.cli.reference import commands

    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    paths = [path.split() for path, _ in commands() if path]
    assert ["sleep", "log", "forget"] in paths and ["watch"] in paths and ["mcp"] in paths
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--project", "demo" + BAD])
        assert result.exit_code == 2, (path, result.output)
        assert "--project is not UTF-8 text" in result.output, (path, result.output)
    assert not (tmp_path / "home").exists()  # refused before anything was made


@pytest.mark.parametrize(
    "args",
    [
        ["sleep", "log", "--limit", "9" * 30],
        ["sleep", "log", "--limit", "-1"],
        ["sleep", "log", "--since", "1e400d"],
        ["sleep", "log", "--since", "NaNd"],
        ["sleep", "log", "forget", "--until", "1e400d", "--yes"],
        ["sleep", "log", "forget", "--until", "-Infinityd", "--yes"],
        ["sleep", "feedback", "{id}", "--score", "9" * 400],
    ],
    ids=[
        "limit huge",
        "limit negative",
        "since 1e400",
        "since NaN",
        "until 1e400",
        "until -inf",
        "score 400 digits",
    ],  # fmt: skip
)
def test_hostile_numbers_on_the_log_commands_are_one_sentence(env, args):
    log_at, row, invoke = env
    code, output, exception = invoke(*[a.replace("{id}", row) for a in args])
    one_sentence_exit_2(code, output, exception, "")
    with TaskLog(log_at) as log:
        assert log.get(row).feedback.empty()
