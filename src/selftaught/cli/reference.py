"""docs/cli-reference.md, written from the typer app itself: every command, its arguments and
options (default, environment variable, help: the configs' docstrings and defaults where the
options are generated from them), and the exit codes with the error classes that set each;
and the generated blocks of other pages (a night folder's layout in docs/sleep-home.md).

    python -m selftaught.cli.reference           # rewrite docs/cli-reference.md
    python -m selftaught.cli.reference --check   # exit 1 when the page differs (a test runs it)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from selftaught.errors import EXIT_CODES

SRC = Path(__file__).resolve().parents[1]
DOCS = SRC.parents[1] / "docs"
PAGE = DOCS / "cli-reference.md"

# `raise typer.Exit(N)` sites in cli/ (no exception class to name): function -> when.
# tests/test_docs_reference.py fails when cli/ gains or loses one.
DIRECT_EXITS: dict[tuple[str, int], str] = {
    ("eval_cmd", 1): "`eval`: every model call failed, no example was scored",
    ("_run_nights", 1): "`sleep run`: a night failed (its backend failed, or it crashed)",
    ("sleep_log_migrate_cmd", 1): "`sleep log migrate`: a row read back differs from the source",
    ("sleep_adopt_cmd", 1): "`sleep adopt`: a skill could not be placed (`--place`) or a file "
    "you changed since the night read it was not written back",
    ("sleep_rollback_cmd", 1): "`sleep rollback`: a file you changed, or one a symlink now "
    "leads to, was not restored or re-placed (`--place`)",
    ("optimize_cmd", 1): "`optimize --write-back`: the skill file changed since the run read "
    "it, so the best skill was not written back",
}

# What a code's class list alone would misstate.
NOTES: dict[int, str] = {
    0: "a night ran, whatever it concluded",
    5: "`BudgetTooSmall`: the budget ran out before the baseline was scored, nothing was learned "
    "(a budget that runs out later ends the run cleanly with the best so far, exit 0: "
    "`BudgetExhausted` is caught by the trainers)",
}


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(command path, click command): every command and group, depth first, sorted."""
    cmd = cmd if cmd is not None else typer.main.get_command(_app())
    yield " ".join(path), cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        if not getattr(sub, "hidden", False):
            yield from commands(sub, (*path, name))


def _app() -> Any:
    from selftaught.cli import app

    return app


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(p: Any) -> str:
    if p.required:
        return "required"
    value = p.default
    if callable(value):
        value = value()
    if value is None or (p.is_flag if hasattr(p, "is_flag") else False) and value is False:
        return "" if value is None else "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if str(value) != "" else '`""`'


def _names(p: Any) -> str:
    names = [*p.opts, *getattr(p, "secondary_opts", [])]
    return " / ".join(f"`{n}`" for n in names)


def command_section(path: str, cmd: Any) -> list[str]:
    ctx = cmd.context_class(cmd, info_name=f"selftaught {path}".strip())
    lines = [f"## `selftaught {path}`" if path else "## `selftaught`", ""]
    if cmd.help:
        lines += [cmd.help.strip(), ""]
    usage = f"{ctx.command_path} {' '.join(cmd.collect_usage_pieces(ctx))}".strip()
    lines += [f"Usage: `{usage}`", ""]
    args = [p for p in cmd.params if type(p).__name__.endswith("Argument")]
    opts = [p for p in cmd.params if type(p).__name__.endswith("Option")]
    if args:
        lines += ["| argument | help |", "|---|---|"]
        lines += [
            f"| `{(p.metavar or p.name or '').upper()}` | {_cell(getattr(p, 'help', '') or '')} |"
            for p in args
        ]
        lines.append("")
    panels: dict[str | None, list[Any]] = {}  # --help's panels (train, sleep run), in order
    for p in opts:
        panels.setdefault(getattr(p, "rich_help_panel", None), []).append(p)
    for panel, in_panel in panels.items():
        if len(panels) > 1:
            lines += [f"*{panel or 'Options'}*", ""]
        lines += ["| option | default | help |", "|---|---|---|"]
        for p in in_panel:
            help_text = _cell(p.help or "")
            if p.envvar:
                help_text += f" (env `{p.envvar}`)"
            lines.append(f"| {_names(p)} | {_cell(_default(p))} | {help_text} |")
        lines.append("")
    subs = sorted(getattr(cmd, "commands", {}).items())
    if subs:
        lines += ["| command | what it does |", "|---|---|"]
        prefix = f"selftaught {path}".strip()
        lines += [f"| `{prefix} {n}` | {_cell(c.get_short_help_str(200))} |" for n, c in subs]
        lines.append("")
    return lines


# ---- exit codes: read from the source, so a new error class is listed by itself ------------


