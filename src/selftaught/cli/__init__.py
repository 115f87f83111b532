"""The `selftaught` command: parses arguments and wires library objects, one module per
command group. Defaults and help text come from the config dataclasses (`cli.options`)."""

from selftaught.cli import (  # noqa: F401  (registers)
    doctor,
    eval_serve,
    optimize,
    plugins,
    report,
    sleep,
    train,
)
from selftaught.cli.common import app, console, out

__all__ = ["app", "console", "main", "out"]


def main() -> None:  # pragma: no cover
    app()
