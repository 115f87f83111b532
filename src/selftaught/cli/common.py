"""What every command shares: the app, the consoles, the one error mapping, shared options
and the small builders that turn options into library objects."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.cli.options import config_option, field_help
from selftaught.errors import InputError, SelftaughtError, read_text
from selftaught.gate import GateConfig, Metric
from selftaught.http_guard import DEFAULT_MAX_BODY_BYTES
from selftaught.models import ModelOptions
from selftaught.models.usage import Budget
from selftaught.tasks.options import TaskOptions

# A lone surrogate: what Python makes of bytes that are not UTF-8 in argv or the environment
_NOT_TEXT = re.compile("[\ud800-\udfff]")


def undecodable_input(args: list[str], environ: Mapping[str, str]) -> str | None:
    """Why an argument, or a `SELFTAUGHT_*` variable, is not UTF-8 text (None: all are): every
    command reads them as text, and such a value would reach a file name, a log query or an
    SQL parameter as half a character."""
    for i, arg in enumerate(args):
        if _NOT_TEXT.search(arg):
            option, eq, _ = arg.partition("=")
            if arg.startswith("--") and eq:
                name = option
            elif i and args[i - 1].startswith("-"):
                name = args[i - 1]
            else:
                name = f"argument {i + 1}"
            return f"{name} is not UTF-8 text ({_shown(arg)}): give every argument as UTF-8"
    for key, value in environ.items():
        if key.startswith("SELFTAUGHT_") and _NOT_TEXT.search(value):
            return f"${key} is not UTF-8 text ({_shown(value)}): set it as UTF-8"
    return None


def _shown(value: str) -> str:
    """A value that is not text, as the bytes it came from (`\\xff`) where it can be."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode()[:80]
    return repr(raw)[2:-1][:80]


class _Commands(TyperGroup):
    """The root command: refuses, before any command runs, arguments that are not text."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click Context
        problem = undecodable_input(args, os.environ)
        if problem is not None:
            console.print(f"[bold red]error:[/] {escape(problem)}", soft_wrap=True)
            raise typer.Exit(InputError.exit_code)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except SelftaughtError as err:  # raised while a command's options were read (--config)
            fail(err)


app = typer.Typer(
    cls=_Commands,
    help="selftaught: LLM agents that improve themselves on their own tasks, safely.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
out = Console()
F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """The one place errors meet the user: any `SelftaughtError` becomes one sentence, redacted
    (a server's message may quote a key), and the exit code of its kind (the table in
    `selftaught.errors`). Anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SelftaughtError as err:
            fail(err)

    return cast(F, wrapper)


def fail(err: SelftaughtError) -> NoReturn:
    """The error as one sentence, and the exit code of its kind."""
    # escaped: a message's brackets (pip install "selftaught[local]") are not markup
    console.print(f"[bold red]error:[/] {escape(_redacted(err))}", soft_wrap=True)
    raise typer.Exit(err.exit_code) from None


def _redacted(err: Exception) -> str:
    """An error's message as it may be shown: redacted, else (the redaction patterns file is
    what is wrong) with the keys given cut."""
    from selftaught.given_keys import scrub_secrets
    from selftaught.redact import redact_for_model

    try:
        return redact_for_model(str(err))
    except SelftaughtError:
        return scrub_secrets(str(err))[0]


def read_text_file(path: Path | None, what: str) -> str:
    return "" if path is None else read_text(path, f"{what} file")


def read_skill(path: Path | None) -> str:
    """`--skill PATH`: a file's text, or a skill package (a folder holding SKILL.md, with its
    `scripts/` and `references/`) as one text (`selftaught.skill_package`)."""
    from selftaught.skill_package import read_package

    if path is not None and path.is_dir():
        return read_package(path)
    return read_text_file(path, "skill")


