"""The `selftaught` command: parses arguments and wires library objects. No logic lives here."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.errors import ConfigError, InputError, SelftaughtError, read_text
from selftaught.gate import GateConfig
from selftaught.models.base import GenerationParams
from selftaught.skill.config import SkillOptConfig
from selftaught.weights.config import (
    BackendConfig,
    RestConfig,
    RLConfig,
    SFTTrainConfig,
    check_method_options,
)

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
            console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
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
        help="Model spec: local | local:PATH | openai:NAME | http://HOST:PORT/v1#NAME",
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
    from selftaught.gate import GateConfig

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


# ---- tasks / eval / serve (foundation) ------------------------------------------------


@app.command("tasks")
def tasks_cmd(
    gym: Annotated[
        bool, typer.Option("--gym", help="Also list every reasoning-gym generator.")
    ] = False,
) -> None:
    """List the built-in tasks (and, with --gym, all reasoning-gym generators)."""
    from selftaught.tasks.gym import gym_generators
    from selftaught.tasks.registry import BUILTIN_TASKS, TASK_FORMS

    table = Table(title="built-in tasks")
    table.add_column("task")
    table.add_column("what")
    for name, what in BUILTIN_TASKS.items():
        table.add_row(name, what)
    out.print(table)
    out.print("task spec forms: " + "; ".join(TASK_FORMS))
    gens = gym_generators()
    if gym:
        out.print(f"reasoning-gym generators ({len(gens)}): " + ", ".join(gens))
    else:
        out.print(f"{len(gens)} reasoning-gym generators: use gym:NAME (list them with --gym)")


@app.command("eval")
@friendly_errors
def eval_cmd(
    task: TaskOpt,
    model: ModelOpt = "local",
    skill: Annotated[Path | None, typer.Option(help="Skill document (system prompt).")] = None,
    memory: Annotated[Path | None, typer.Option(help="Memory document.")] = None,
    split: Annotated[str, typer.Option(help="train | val | test")] = "test",
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N examples.")] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Per-example JSONL (default runs/eval/<task>-<split>.jsonl)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Concurrent requests.")] = 8,
    max_tokens: Annotated[
        int, typer.Option(help="Reply length cap (truncation is reported).")
    ] = GenerationParams.max_tokens,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature (0 = greedy).")
    ] = GenerationParams.temperature,
    timeout: TimeoutOpt = 120.0,
    cache: CacheOpt = None,
    scorer: Annotated[str | None, typer.Option(help="Scorer for JSONL tasks.")] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Judge model spec for the llm_judge scorer.")
    ] = None,
    rubric: Annotated[
        Path | None, typer.Option(help="Rubric file for the llm_judge scorer.")
    ] = None,
    seed: SeedOpt = 0,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
    unsafe_exec: UnsafeExecOpt = False,
) -> None:
    """Score a model (+ skill) on a task split: hard/soft accuracy with 95% CIs, tokens used."""
    from selftaught.api import evaluate
    from selftaught.rollout import RolloutConfig
    from selftaught.runs import slug

    if split not in ("train", "val", "test"):
        raise typer.BadParameter(f"--split must be train, val or test, not {split!r}")
    warn_unsafe_exec(unsafe_exec)
    options = task_options(
        seed,
        train_size,
        val_size,
        test_size,
        scorer=scorer,
        rubric=read_text_file(rubric, "rubric") or None,
        unsafe_exec=unsafe_exec,
    )
    task_name = task  # for the default output path; the task object names itself below
    path = output or Path("runs") / "eval" / f"{slug(task_name)}-{split}.jsonl"
    result = evaluate(
        task,
        model,
        skill=read_text_file(skill, "skill"),
        memory=read_text_file(memory, "memory"),
        split=split,  # type: ignore[arg-type]
        limit=limit,
        rollout=RolloutConfig(
            concurrency=concurrency,
            timeout_s=timeout * 10,
            params=GenerationParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
            description=f"eval {task} [{split}]",
        ),
        judge_model=judge_model,
        task_options=options,
        model_options=model_options(api_key, timeout, cache, device),
        output=path,
    )
    print_eval(result)
    out.print(f"per-example results: {path}")
    if result.n == 0:
        console.print("[bold red]error:[/] every call failed; no example was scored")
        raise typer.Exit(1)


def print_eval(result: Any) -> None:
    table = Table(title=f"{result.task} [{result.split}] with {result.model}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("examples scored", str(result.n))
    table.add_row(
        "hard accuracy",
        f"{result.hard:.3f}  (95% CI {result.hard_ci[0]:.3f}-{result.hard_ci[1]:.3f})",
    )
    table.add_row(
        "soft score", f"{result.soft:.3f}  (95% CI {result.soft_ci[0]:.3f}-{result.soft_ci[1]:.3f})"
    )
    table.add_row("tokens in / out", f"{result.prompt_tokens} / {result.completion_tokens}")
    table.add_row("truncated replies", str(result.truncated))
    table.add_row("errors (not scored)", str(result.n_errors))
    table.add_row("  of which scorer errors", str(result.n_scorer_errors))
    table.add_row("retries", str(result.retries))
    episodes = [r for r in result.rollouts if r.is_episode]
    if episodes:  # tasks with tools
        n = len(episodes)
        turns, calls = sum(r.turns for r in episodes), sum(r.tool_calls for r in episodes)
        table.add_row("turns / tool calls per episode", f"{turns / n:.2f} / {calls / n:.2f}")
        table.add_row("episodes that called a tool", str(sum(r.tool_calls > 0 for r in episodes)))
        table.add_row("failed tool calls", str(sum(r.tool_errors for r in episodes)))
        table.add_row(
            "  tool errors (not scored)", str(sum(r.error_source == "tool" for r in episodes))
        )
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    for role, u in result.usage.items():
        if role != "target":
            table.add_row(
                f"{role} calls / tokens",
                f"{u['calls']} / {u['prompt_tokens'] + u['completion_tokens']}",
            )
    out.print(table)


@app.command("serve")
@friendly_errors
def serve_cmd(
    model: ModelOpt = "local",
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    name: Annotated[
        str | None, typer.Option(help="Model name clients use (default: the model's name).")
    ] = None,
    max_batch_size: Annotated[int, typer.Option(help="Requests batched into one generate.")] = 8,
    allow_remote: Annotated[
        bool,
        typer.Option(help="Allow binding a non-loopback interface and any Host / Origin header."),
    ] = False,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
    max_body_mb: MaxBodyOpt = 4.0,
) -> None:
    """Serve a model behind an OpenAI-compatible HTTP endpoint (POST /v1/chat/completions)."""
    from selftaught.models import load_model
    from selftaught.serve import check_host, run_server

    try:  # before loading the model: a refused host should cost nothing
        check_host(host, allow_remote)
    except InputError as err:
        raise typer.BadParameter(str(err), param_hint="--host") from None
    the_model = load_model(
        model, max_batch_size=max_batch_size, **model_options(api_key, device=device)
    )
    served = name or the_model.name.split(":")[-1]
    console.print(
        f"serving [bold]{served}[/] at http://{host}:{port}/v1 "
        f"(use --model http://{host}:{port}/v1#{served})"
    )
    run_server(
        the_model,
        served,
        host=host,
        port=port,
        allow_remote=allow_remote,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    )


# ---- sleep, part 1: the proxy and the task log ----------------------------------------

sleep_app = typer.Typer(
    help="Sleep: learn from the deployed agent's real traffic (the task log and its inputs).",
    no_args_is_help=True,
)
app.add_typer(sleep_app, name="sleep")
LogOpt = Annotated[
    Path | None,
    typer.Option("--log", help="Task log (default $SELFTAUGHT_LOG or <home>/log.db)."),
]
ProjectOpt = Annotated[str, typer.Option(help="Project the interactions belong to.")]


@app.command("proxy")
@friendly_errors
def proxy_cmd(
    upstream: Annotated[
        str, typer.Option(help="Model spec to forward to: http://HOST:PORT/v1#M | openai:M | local")
    ],
    project: ProjectOpt = "default",
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8080,
    require_key: Annotated[
        str | None,
        typer.Option(envvar="SELFTAUGHT_PROXY_KEY", help="Clients must send this bearer key."),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(help="Allow binding a non-loopback interface and any Host / Origin header."),
    ] = False,
    log: LogOpt = None,
    api_key: ApiKeyOpt = None,
    inject: Annotated[bool, typer.Option(help="Inject the adopted skill and memory.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds per upstream request.")] = 600.0,
    max_body_mb: MaxBodyOpt = 4.0,
) -> None:
    """OpenAI-compatible proxy: injects the adopted skill, logs every exchange (redacted)."""
    from selftaught.http_guard import strip_credentials
    from selftaught.serve import check_host
    from selftaught.sleep.intake.proxy import ProxyConfig, run_proxy

    try:
        check_host(host, allow_remote)
    except InputError as err:
        raise typer.BadParameter(str(err), param_hint="--host") from None
    config = ProxyConfig(
        upstream=upstream,
        project=project,
        host=host,
        port=port,
        require_key=require_key,
        allow_remote=allow_remote,
        log_path=log,
        api_key=api_key,
        timeout_s=timeout,
        inject=inject,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    )
    console.print(
        f"proxy for {strip_credentials(upstream)} at http://{host}:{port}/v1 (project {project})"
    )
    run_proxy(config)


@sleep_app.command("log")
@friendly_errors
def sleep_log_cmd(
    log: LogOpt = None,
    project: Annotated[str | None, typer.Option(help="Only this project.")] = None,
    source: Annotated[
        str | None, typer.Option(help="proxy | api | import | claude-code | codex")
    ] = None,
    since: Annotated[str | None, typer.Option(help="From (ISO time or 12h, 7d ago).")] = None,
    until: Annotated[str | None, typer.Option(help="Until (ISO time or 12h, 7d ago).")] = None,
    feedback: Annotated[
        bool | None, typer.Option("--feedback/--no-feedback", help="With / without feedback.")
    ] = None,
    errors: Annotated[
        bool | None, typer.Option("--errors/--tasks", help="Failed calls / tasks only.")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="Only rows with this tag.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most N rows (newest first).")] = 20,
    export: Annotated[
        Path | None, typer.Option(help="Write the rows as JSONL to this file.")
    ] = None,
) -> None:
    """List, filter or export the task log."""
    from selftaught.sleep.intake.log import LogFilter, TaskLog, parse_time

    flt = LogFilter(
        project=project,
        source=source,
        tag=tag,
        has_feedback=feedback,
        errors=errors,
        since=parse_time(since) if since else None,
        until=parse_time(until) if until else None,
        limit=None if export else limit,
    )
    task_log = TaskLog(log)
    if export:
        n = task_log.export_jsonl(export, flt)
        console.print(f"exported {n} interactions to {export}")
        return
    table = Table(title=f"task log {task_log.path} ({task_log.count(flt)} rows match)")
    for column in (
        "id",
        "time",
        "project",
        "source",
        "model",
        "request",
        "reply",
        "feedback",
        "notes",
    ):
        table.add_column(column, overflow="fold")
    for it in task_log.query(flt):
        fb = it.feedback
        notes = [f"error {it.error_status or ''}".strip()] if it.error else []
        notes += ["private"] * it.private + [f"{it.redactions} redacted"] * bool(it.redactions)
        notes += [f"skill v{it.skill_version}"] * bool(it.skill_version)
        table.add_row(
            it.id[:8],
            datetime.fromtimestamp(it.created_at).strftime("%Y-%m-%d %H:%M:%S"),
            it.project,
            it.source,
            it.model or "",
            it.prompt_head(40),
            " ".join((it.reply or it.error or "").split())[:40],
            " ".join(
                x
                for x in (
                    fb.thumb,
                    None if fb.score is None else f"{fb.score:g}",
                    "ref" if fb.reference is not None else None,
                )
                if x
            ),
            ", ".join(notes),
        )
    out.print(table)


@sleep_app.command("import")
@friendly_errors
def sleep_import_cmd(
    file: Annotated[Path, typer.Argument(help="JSONL: our export, OpenAI chat or OpenAI evals.")],
    project: Annotated[str | None, typer.Option(help="Put every row in this project.")] = None,
    log: LogOpt = None,
) -> None:
    """Import interactions from a JSONL file (all lines or none)."""
    from selftaught.sleep.intake.harvest.import_jsonl import import_file
    from selftaught.sleep.intake.log import TaskLog

    result = import_file(file, TaskLog(log), project)
    formats = ", ".join(f"{n} {fmt}" for fmt, n in result.formats.items())
    out.print(
        f"imported {result.inserted} new of {result.read} ({formats}); "
        f"{result.duplicates} were already in the log"
    )


@sleep_app.command("feedback")
@friendly_errors
def sleep_feedback_cmd(
    interaction_id: Annotated[str, typer.Argument(help="Interaction id (or its first 8+ chars).")],
    thumbs: Annotated[str | None, typer.Option(help="up | down")] = None,
    score: Annotated[float | None, typer.Option(help="A score, e.g. 0..1.")] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="The correct answer; for a request with tools, a corrected tool call as JSON "
            '({"name": ..., "arguments": {...}}) also.'
        ),
    ] = None,
    comment: Annotated[str | None, typer.Option(help="A comment.")] = None,
    log: LogOpt = None,
) -> None:
    """Attach feedback to a logged interaction."""
    from selftaught.sleep.intake.log import Feedback, TaskLog

    fb = Feedback(thumb=thumbs, score=score, reference=reference, comment=comment)  # type: ignore[arg-type]
    out.print(f"feedback attached to {TaskLog(log).add_feedback(interaction_id, fb)}")


@sleep_app.command("harvest")
@friendly_errors
def sleep_harvest_cmd(
    source: Annotated[str, typer.Option(help="auto | claude-code | codex")] = "auto",
    since: Annotated[
        str | None, typer.Option(help="From (ISO time or 7d ago); overrides --lookback-days.")
    ] = None,
    lookback_days: Annotated[float, typer.Option(help="Window when --since is not given.")] = 7.0,
    max_sessions: Annotated[int, typer.Option(help="Sessions read per run (newest first).")] = 50,
    max_tasks: Annotated[int, typer.Option(help="Interactions stored per run.")] = 500,
    project: Annotated[
        str | None,
        typer.Option(help="Put every row in this project (default: from the session's folder)."),
    ] = None,
    root: Annotated[
        Path | None, typer.Option(help="Transcript folder (one --source only).")
    ] = None,
    log: LogOpt = None,
) -> None:
    """Harvest coding-agent transcripts (Claude Code, Codex) into the log as private rows."""
    from selftaught.sleep.intake.harvest import HarvestConfig, harvest, resolve_sources
    from selftaught.sleep.intake.log import TaskLog, parse_time

    config = HarvestConfig(
        since=parse_time(since) if since else None,
        lookback_days=lookback_days,
        max_sessions=max_sessions,
        max_tasks=max_tasks,
        project=project,
    )
    sources = resolve_sources(source)
    if root and source == "auto":
        raise ConfigError("--root needs one --source (claude-code or codex), not auto")
    if not sources:
        console.print("no transcripts found (~/.claude/projects, ~/.codex/sessions)")
        return
    task_log = TaskLog(log)
    for name in sources:
        r = harvest(name, task_log, config, root)
        capped = f", stopped at {r.capped}" if r.capped else ""
        out.print(
            f"{name} ({r.root}): {r.sessions_read} sessions read, {r.found} interactions "
            f"in the window, {r.inserted} new{capped}"
        )
        for bad in r.malformed[:5]:
            console.print(f"  skipped malformed line {bad}")


# ---- sleep, part 2: the nightly cycle ---------------------------------------------------
# Exit codes: 0 the night ran (a proposal staged or not, the report says why), 1 its backend
# failed, 2 bad input, 3 another night is running.
NightProjectOpt = Annotated[
    str | None, typer.Option("--project", help="One project (default: every project with traffic).")
]
AdoptProjectOpt = Annotated[str, typer.Option("--project", help="Project.")]
TargetSkillOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--target-skill-path", help="Also write the adopted skill to this file (e.g. AGENTS.md)."
    ),
]


def _preferences(value: str | None) -> str:
    """--preferences: a file's text when the value names a file, else the text itself."""
    if value and Path(value).expanduser().is_file():
        return read_text(Path(value).expanduser(), "preferences file")
    return value or ""


