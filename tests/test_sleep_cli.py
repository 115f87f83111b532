"""The sleep commands end to end through the CLI: import, log (list / filter / export),
feedback, harvest of the fixtures; bad input is one sentence and exit code 2. On both log
backends (SQLite, Postgres: `log_at` in tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.intake.log import TaskLog

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def run(tmp_path, monkeypatch, log_at):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))
    monkeypatch.setattr(cli.out, "width", 250)  # a table wide enough not to fold the text
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())

    return invoke


def test_import_log_feedback_export(run, tmp_path, log_at):
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "deploy with token ghp_" + "a1" * 18},
                    {"role": "assistant", "content": "done"},
                ]
            }
        )
        + "\n"
        + json.dumps({"input": [{"role": "user", "content": "2+2?"}], "ideal": "4"})
        + "\n"
    )
    code, text = run("sleep", "import", str(data), "--project", "ops")
    assert code == 0 and "imported 2 new of 2" in text and "1 openai-chat" in text
    code, text = run("sleep", "import", str(data), "--project", "ops")
    assert code == 0 and "imported 0 new of 2" in text and "2 were already in the log" in text

    code, text = run("sleep", "log", "--project", "ops")
    assert code == 0 and "2 rows match" in text and "1 redacted" in text
    assert "ghp_" not in text and "REDACTED" in text
    (row,) = [r for r in TaskLog(log_at).query() if r.reply == "done"]
    code, text = run("sleep", "feedback", row.id[:8], "--thumbs", "down", "--reference", "ok")
    assert code == 0 and row.id in text
    code, text = run("sleep", "log", "--feedback")
    assert code == 0 and "1 rows match" in text and "down" in text

    out = tmp_path / "export.jsonl"
    code, text = run("sleep", "log", "--export", str(out), "--source", "import")
    assert code == 0 and "exported 2" in text
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["reply"] for r in rows} == {"done", None}
    assert any(r["feedback"] and r["feedback"]["thumb"] == "down" for r in rows)


def test_harvest_the_claude_code_fixture(run, tmp_path):
    root = FIXTURES / "claude_code" / "projects"
    args = (
        "sleep",
        "harvest",
        "--source",
        "claude-code",
        "--root",
        str(root),
        "--since",
        "2020-01-01",
    )
    code, text = run(*args)
    assert code == 0 and "3 interactions in the window, 3 new" in text
    code, text = run(*args)
    assert code == 0 and "0 new" in text
    code, text = run("sleep", "log", "--source", "claude-code")
    assert "3 rows match" in text and "private" in text and "claude-opus-4-6" in text
    code, text = run("sleep", "harvest", "--source", "auto", "--root", str(root))
    assert code == 2 and "--root needs one --source" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sleep", "feedback", "abcdef12", "--thumbs", "up"), "no interaction with id"),
        (("sleep", "feedback", "abcdef12"), "feedback is empty"),
        (("sleep", "log", "--since", "last tuesday"), "not a time"),
        (("sleep", "harvest", "--source", "cursor"), "valid: auto, claude-code, codex"),
        (("sleep", "harvest", "--max-tasks", "0"), "must be at least 1"),
        (("sleep", "import", "/nonexistent.jsonl"), "no such file"),
        (("proxy", "--upstream", "http://x/v1#m", "--host", "0.0.0.0"), "refusing to bind"),
        (("proxy", "--upstream", "nonsense"), "unknown model spec"),
        (("proxy", "--upstream", "http://x/v1#m", "--project", "../x"), "invalid project name"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(run, args, message):
    code, text = run(*args)
    assert code == 2 and message in text and "Traceback" not in text


def test_malformed_import_line_names_file_and_line(run, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"input": "q", "ideal": "a"}\n{"input": \n')
    code, text = run("sleep", "import", str(data))
    assert code == 2 and f"{data}:2: malformed JSON" in text
    code, text = run("sleep", "log")
    assert "0 rows match" in text


def test_log_and_history_read_in_a_narrow_terminal_and_as_json(tmp_path, monkeypatch, log_at):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))
    monkeypatch.setattr(cli.out, "width", 80)
    data = tmp_path / "chat.jsonl"
    rows = [
        {"input": [{"role": "user", "content": f"question {i}: " + "words " * 30}], "ideal": "4"}
        for i in range(5)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    assert runner.invoke(app, ["sleep", "import", str(data), "--project", "ops"]).exit_code == 0
    ids = [r.id[:8] for r in TaskLog(log_at).query()]

    table = runner.invoke(app, ["sleep", "log"]).output.splitlines()
    assert all(len(line) <= 80 for line in table)
    for i in ids:  # one line per row, its id whole on it: grep finds every row
        assert sum(i in line for line in table) == 1
    assert sum(line.startswith("│") for line in table) == len(ids)  # no cell wraps

    lines = runner.invoke(app, ["sleep", "log", "--json"]).output.splitlines()
    assert sorted(json.loads(line)["id"][:8] for line in lines) == sorted(ids)

    history = runner.invoke(app, ["sleep", "history", "--project", "ops", "--json"])
    assert history.exit_code == 0
    (version,) = [json.loads(line) for line in history.output.splitlines()]
    assert version["kind"] == "version" and version["version"] == 0


def test_forget_shows_first_deletes_with_yes_and_a_reimport_stores_nothing(run, tmp_path, log_at):
    data = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant",
                                                              "content": f"a{i}"}]}
             for i in range(3)]  # fmt: skip
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert run("sleep", "import", str(data), "--project", "ops")[0] == 0
    assert run("sleep", "import", str(data), "--project", "kept")[0] == 0

    code, text = run("sleep", "log", "forget")
    assert code == 2 and "name the rows to forget" in text
    code, text = run("sleep", "log", "forget", "--project", "ops")
    assert code == 0 and "3 rows would go" in text and "nothing deleted" in text
    assert TaskLog(log_at).count() == 6
    one = TaskLog(log_at).query()[0].id
    code, text = run("sleep", "log", "forget", "--id", one[:8], "--yes")
    assert code == 0 and "forgot 1 rows" in text
    code, text = run("sleep", "log", "forget", "--project", "ops", "--yes")
    assert code == 0 and "forgot" in text
    assert {r.project for r in TaskLog(log_at).query()} == {"kept"}
    code, text = run("sleep", "import", str(data), "--project", "ops")
    assert code == 0 and "imported 0 new of 3" in text  # forgotten: never stored again
    code, text = run("sleep", "log", "forget", "--id", "nosuchid", "--yes")
    assert code == 2 and "no interaction" in text