# Options shared by several commands.
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="Task spec; see `selftaught tasks`.")]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model spec: local | local:PATH | openai:NAME | anthropic:NAME | gemini:NAME | "
        "http://HOST:PORT/v1#NAME | claude-code[:NAME] | codex[:NAME] | cmd:TEMPLATE (CLI "
        "agents: docs/agents-as-policy.md)",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="SELFTAUGHT_API_KEY",
        help="API key for the command's models, all of one vendor or endpoint (else each "
        "vendor's own: OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY).",
    ),
]
# Generated from the configs (each option's help is its field's docstring, its default the
# field's): the one gate (selftaught.gate), budgets (every call counts: target, optimizer,
# judge, repairs, gate evaluations) and how a task spec is loaded. Field -> option name.
GATE_FLAGS = {
    "metric": "gate_metric",
    "margin": "gate_margin",
    "confidence": "gate_confidence",
    "tag_alpha": "gate_tag_alpha",
    "tag_margin": "gate_tag_margin",
    "min_gain": "min_gain",
}
BUDGET_FLAGS = {
    "calls": "budget_calls",
    "tokens": "budget_tokens",
    "usd": "budget_usd",
    "roles": "budget_roles",
}
TASK_FLAGS = tuple(f.name for f in dataclasses.fields(TaskOptions))
# optimize and train take --val-size as a number or `auto` (ValSizeOpt, `val_size`)
SIZED_TASK_FLAGS = tuple(f for f in TASK_FLAGS if f != "val_size")
ValSizeOpt = Annotated[
    str | None,
    typer.Option(
        "--val-size",
        help=field_help(TaskOptions, "val_size")
        + " Or auto: the fewest val items on which the gate could accept --min-gain, refused "
        "when --budget-calls cannot score the starting skill and one candidate on them.",
    ),
]
STOP_FLAGS = ("max_minutes", "patience")  # selftaught.stops.Stops: optimize, train, sleep run
# The same options one by one, for commands that declare them so (sleep run).
SeedOpt = config_option(TaskOptions, "seed")
GateMetricOpt = config_option(GateConfig, "metric", optional=True)
GateMarginOpt = config_option(GateConfig, "margin")
GateConfidenceOpt = config_option(GateConfig, "confidence")
GateTagAlphaOpt = config_option(GateConfig, "tag_alpha", optional=True)
GateTagMarginOpt = config_option(GateConfig, "tag_margin", optional=True)
NightTagAlphaOpt = config_option(  # a night's veto is on, on every kind of request
    GateConfig,
    "tag_alpha",
    help_suffix="In a night each kind of request is its own tag "
    "(docs/sleep-mixed-traffic.md); 0: off.",
)
MinGainOpt = config_option(GateConfig, "min_gain", optional=True)
ObjectiveOpt = config_option(GateConfig, "objective", optional=True)
BudgetCallsOpt = config_option(Budget, "calls")
BudgetTokensOpt = config_option(Budget, "tokens")
BudgetUsdOpt = config_option(Budget, "usd")
DeviceOpt = Annotated[
    str | None,
    typer.Option(help="Local model device: cpu | cuda | cuda:N | mps (default: best available)."),
]
CacheOpt = Annotated[Path | None, typer.Option(help="SQLite cache of temperature-0 replies.")]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds per model call.")]


def gate_config(
    metric: str | None, margin: float, confidence: float | None, **rest: Any
) -> GateConfig:
    """The gate the options describe (metric unset: the default; confidence 0: no test; an
    option left unset whose field has a default, e.g. `--objective`, keeps that default)."""
    from selftaught.cli.options import field_default

    given = {k: v for k, v in rest.items() if v is not None or field_default(GateConfig, k) is None}
    try:
        return GateConfig(
            metric=cast(Metric, metric or GateConfig.metric),  # GateConfig checks it
            margin=margin,
            confidence=confidence or None,  # 0: no paired test
            **given,
        )
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


def resolve_val_size(given: str | None, gate: GateConfig, spend: Budget) -> int | None:
    """`--val-size`: unset, a number of items, or `auto` (`gate.auto_val_size`: the fewest
    items on which the gate could accept `--min-gain`, within the target's call budget)."""
    from selftaught.gate import auto_val_size

    if given is None:
        return None
    if given.strip().lower() == "auto":
        calls = spend.calls if spend.roles is None or "target" in spend.roles else None
        n = auto_val_size(gate, calls)
        console.print(
            f"--val-size auto: {n} val items, the fewest on which the gate could accept a gain "
            f"of {gate.min_gain:g}",
            soft_wrap=True,
        )
        return n
    try:
        n = int(given)
    except ValueError:
        raise typer.BadParameter(
            f"--val-size takes a number of items or auto, got {given!r}"
        ) from None
    if n < 0:
        raise typer.BadParameter(f"--val-size must be >= 0, got {n}")
    return n


def budget(
    calls: int | None,
    tokens: int | None,
    usd: float | None = None,
    roles: str | tuple[str, ...] | None = None,
) -> Budget:
    """The budget the options describe (`roles` comma-separated or a tuple; unset: all)."""
    if isinstance(roles, str):
        roles = tuple(r.strip() for r in roles.split(",") if r.strip())
    try:
        return Budget(calls=calls, tokens=tokens, usd=usd, roles=roles or None)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


def model_options(
    api_key: str | None = None,
    timeout: float | None = None,
    cache: Path | None = None,
    device: str | None = None,
    *,
    models: tuple[object, ...] = (),
) -> ModelOptions:
    """`load_model` keyword arguments for the options the user gave; `models`: every model the
    command loads with them, its task's judge included (a key that would reach two vendors is
    refused)."""
    options = ModelOptions()
    if api_key is not None:
        from selftaught.models.spec import check_one_key_destination

        check_one_key_destination(models)
        options["api_key"] = api_key
    if timeout is not None:
        options["timeout_s"] = timeout
    if cache is not None:
        options["cache_path"] = cache
    if device is not None:
        options["device"] = device
    return options


DEFAULT_MAX_BODY_MB = DEFAULT_MAX_BODY_BYTES / 2**20
MaxBodyOpt = Annotated[
    float,
    typer.Option(
        "--max-body-mb", min=0.001, help="Largest request body accepted, in MiB (larger: 413)."
    ),
]


def warn_unsafe_exec(unsafe_exec: bool) -> None:
    if unsafe_exec:
        from selftaught.tasks.sandbox import UNSAFE_EXEC_WARNING

        console.print(f"[bold yellow]warning:[/] {UNSAFE_EXEC_WARNING}", soft_wrap=True)
