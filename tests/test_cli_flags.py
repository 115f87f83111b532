"""What users type keeps working: every flag of every command that existed when the CLI was
generated from the configs (`fixtures/cli_flags.json`, recorded before) still exists with the
same default; new flags may be added. And `--help` of every command renders."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from selftaught.cli import app

RECORDED = Path(__file__).parent / "fixtures" / "cli_flags.json"


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(command path, click command) for every leaf command of the app, and every group that
    runs on its own with options of its own (`sleep log`, `sleep log migrate`)."""
    cmd = cmd if cmd is not None else typer.main.get_command(app)
    if hasattr(cmd, "commands"):  # a group (typer may vendor click: no isinstance)
        if path and any(type(p).__name__.endswith("Option") for p in cmd.params):
            yield " ".join(path), cmd
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def flags(cmd: Any) -> dict[str, str]:
    """Every flag a command takes (`--x`, `--no-x`, `-x`) with the repr of its default."""
    out = {}
    for p in cmd.params:
        if type(p).__name__.endswith("Option"):
            for opt in [*p.opts, *p.secondary_opts]:
                out[opt] = repr(p.default)
    return out


def current_flags() -> dict[str, dict[str, str]]:
    return {path: flags(cmd) for path, cmd in commands()}


def test_no_flag_or_default_users_type_was_removed_or_changed():
    recorded = json.loads(RECORDED.read_text())
    now = current_flags()
    missing = {c: sorted(set(f) - set(now.get(c, {}))) for c, f in recorded.items()}
    missing = {c: f for c, f in missing.items() if f}
    assert not missing, f"flags removed: {missing}"
    changed = {
        (c, flag): (default, now[c][flag])
        for c, f in recorded.items()
        for flag, default in f.items()
        if now[c][flag] != default
    }
    assert not changed, f"defaults changed (recorded, now): {changed}"


def test_the_check_notices_a_removed_flag():
    now = current_flags()
    assert "--epochs" in now["optimize"] and "-m" in now["train"]
    del now["optimize"]["--epochs"]
    assert set(json.loads(RECORDED.read_text())["optimize"]) - set(now["optimize"]) == {"--epochs"}


@pytest.mark.parametrize("path", [path for path, _ in commands()])
def test_help_of_every_command_renders(path):
    result = CliRunner().invoke(app, [*path.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "--help" in result.output


def test_every_command_summary_is_one_line():
    """`--help` lists a command by its docstring's first paragraph: one line, so the list reads
    as one sentence per command (details go after a blank line)."""
    wrapped = [
        path for path, cmd in commands() if "\n" in (cmd.help or "").strip().split("\n\n")[0]
    ]
    assert not wrapped, f"commands whose summary spans lines: {wrapped}"


def retyped_default(help_text: str, default: object) -> bool:
    """The help says the default's value next to the word "default" (typer shows the default
    itself, from the field: a help text that types it again drifts from it)."""
    value = rf"(?<![\w.]){re.escape(str(default))}(?![\w.])"
    near = rf"{value}[^.;]{{0,30}}\bdefault\b|\bdefault\b[^.;]{{0,12}}{value}"
    return re.search(near, help_text, re.I) is not None


def test_the_scan_finds_a_retyped_default():
    assert retyped_default("`lora` (peft adapter, default), `full` or `scratch`", "lora")
    assert retyped_default("Passes over the train split (default: 4).", 4)
    assert not retyped_default("Passes over the train split.", 4)
    assert not retyped_default("Model spec (default: the upstream the proxy logged).", "local")


def test_no_help_text_retypes_its_default():
    retyped = [
        (path, p.opts[0])
        for path, cmd in commands()
        for p in cmd.params
        if type(p).__name__.endswith("Option")
        and p.default not in (None, "", True, False)
        and retyped_default(p.help or "", p.default)
    ]
    assert not retyped, f"help texts that type their default again: {retyped}"