@sleep_app.command("run")
@friendly_errors
def sleep_run_cmd(
    project: NightProjectOpt = None,
    model: Annotated[
        str | None, typer.Option(help="Target model spec (default: the upstream the proxy logged).")
    ] = None,
    optimizer_model: Annotated[str | None, typer.Option(help="Analyst model spec.")] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Judge for tasks without a reference (rubrics).")
    ] = None,
    log: LogOpt = None,
    since: Annotated[
        str | None, typer.Option(help="Read from here (ISO time or 2d ago), not the last night.")
    ] = None,
    lookback_days: Annotated[float, typer.Option(help="A first night reads this far back.")] = 7.0,
    max_tasks: Annotated[int, typer.Option(help="Interactions read per project.")] = 200,
    max_sessions: Annotated[int, typer.Option(help="Transcript sessions read per project.")] = 50,
    gate: Annotated[str, typer.Option(help="on | off (off: accept greedily, reported).")] = "on",
    gate_metric: GateMetricOpt = None,
    gate_margin: GateMarginOpt = GateConfig.margin,
    gate_confidence: GateConfidenceOpt = None,
    rollouts_k: Annotated[int, typer.Option(help="Attempts per train task (K > 1: contrast).")] = 1,
    preferences: Annotated[
        str | None, typer.Option(help="House rules for the analyst: text, or a file holding it.")
    ] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the night's train tasks.")] = 1,
    batch_size: Annotated[int, typer.Option(help="Train tasks per step.")] = 16,
    documents: Annotated[str, typer.Option(help="What to train, in order.")] = "skill,memory",
    val_fraction: Annotated[float, typer.Option(help="Share of tasks that gate.")] = 0.3,
    test_fraction: Annotated[float, typer.Option(help="Share held out from the gate.")] = 0.0,
    min_val: Annotated[int, typer.Option(help="Fewer val tasks: nothing is staged.")] = 4,
    recall_max: Annotated[
        int, typer.Option(help="Past tasks recalled across nights, splits fixed (0: off).")
    ] = 200,
    demos_max: Annotated[
        int, typer.Option(help="Most demonstrations in a static block (0: rules only).")
    ] = SkillOptConfig.demos_max,
    retrieval: Annotated[
        str,
        typer.Option(help="Try retrieved demos per request: auto | on | off (bm25s extra)."),
    ] = "auto",
    retrieve_k: Annotated[int, typer.Option(help="Demos retrieved per request.")] = 4,
    weights: Annotated[
        str, typer.Option(help="Also train a LoRA adapter (local target): off | sft | dpo | auto.")
    ] = "off",
    weight_max_steps: Annotated[int, typer.Option(help="Adapter training steps at most.")] = 16,
    weight_max_seconds: Annotated[
        float, typer.Option(help="Adapter training wall-clock seconds at most.")
    ] = 300.0,
    concurrency: Annotated[int, typer.Option(help="Parallel replay workers.")] = (
        SkillOptConfig.concurrency
    ),
    max_tokens: Annotated[int, typer.Option(help="Replay reply length cap.")] = (
        SkillOptConfig.max_tokens
    ),
    budget_calls: BudgetCallsOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    budget_usd: BudgetUsdOpt = None,
    auto_adopt: Annotated[bool, typer.Option(help="Adopt at once when the gate accepted.")] = False,
    target_skill_path: TargetSkillOpt = None,
    allow_remote: Annotated[
        bool, typer.Option(help="Send private (harvested) rows to remote models too.")
    ] = False,
    seed: SeedOpt = 0,
    timeout: TimeoutOpt = 120.0,
    api_key: ApiKeyOpt = None,
    dry_run: Annotated[bool, typer.Option(hidden=True)] = False,
    report_to: ReportToOpt = "none",
) -> None:
    """One night: harvest the log → mine tasks → split → consolidate skill, then memory → stage
    a proposal (`sleep adopt` makes it live). `sleep dry-run` does it all and stages nothing."""
    from selftaught.sleep.intake.log import parse_time
    from selftaught.sleep.night.cycle import SleepConfig, run_night
    from selftaught.sleep.night.demo_modes import DemoModeConfig
    from selftaught.sleep.night.split import SplitConfig
    from selftaught.sleep.night.summary import print_outcomes
    from selftaught.sleep.night.weight_night import WeightNightConfig

    if gate not in ("on", "off"):
        raise typer.BadParameter(f"--gate must be on or off, not {gate!r}")
    gate_cfg = gate_config(gate_metric, gate_margin, gate_confidence)
    config = SleepConfig(
        model=model,
        optimizer_model=optimizer_model,
        judge_model=judge_model,
        project=project,
        log_path=log,
        since=parse_time(since) if since else None,
        lookback_days=lookback_days,
        max_tasks=max_tasks,
        max_sessions=max_sessions,
        documents=tuple(d.strip() for d in documents.split(",") if d.strip()),
        allow_remote=allow_remote,
        auto_adopt=auto_adopt and not dry_run,
        target_skill_paths=tuple(target_skill_path or ()),
        training=SkillOptConfig(
            epochs=epochs,
            batch_size=batch_size,
            rollouts_k=rollouts_k,
            preferences=_preferences(preferences),
            gate=dataclasses.replace(gate_cfg, accept_all=gate == "off"),
            budget=budget(budget_calls, budget_tokens, budget_usd),
            concurrency=concurrency,
            max_tokens=max_tokens,
            seed=seed,
            timeout_s=timeout * 10,
            demos_max=demos_max,
        ),
        split=SplitConfig(val_fraction, test_fraction, min_val=min_val, seed=seed),
        demo_modes=DemoModeConfig(retrieval, retrieve_k),
        recall_max=recall_max,
        weights=weights,
        weight_training=WeightNightConfig(
            max_steps=weight_max_steps, max_seconds=weight_max_seconds, seed=seed
        ),
        model_options=model_options(api_key, timeout),
        progress=console.is_terminal,
        report_to=report_to,
    )
    outcomes = run_night(config, dry_run=dry_run, console=console)  # Busy: exit 3
    print_outcomes(outcomes, out, dry_run=dry_run)
    if any(o.failed for o in outcomes):
        raise typer.Exit(1)


