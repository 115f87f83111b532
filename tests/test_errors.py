"""One error root (`selftaught.errors`): every documented exit code through the CLI, every
exception class under `SelftaughtError`, no plain ValueError/RuntimeError raised in src."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

import selftaught
from selftaught import cli
from selftaught.cli import app
from selftaught.errors import (
    EXIT_CODES,
    BackendError,
    BudgetExhausted,
    Busy,
    ConfigError,
    InputError,
    MissingDependency,
    RunError,
    SelftaughtError,
    TaskError,
)
from selftaught.sleep.lock import night_lock
from tests.fault_server import FaultServer
from tests.scripted import rule_answer

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "selftaught"
TOY = f"{ROOT / 'tests' / 'scripted.py'}:ToyTask"  # val split: 11 examples


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))
    monkeypatch.setattr(cli.out, "width", 250)
    monkeypatch.setattr(cli.console, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, [str(a) for a in args])
        text = " ".join(result.output.split())
        assert "Traceback" not in text, text
        # a mapped error leaves through typer.Exit, never as an uncaught exception
        assert result.exception is None or isinstance(result.exception, SystemExit), text
        return result.exit_code, text

    return invoke


@pytest.fixture
def toy_server():
    with FaultServer(lambda m: rule_answer(m), models=("toy-model",)) as server:
        yield server, f"{server.base_url}#toy-model"


def optimize(server_spec: str, out: Path, *extra: str) -> list[str]:
    return [
        "optimize", "--task", TOY, "--model", server_spec, "--optimizer-model", server_spec,
        "--api-key", "k", "--output", str(out), "--epochs", "1", "--batch-size", "4", *extra,
    ]  # fmt: skip


# ---- the table -------------------------------------------------------------------------------


def test_each_family_has_its_own_code_and_the_table_names_them_all():
    families = [BackendError, InputError, Busy, RunError, BudgetExhausted, MissingDependency]
    codes = [f.exit_code for f in families]
    assert len(set(codes)) == len(codes) and 0 not in codes
    assert set(EXIT_CODES) == {0, *codes}
    assert ConfigError.exit_code == TaskError.exit_code == InputError.exit_code == 2
    # the builtin bases code already catches are kept
    assert issubclass(ConfigError, ValueError) and issubclass(RunError, RuntimeError)


def test_the_commands_page_documents_the_same_exit_codes():
    page = (ROOT / "docs" / "commands.md").read_text()
    table = page[page.index("## Exit codes") :]
    table = table[: table.index("\n\n", table.index("|"))]
    documented = {int(m) for m in re.findall(r"^\| `(\d+)` \|", table, re.M)}
    assert documented == set(EXIT_CODES)


def test_every_exception_class_in_src_descends_from_the_root():
    strays = []
    for info in pkgutil.walk_packages(selftaught.__path__, "selftaught."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not issubclass(obj, SelftaughtError)
            ):
                strays.append(f"{module.__name__}.{name}")
    assert not strays


def _plain_raises(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "RuntimeError"):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_plain_value_or_runtime_error_is_raised_in_src():
    found = [
        f"{path.relative_to(SRC)}: {hit}"
        for path in sorted(SRC.rglob("*.py"))
        for hit in _plain_raises(path)
    ]
    assert not found


def test_the_raise_finder_sees_both_forms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    raise ValueError('x')\n\n\ndef g():\n    raise RuntimeError\n")
    assert _plain_raises(probe) == ["probe.py:2", "probe.py:6"]


# ---- every documented code, through the CLI --------------------------------------------------


def test_exit_0_done(run):
    code, text = run("tasks")
    assert code == 0 and "gym:" in text


def test_exit_1_the_backend_failed(run, tmp_path):
    with FaultServer(models=("m",), require_key="right") as server:
        code, text = run(
            "eval", "--task", "gym:basic_arithmetic", "--model", f"{server.base_url}#m",
            "--limit", "2", "--api-key", "wrong", "--output", tmp_path / "e.jsonl",
        )  # fmt: skip
    assert code == 1 and "API key was rejected" in text
    code, text = run(  # nothing listens on port 9
        "eval", "--task", "gym:basic_arithmetic", "--model", "http://127.0.0.1:9/v1#m",
        "--limit", "1", "--timeout", "2",
    )  # fmt: skip
    assert code == 1 and "cannot reach the endpoint" in text


def test_exit_2_a_call_budget_smaller_than_the_val_set(run, toy_server, tmp_path):
    # issue 18: this ValueError used to reach the user as a traceback
    server, spec = toy_server
    code, text = run(*optimize(spec, tmp_path / "run", "--budget-calls", "3"))
    assert code == 2 and "--budget-calls 3 cannot cover even the baseline evaluation" in text
    assert server.requests == []  # refused before any call


def test_exit_2_missing_files_are_named(run, toy_server, tmp_path):
    _, spec = toy_server
    missing = tmp_path / "nope.md"
    code, text = run(*optimize(spec, tmp_path / "run", "--skill", missing))
    assert code == 2 and f"skill file {missing} does not exist" in text
    code, text = run("sleep", "import", tmp_path / "gone.jsonl")
    assert code == 2 and "gone.jsonl" in text
    code, text = run("eval", "--task", f"jsonl:{tmp_path / 'gone.jsonl'}", "--model", spec)
    assert code == 2 and "gone.jsonl" in text


def test_exit_2_a_malformed_jsonl_names_file_and_line(run, tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    code, text = run("sleep", "import", bad)
    assert code == 2 and f"{bad}:2" in text
    code, text = run("sleep", "log")  # all or nothing: the good first row was not stored
    assert code == 0 and "hi" not in text


def test_exit_2_unknown_task_and_unknown_model(run, tmp_path):
    code, text = run("eval", "--task", "gym:no_such_generator", "--model", "local")
    assert code == 2 and "no_such_generator" in text
    code, text = run("eval", "--task", "gym:basic_arithmetic", "--model", "nonsense:thing")
    assert code == 2 and "nonsense:thing" in text
    # a backend that cannot start because of the path given keeps the code of bad input
    code, text = run("eval", "--task", "gym:basic_arithmetic", "--model", f"local:{tmp_path}/x")
    assert code == 2 and "local model path" in text and "does not exist" in text


def test_exit_2_bad_flag_combinations_and_ids(run, tmp_path):
    code, text = run("sleep", "harvest", "--root", tmp_path)
    assert code == 2 and "--root needs one --source" in text
    code, text = run("sleep", "feedback", "abcdef12", "--thumbs", "up")
    assert code == 2 and "no interaction with id 'abcdef12'" in text
    (tmp_path / "a-file").write_text("")
    code, text = run("sleep", "log", "--export", tmp_path / "a-file" / "x.jsonl")
    assert code == 2 and "cannot write" in text and "x.jsonl" in text
    code, text = run("report", tmp_path)
    assert code == 2 and "not" in text
    dead = "http://127.0.0.1:9/v1#m"  # never reached: the run directory is refused first
    code, text = run("optimize", "--task", TOY, "--model", dead, "--output", tmp_path / "a-file")
    assert code == 2 and "cannot write the run directory" in text and "a-file" in text


def test_exit_3_another_night_is_running(run, tmp_path):
    with night_lock(tmp_path / "home", "20260101-031700"):
        code, text = run("sleep", "run", "--model", "http://127.0.0.1:9/v1#m")
    assert code == 3 and "another night is running" in text


def test_exit_4_a_run_directory_that_cannot_be_read(run, toy_server, tmp_path):
    server, spec = toy_server
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"task": "toy", ')  # torn by a crash or a hand edit
    code, text = run(*optimize(spec, out))
    assert code == 4 and "config.json is not valid JSON" in text
    assert server.requests == []


def test_exit_4_a_port_that_is_taken(run, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, text = run("proxy", "--upstream", "http://127.0.0.1:9/v1#m", "--port", port)
    # uvicorn's own exit code for this is 3, which would read as "another night is running"
    assert code == 4 and f"could not listen on 127.0.0.1:{port}" in text


def test_exit_5_the_budget_ran_out_before_anything_was_learned(run, toy_server, tmp_path):
    server, spec = toy_server
    # one call at a time: the budget is checked between calls, so where it ends is exact
    code, text = run(
        *optimize(spec, tmp_path / "run", "--budget-tokens", "50", "--concurrency", "1")
    )
    assert code == 5 and "budget ran out during the baseline evaluation" in text
    assert 0 < len(server.requests) < 11  # it started, and stopped when the budget ended


def test_exit_6_a_missing_program(run, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code, text = run("sleep", "schedule", "--at", "03:00")
    assert code == 6 and "no `crontab` command" in text


# ---- where user-caused OSErrors become InputError --------------------------------------------


def test_read_text_names_the_path(tmp_path):
    from selftaught.errors import read_text

    with pytest.raises(InputError, match=r"rubric .*nope\.md does not exist"):
        read_text(tmp_path / "nope.md", "rubric")
    with pytest.raises(InputError, match="is a folder"):
        read_text(tmp_path, "rubric")
    (tmp_path / "bin.md").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        read_text(tmp_path / "bin.md", "rubric")


def test_a_torn_json_file_is_a_run_error_naming_it(tmp_path):
    from selftaught.runs import read_json

    (tmp_path / "state.json").write_text("{")
    with pytest.raises(RunError, match="state.json is not valid JSON"):
        read_json(tmp_path / "state.json")
    (tmp_path / "ok.json").write_text('{"ok": 1}')
    assert read_json(tmp_path / "ok.json") == {"ok": 1}
