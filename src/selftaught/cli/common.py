"""What every command shares: the app, the consoles, the one error mapping, shared options
and the small builders that turn options into library objects."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.errors import InputError, SelftaughtError, read_text
from selftaught.gate import GateConfig
from selftaught.http_guard import DEFAULT_MAX_BODY_BYTES

app = typer.Typer(
    help="selftaught: LLM agents that improve themselves on their own tasks, safely.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
out = Console()
F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """The one place errors meet the user: any `SelftaughtError` becomes one sentence and the
    exit code of its kind (the table in `selftaught.errors`). Anything else is a bug and keeps
    its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SelftaughtError as err:
            # escaped: a message's brackets (pip install "selftaught[local]") are not markup
            console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)
            raise typer.Exit(err.exit_code) from None

    return wrapper  # type: ignore[return-value]


def read_text_file(path: Path | None, what: str) -> str:
    return "" if path is None else read_text(path, f"{what} file")


# Options shared by several commands.
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="Task spec; see `selftaught tasks`.")]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model spec: local | local:PATH | openai:NAME | http://HOST:PORT/v1#NAME | "
        "claude-code[:NAME] | codex[:NAME] | cmd:TEMPLATE (CLI agents: docs/agents-as-policy.md)",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="SELFTAUGHT_API_KEY", help="API key (else OPENAI_API_KEY)."),
]
SeedOpt = Annotated[int, typer.Option(help="Seed for task splits and sampling.")]
TrainSizeOpt = Annotated[int | None, typer.Option(help="Train split size (task default if unset).")]
ValSizeOpt = Annotated[int | None, typer.Option(help="Val split size (task default if unset).")]
TestSizeOpt = Annotated[int | None, typer.Option(help="Test split size (task default if unset).")]
DeviceOpt = Annotated[
    str | None,
    typer.Option(help="Local model device: cpu | cuda | cuda:N | mps (default: best available)."),
]
CacheOpt = Annotated[Path | None, typer.Option(help="SQLite cache of temperature-0 replies.")]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds per model call.")]
ReportToOpt = Annotated[
    str, typer.Option(help="Log the run to: none | trackio | mlflow | wandb (optional extras).")
]
# The one gate (selftaught.gate), the same options wherever something is gated.
GateMetricOpt = Annotated[str | None, typer.Option(help="Gate metric: hard | soft | mixed.")]
GateMarginOpt = Annotated[
    float,
    typer.Option(help="A new best must gain MORE than this many val items (0 = strict >)."),
]
GateConfidenceOpt = Annotated[
    float | None,
    typer.Option(help="Also require a one-sided paired test with p <= 1 - C (e.g. 0.9; 0: none)."),
]
# Budgets: every call counts (target, optimizer, judge, repairs, gate evaluations).
BudgetCallsOpt = Annotated[int | None, typer.Option(help="Stop cleanly after this many calls.")]
BudgetTokensOpt = Annotated[int | None, typer.Option(help="Stop cleanly after this many tokens.")]
BudgetUsdOpt = Annotated[
    float | None, typer.Option(help="Stop cleanly after this many USD (known prices only).")
]
BudgetRolesOpt = Annotated[
    str | None,
    typer.Option(help="Roles the budget counts, e.g. 'target' (GEPA's metric calls); default all."),
]


def gate_config(metric: str | None, margin: float, confidence: float | None) -> Any:

    try:
        return GateConfig(
            metric=metric or GateConfig.metric,  # type: ignore[arg-type]
            margin=margin,
            confidence=confidence or None,  # 0: no paired test
        )
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


def budget(
    calls: int | None, tokens: int | None, usd: float | None, roles: str | None = None
) -> Any:
    from selftaught.models.usage import Budget

    counted = tuple(r.strip() for r in roles.split(",") if r.strip()) if roles else None
    try:
        return Budget(calls=calls, tokens=tokens, usd=usd, roles=counted)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


def model_options(
    api_key: str | None = None,
    timeout: float | None = None,
    cache: Path | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """`load_model` keyword arguments for the options the user gave."""
    given = {"api_key": api_key, "timeout_s": timeout, "cache_path": cache, "device": device}
    return {k: v for k, v in given.items() if v is not None}


def task_options(
    seed: int,
    train_size: int | None = None,
    val_size: int | None = None,
    test_size: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """`load_task` keyword arguments (split sizes left unset keep each task's defaults)."""
    sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
    return {"seed": seed, **{k: v for k, v in {**sizes, **extra}.items() if v is not None}}


DEFAULT_MAX_BODY_MB = DEFAULT_MAX_BODY_BYTES / 2**20
MaxBodyOpt = Annotated[
    float,
    typer.Option(
        "--max-body-mb", min=0.001, help="Largest request body accepted, in MiB (larger: 413)."
    ),
]
UnsafeExecOpt = Annotated[
    bool,
    typer.Option(
        "--unsafe-exec",
        help="Where bubblewrap is missing, run model-written code with resource limits only "
        "(it can read your files and use the network); and allow the reasoning-gym tasks whose "
        "own scorers evaluate the answer as Python inside this selftaught process, unsandboxed "
        "even when bubblewrap is installed. Without this such tasks refuse.",
    ),
]


def warn_unsafe_exec(unsafe_exec: bool) -> None:
    if unsafe_exec:
        from selftaught.tasks.sandbox import UNSAFE_EXEC_WARNING

        console.print(f"[bold yellow]warning:[/] {UNSAFE_EXEC_WARNING}", soft_wrap=True)