def _dry_run_signature(fn: F) -> F:
    """`sleep dry-run` is `sleep run` with --dry-run set: the same options, nothing staged."""
    import inspect

    sig = inspect.signature(fn, eval_str=True)  # typer reads the Annotated options from it
    params = [
        p.replace(default=True) if p.name == "dry_run" else p for p in sig.parameters.values()
    ]

    @functools.wraps(fn)
    def dry(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    dry.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    dry.__doc__ = "Everything `sleep run` does, staging nothing: prints the report, keeps no trace."
    return dry  # type: ignore[return-value]


sleep_app.command("dry-run")(_dry_run_signature(sleep_run_cmd))


@sleep_app.command("adopt")
@friendly_errors
def sleep_adopt_cmd(
    night: Annotated[
        str | None, typer.Argument(help="Night id (default: the latest staged).")
    ] = None,
    project: AdoptProjectOpt = "default",
    force: Annotated[
        bool, typer.Option(help="Adopt over a version it was not gated against.")
    ] = False,
    target_skill_path: TargetSkillOpt = None,
) -> None:
    """Make a night's proposal the adopted skill and memory (atomically, with a backup)."""
    from selftaught.sleep.adoption.staging import adopt

    done = adopt(project, night, force=force, target_paths=tuple(target_skill_path or ()))
    out.print(
        f"{project}: adopted night {done.night} as version {done.version} (was {done.previous}; "
        f"backup {done.backup})" + "".join(f"\n  wrote {p}" for p in done.live_files)
    )


@sleep_app.command("rollback")
@friendly_errors
def sleep_rollback_cmd(
    version: Annotated[
        int | None, typer.Argument(help="Version (default: the previous one).")
    ] = None,
    project: AdoptProjectOpt = "default",
    target_skill_path: TargetSkillOpt = None,
) -> None:
    """Return to an earlier adopted version (0: nothing adopted)."""
    from selftaught.sleep.adoption.staging import rollback

    done = rollback(project, version, target_paths=tuple(target_skill_path or ()))
    out.print(f"{project}: version {done.version} is adopted again (was {done.previous})")


@sleep_app.command("history")
@friendly_errors
def sleep_history_cmd(project: AdoptProjectOpt = "default") -> None:
    """Adopted versions with their val scores, and the project's nights."""
    from selftaught.sleep.night.summary import history_tables

    for table in history_tables(project):
        out.print(table)


@sleep_app.command("status")
@friendly_errors
def sleep_status_cmd(project: NightProjectOpt = None) -> None:
    """The last night, a staged proposal, the adopted version, a running night, the schedule."""
    from selftaught.sleep.night.summary import status_lines

    for line in status_lines(project):
        out.print(line, soft_wrap=True, markup=False)


@sleep_app.command(
    "schedule", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
@friendly_errors
def sleep_schedule_cmd(
    ctx: typer.Context,
    at: Annotated[str, typer.Option(help="HH:MM, every day (local time).")],
    project: NightProjectOpt = None,
) -> None:
    """Run `sleep run` every night from your crontab; options after --at go to `sleep run`."""
    from selftaught.sleep.cron import schedule
    from selftaught.sleep.paths import sleep_home

    sleep_run_cmd_click = typer.main.get_command(sleep_app).commands["run"]  # type: ignore[attr-defined]
    sleep_run_cmd_click.make_context("run", list(ctx.args), resilient_parsing=False)
    entry = schedule(at, project, list(ctx.args), sleep_home())
    out.print(f"scheduled every day at {entry.hour:02d}:{entry.minute:02d}: {entry.command}")


@sleep_app.command("unschedule")
@friendly_errors
def sleep_unschedule_cmd(
    project: NightProjectOpt = None,
    every: Annotated[bool, typer.Option("--all", help="Every selftaught line.")] = False,
) -> None:
    """Remove the nightly line from your crontab."""
    from selftaught.sleep.cron import unschedule

    out.print(f"removed {unschedule(project, every)} scheduled night(s)")


# ---- optimize (skill optimization, text space) ----------------------------------------


@app.command("optimize")
@friendly_errors
def optimize_cmd(
    task: TaskOpt,
    model: ModelOpt = "local",
    optimizer_model: Annotated[
        str | None,
        typer.Option(help="Analyst model spec (reflects and merges); default: --model."),
    ] = None,
    skill: Annotated[
        Path | None, typer.Option(help="Initial skill document (default: empty).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            help="Run directory (default runs/optimize/<task>); re-running the same command "
            "resumes from the last completed step."
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the train split.")] = (
        SkillOptConfig.epochs
    ),
    batch_size: Annotated[int, typer.Option(help="Train examples per step.")] = (
        SkillOptConfig.batch_size
    ),
    max_steps: Annotated[int | None, typer.Option(help="Stop after N steps in all.")] = None,
    rollouts_k: Annotated[
        int,
        typer.Option(
            help="Attempts per train example (K > 1: sampled, and reflection contrasts solved "
            "with failed attempts)."
        ),
    ] = SkillOptConfig.rollouts_k,
    rollout_temperature: Annotated[
        float, typer.Option(help="Temperature of the K attempts.")
    ] = SkillOptConfig.rollout_temperature,
    minibatch_size: Annotated[int, typer.Option(help="Trajectories per analyst call.")] = (
        SkillOptConfig.minibatch_size
    ),
    merge_batch_size: Annotated[int, typer.Option(help="Patches per merge call.")] = (
        SkillOptConfig.merge_batch_size
    ),
    edit_budget_max: Annotated[int, typer.Option(help="Edits applied at the first step.")] = (
        SkillOptConfig.edit_budget_max
    ),
    edit_budget_min: Annotated[int, typer.Option(help="Edits applied at the last step.")] = (
        SkillOptConfig.edit_budget_min
    ),
    edit_schedule: Annotated[str, typer.Option(help="constant | linear | cosine")] = (
        SkillOptConfig.edit_schedule
    ),
    demos_max: Annotated[
        int,
        typer.Option(
            help="Most worked train examples a skill may carry (0: rules only). Candidates: "
            "the target's passing train replies and references the scorer passes."
        ),
    ] = SkillOptConfig.demos_max,
    demo_placement: Annotated[
        str, typer.Option(help="turns (prior chat turns) | system (a system-prompt section).")
    ] = SkillOptConfig.demo_placement,
    demo_sets: Annotated[
        int, typer.Option(help="Demo sets proposed per step (add / swap / fresh / drop).")
    ] = SkillOptConfig.demo_sets_per_step,
    proposals: Annotated[
        int, typer.Option(help="Analyst proposals per step (the extra ones sampled).")
    ] = SkillOptConfig.proposals,
    pool: Annotated[
        bool, typer.Option(help="Draw each step's parent from the val Pareto front of a pool.")
    ] = SkillOptConfig.pool,
    merge: Annotated[
        bool, typer.Option(help="Also propose rules of one pool member + demos of another.")
    ] = SkillOptConfig.merge,
    screen_size: Annotated[
        int,
        typer.Option(help="Val items every candidate is screened on before full val (0: none)."),
    ] = SkillOptConfig.screen_size,
    screen_keep: Annotated[
        int, typer.Option(help="Candidates that go on from screening to full val and the gate.")
    ] = SkillOptConfig.screen_keep,
    gate_metric: GateMetricOpt = None,
    gate_margin: GateMarginOpt = GateConfig.margin,
    gate_confidence: GateConfidenceOpt = SkillOptConfig().gate.confidence,
    strict_gate: Annotated[
        bool, typer.Option(help="SkillOpt's plain strict > gate (same as --gate-margin 0).")
    ] = False,
    llm_merge: Annotated[
        bool, typer.Option(help="Merge patches with the analyst (else deterministic).")
    ] = SkillOptConfig.llm_merge,
    successes: Annotated[
        bool, typer.Option(help="Also reflect on solved examples (success-driven edits).")
    ] = SkillOptConfig.reflect_on_successes,
    test: Annotated[
        bool, typer.Option(help="Evaluate the initial and best skill on test at the end.")
    ] = SkillOptConfig.evaluate_test,
    concurrency: Annotated[int, typer.Option(help="Concurrent model calls.")] = (
        SkillOptConfig.concurrency
    ),
    max_tokens: Annotated[int, typer.Option(help="Target reply length cap.")] = (
        SkillOptConfig.max_tokens
    ),
    analyst_max_tokens: Annotated[int, typer.Option(help="Analyst reply length cap.")] = (
        SkillOptConfig.analyst_max_tokens
    ),
    budget_calls: BudgetCallsOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    budget_usd: BudgetUsdOpt = None,
    budget_roles: BudgetRolesOpt = None,
    timeout: TimeoutOpt = 120.0,
    cache: CacheOpt = None,
    scorer: Annotated[str | None, typer.Option(help="Scorer for JSONL tasks.")] = None,
    seed: SeedOpt = 0,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
    unsafe_exec: UnsafeExecOpt = False,
    report_to: ReportToOpt = SkillOptConfig.report_to,
) -> None:
    """Optimize a skill document for a frozen model (SkillOpt): rollout → reflect → aggregate →
    select under an edit budget → apply → gate on val; ships the best skill, not the last."""
    from selftaught.api import optimize
    from selftaught.models.errors import FatalBackendError

    try:
        config = SkillOptConfig(
            epochs=epochs,
            batch_size=batch_size,
            max_steps=max_steps,
            seed=seed,
            rollouts_k=rollouts_k,
            rollout_temperature=rollout_temperature,
            minibatch_size=minibatch_size,
            merge_batch_size=merge_batch_size,
            reflect_on_successes=successes,
            llm_merge=llm_merge,
            edit_budget_max=edit_budget_max,
            edit_budget_min=edit_budget_min,
            edit_schedule=edit_schedule,
            demos_max=demos_max,
            demo_placement=demo_placement,
            demo_sets_per_step=demo_sets,
            proposals=proposals,
            pool=pool,
            merge=merge,
            screen_size=screen_size,
            screen_keep=screen_keep,
            gate=gate_config(
                gate_metric,
                0.0 if strict_gate else gate_margin,
                None if strict_gate else gate_confidence,
            ),
            budget=budget(budget_calls, budget_tokens, budget_usd, budget_roles),
            concurrency=concurrency,
            max_tokens=max_tokens,
            analyst_max_tokens=analyst_max_tokens,
            timeout_s=timeout * 10,
            evaluate_test=test,
            report_to=report_to,
        )
    except InputError as err:
        raise typer.BadParameter(str(err)) from None
    warn_unsafe_exec(unsafe_exec)
    console.print(f"optimizing a skill for [bold]{task}[/] with {model}")
    try:
        summary = optimize(
            task,
            model,
            optimizer_model=optimizer_model,
            initial_skill=read_text_file(skill, "skill"),
            config=config,
            output_dir=output,
            task_options=task_options(
                seed, train_size, val_size, test_size, scorer=scorer, unsafe_exec=unsafe_exec
            ),
            model_options=model_options(api_key, timeout, cache, device),
            console=console,
        )
    except FatalBackendError:
        console.print("stopped; the run is resumable: fix the cause and re-run the same command")
        raise
    print_optimize(summary)


def print_optimize(summary: dict[str, Any]) -> None:
    table = Table(title=f"skill optimization: {summary['task']}")
    table.add_column("")
    table.add_column("initial skill", justify="right")
    table.add_column("best skill", justify="right")

    def acc(s: dict[str, Any] | None) -> str:
        if not s:
            return "-"
        lo, hi = s["hard_ci"]
        return f"{s['hard']:.3f} ({s['solved']}/{s['n']}, 95% CI {lo:.2f}-{hi:.2f})"

    test_res = summary["test"] or {}
    table.add_row("val accuracy", acc(summary["val_initial"]), acc(summary["val_best"]))
    table.add_row("test accuracy", acc(test_res.get("initial")), acc(test_res.get("best")))
    out.print(table)
    analyst_stats = summary["analyst"]
    rate = analyst_stats["parse_rate"]
    out.print(
        f"steps {summary['steps']}/{summary['total_steps']} · gate "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["decisions"].items()))
        + f" · analyst replies parsed {'-' if rate is None else f'{rate:.0%}'} of "
        f"{analyst_stats['calls']} · LLM calls {summary['llm_calls']} · tokens "
        f"{summary['tokens']} · {summary['elapsed_s']:.0f} s"
    )
    if summary.get("stopped_by"):
        out.print(f"[bold yellow]stopped early:[/] {summary['stopped_by']}")
    if test_res:
        out.print(f"test paired sign test p = {test_res['paired']['sign_test_p']:.3f}")
    best_path = Path(summary["run_dir"]) / "best_skill.md"
    demos = summary.get("best_demos") or []
    carries = f", with {len(demos)} worked example{'s' * (len(demos) != 1)}" if demos else ""
    out.print(f"best skill ({summary['best_version']}{carries}): {best_path}")


# ---- train (weight space) -------------------------------------------------------------


@app.command()
@friendly_errors
def train(
    ctx: typer.Context,
    task: TaskOpt,
    method: Annotated[
        str, typer.Option(help="rest (ReST-EM) | sft (on references) | grpo | gspo")
    ] = "rest",
    model: ModelOpt = "local",
    backend: Annotated[str, typer.Option(help="lora | full | scratch (games only)")] = (
        BackendConfig.backend
    ),
    rounds: Annotated[
        int | None, typer.Option(help="ReST rounds (base model = round 0; rest 3, sft 1).")
    ] = None,
    samples_per_prompt: Annotated[
        int, typer.Option("--samples-per-prompt", "-k", help="k samples per train prompt.")
    ] = RestConfig.samples_per_prompt,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature (rest 0.8, grpo/gspo 1.0).")
    ] = None,
    elite_fraction: Annotated[
        float | None, typer.Option(help="Top fraction kept per prompt (agent 1.0, game 0.25).")
    ] = None,
    min_score: Annotated[
        float | None, typer.Option(help="Keep samples scoring >= this (agent 1.0, game none).")
    ] = None,
    max_per_prompt: Annotated[int, typer.Option(help="Cap of elite samples per prompt.")] = (
        RestConfig.max_per_prompt
    ),
    continue_training: Annotated[
        bool,
        typer.Option(
            "--continue-training",
            help="Fine-tune the last round's model instead of the base each round.",
        ),
    ] = False,
    epochs: Annotated[float, typer.Option(help="SFT epochs per round.")] = SFTTrainConfig.epochs,
    lr: Annotated[
        float | None, typer.Option("--lr", help="Learning rate (default per backend and method).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="SFT batch size (a round needs one batch of elite samples).")
    ] = SFTTrainConfig.batch_size,
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = BackendConfig.lora_r,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha.")] = BackendConfig.lora_alpha,
    lora_dropout: Annotated[float, typer.Option(help="LoRA dropout.")] = BackendConfig.lora_dropout,
    target_modules: Annotated[
        str, typer.Option(help="LoRA targets: all-linear or q_proj,v_proj,...")
    ] = "all-linear",
    dora: Annotated[bool, typer.Option("--dora", help="DoRA instead of plain LoRA.")] = False,
    num_layers: Annotated[int | None, typer.Option(help="Train only the last N layers.")] = None,
    scratch_layers: Annotated[int, typer.Option(help="Layers of the from-scratch model.")] = (
        BackendConfig.scratch_layers
    ),
    scratch_width: Annotated[int, typer.Option(help="Width of the from-scratch model.")] = (
        BackendConfig.scratch_width
    ),
    teacher_skill: Annotated[
        Path | None,
        typer.Option(help="Skill file in the system prompt while sampling only (distillation)."),
    ] = None,
    beta: Annotated[float, typer.Option(help="GRPO/GSPO KL coefficient.")] = RLConfig.beta,
    num_generations: Annotated[int, typer.Option(help="GRPO/GSPO group size.")] = (
        RLConfig.num_generations
    ),
    max_completion_length: Annotated[
        int, typer.Option(help="GRPO/GSPO completion token cap.")
    ] = RLConfig.max_completion_length,
    steps: Annotated[int, typer.Option(help="GRPO/GSPO optimizer steps.")] = RLConfig.steps,
    max_tokens: Annotated[int, typer.Option(help="Token cap for sampling and evaluation.")] = (
        RestConfig.max_tokens
    ),
    gate_metric: GateMetricOpt = None,
    gate_margin: GateMarginOpt = GateConfig.margin,
    gate_confidence: GateConfidenceOpt = None,
    budget_calls: BudgetCallsOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    sampler_url: Annotated[
        str | None,
        typer.Option(help="Sample through this OpenAI-compatible server (vLLM + LoRA adapters)."),
    ] = None,
    sampler_base_model: Annotated[
        str, typer.Option(help="The sampler server's name for the base model.")
    ] = RestConfig.sampler_base_model,
    vllm_server: Annotated[
        str | None,
        typer.Option(help="GRPO/GSPO: generate with this vLLM server (`trl vllm-serve`)."),
    ] = None,
    device: DeviceOpt = None,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    seed: SeedOpt = 0,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (fewer is faster on a busy machine).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Run directory (default: runs/train-...; the same command resumes).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
    unsafe_exec: UnsafeExecOpt = False,
    report_to: ReportToOpt = RestConfig.report_to,
) -> None:
    """Train the weights of a local model on a task: ReST-EM / SFT / GRPO / GSPO."""
    from selftaught.api import train as run_training

    check_method_options(method, given_options(ctx))
    if threads:
        import torch

        torch.set_num_threads(threads)
    warn_unsafe_exec(unsafe_exec)
    backend_cfg = BackendConfig(
        backend=backend,  # type: ignore[arg-type]
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=target_modules,
        use_dora=dora,
        num_layers=num_layers,
        device=device,
        scratch_layers=scratch_layers,
        scratch_width=scratch_width,
    )
    gate = gate_config(gate_metric, gate_margin, gate_confidence)
    if gate_metric is None and gate == GateConfig():
        gate = None  # the task's default gate (soft for games)
    config: RestConfig | RLConfig
    if method in ("grpo", "gspo"):
        config = RLConfig(
            method=method,  # type: ignore[arg-type]
            steps=steps,
            beta=beta,
            num_generations=num_generations,
            max_completion_length=max_completion_length,
            temperature=RLConfig.temperature if temperature is None else temperature,
            learning_rate=lr,
            seed=seed,
            eval_max_tokens=max_tokens,
            gate=gate,
            vllm_server_url=vllm_server,
            budget=budget(budget_calls, budget_tokens, None),
            backend=backend_cfg,
            report_to=report_to,
        )
    else:
        config = RestConfig(
            method=method,  # type: ignore[arg-type]
            rounds=rounds,
            samples_per_prompt=samples_per_prompt,
            temperature=RestConfig.temperature if temperature is None else temperature,
            max_tokens=max_tokens,
            min_score=min_score,
            elite_fraction=elite_fraction,
            max_per_prompt=max_per_prompt,
            continue_training=continue_training,
            teacher_skill=read_text_file(teacher_skill, "teacher skill") or None,
            gate=gate,
            budget=budget(budget_calls, budget_tokens, None),
            sampler_url=sampler_url,
            sampler_base_model=sampler_base_model,
            seed=seed,
            sft=SFTTrainConfig(epochs=epochs, learning_rate=lr, batch_size=batch_size),
            backend=backend_cfg,
            report_to=report_to,
        )
    result = run_training(
        task,
        model,
        method=method,
        config=config,
        output_dir=output,
        task_options=task_options(seed, train_size, val_size, test_size, unsafe_exec=unsafe_exec),
        progress=not quiet,
        console=console,
    )
    print_train(result)


def given_options(ctx: typer.Context) -> set[str]:
    """The flags the user actually typed (so options a method would ignore are refused)."""
    return {
        "--" + name.replace("_", "-")
        for name in ctx.params
        # typer may vendor click, so compare the source by name
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT")
        not in ("DEFAULT", "DEFAULT_MAP")
    }


def print_train(result: Any) -> None:
    summary = result.to_dict()
    console.print(f"base    test {result.base_test.line()}")
    console.print(
        f"shipped test {result.shipped_test.line()}  ({summary['shipped']}, {summary['gain']:+.3f})"
    )
    if result.best_dir:
        console.print(f"shipped model: {result.best_dir}  (use --model local:{result.best_dir})")
    out.print_json(data=summary)


# ---- report ---------------------------------------------------------------------------------
@app.command("report")
@friendly_errors
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of optimize or train.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="HTML file to write (default RUN_DIR/report.html)."),
    ] = None,
    open_page: Annotated[
        bool, typer.Option("--open", help="Open the page in the web browser.")
    ] = False,
) -> None:
    """A self-contained HTML report of a run (also of one still in progress): learning curves
    with 95% intervals, gate decisions, edits, skill diffs, usage, failures, config."""
    import webbrowser

    from selftaught.report import write_report

    path = write_report(run_dir, output)
    out.print(str(path))
    if open_page and not webbrowser.open(path.resolve().as_uri()):
        console.print(f"no web browser found; open {path} yourself")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # `python -m selftaught.cli`, e.g. under `accelerate launch -m`
    main()