def error_classes(src: Path = SRC) -> dict[str, int]:
    """Every exception class under `src` that descends from `SelftaughtError`, with its exit
    code (its own `exit_code = ...`, else its first base's that has one)."""
    bases: dict[str, list[str]] = {}
    own: dict[str, Any] = {}
    for file in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases[node.name] = [
                b.id if isinstance(b, ast.Name) else ast.unparse(b).split(".")[-1]
                for b in node.bases
            ]
            for stmt in node.body:
                target: ast.expr
                if isinstance(stmt, ast.AnnAssign):
                    target, value = stmt.target, stmt.value
                elif isinstance(stmt, ast.Assign) and stmt.targets:
                    target, value = stmt.targets[0], stmt.value
                else:
                    continue
                if isinstance(target, ast.Name) and target.id == "exit_code" and value is not None:
                    own[node.name] = value

    def code(name: str, seen: frozenset[str] = frozenset()) -> int | None:
        if name in seen or name not in bases:
            return None
        if name in own:
            value = own[name]
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                return value.value
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                return code(value.value.id, seen | {name})
        for base in bases[name]:
            found = code(base, seen | {name})
            if found is not None:
                return found
        return None

    def rooted(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "SelftaughtError":
            return True
        return name not in seen and any(rooted(b, seen | {name}) for b in bases.get(name, []))

    return {n: c for n in sorted(bases) if rooted(n) and (c := code(n)) is not None}


def direct_exits(src: Path = SRC / "cli") -> set[tuple[str, int]]:
    """(function, code) of every `raise typer.Exit(N)` in cli/ with a literal N."""
    found: set[tuple[str, int]] = set()
    for file in sorted(src.glob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                exc = node.exc if isinstance(node, ast.Raise) else None
                if (
                    isinstance(exc, ast.Call)
                    and ast.unparse(exc.func) == "typer.Exit"
                    and exc.args
                    and isinstance(exc.args[0], ast.Constant)
                    and isinstance(exc.args[0].value, int)
                ):
                    found.add((fn.name, exc.args[0].value))
    return found


def exit_code_section() -> list[str]:
    by_code: dict[int, list[str]] = {}
    for name, c in error_classes().items():
        by_code.setdefault(c, []).append(f"`{name}`")
    lines = [
        "## Exit codes",
        "",
        "Every error selftaught raises on purpose descends from `selftaught.errors."
        "SelftaughtError` and carries its exit code; the command prints one sentence and exits "
        "with it. Anything else is a bug and keeps its traceback. The classes below are read "
        "from the source.",
        "",
        "| code | meaning | raised as |",
        "|---|---|---|",
    ]
    for c, meaning in sorted(EXIT_CODES.items()):
        raised = ", ".join(by_code.get(c, []))
        direct = [why for (_, n), why in sorted(DIRECT_EXITS.items()) if n == c]
        if direct:
            raised += ("; " if raised else "") + "; ".join(direct)
        if c in NOTES:
            raised = f"{NOTES[c]}; raised as {raised}" if raised else NOTES[c]
        lines.append(f"| `{c}` | {meaning} | {raised} |")
    return [*lines, ""]


def render() -> str:
    lines = [
        "# CLI reference",
        "",
        "<!-- Written by `python -m selftaught.cli.reference` from the typer app; do not edit: "
        "tests/test_docs_reference.py fails when this page is stale. -->",
        "",
        "Every command and option, generated from the command line itself: the defaults and "
        "help of the options generated from the configs are the configs' own "
        "([commands](commands.md#options-come-from-the-configs)).",
        "",
    ]
    for path, cmd in commands():
        lines += command_section(path, cmd)
    lines += exit_code_section()
    return "\n".join(lines).rstrip() + "\n"


def with_block(text: str, name: str, body: str) -> str:
    """`text` with what lies between `<!-- generated:NAME -->` and its end marker replaced."""
    start, end = f"<!-- generated:{name} -->\n", f"<!-- /generated:{name} -->"
    head, rest = text.split(start, 1)
    return f"{head}{start}{body}{end}{rest.split(end, 1)[1]}"


def pages() -> dict[Path, str]:
    """Every generated page (or page with a generated block) and what it should hold."""
    from selftaught.sleep.adoption.staging import NIGHT_LAYOUT

    home = DOCS / "sleep-home.md"
    layout = f"<!-- not run: a folder's layout -->\n```text\n{NIGHT_LAYOUT.rstrip()}\n```\n"
    return {
        PAGE: render(),
        home: with_block(home.read_text(encoding="utf-8"), "night-layout", layout),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path, text in pages().items():
        if path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if "--check" not in argv:
            path.write_text(text, encoding="utf-8")
            print(path)
    if "--check" in argv and stale:
        names = ", ".join(str(p) for p in stale)
        print(f"stale: {names}; run python -m selftaught.cli.reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
