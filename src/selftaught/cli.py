"""The `selftaught` command: parses arguments and wires library objects. No logic lives here."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    help="selftaught: LLM agents that improve themselves on their own tasks, safely.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)

# ---- tasks / eval / serve (foundation) ------------------------------------------------

# ---- optimize (skill optimization, text space) ----------------------------------------

# ---- train (weight space) -------------------------------------------------------------


def main() -> None:  # pragma: no cover
    app()
