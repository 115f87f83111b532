"""`proxy` and `sleep ...`: log real traffic, learn from it at night, adopt or roll back."""

from __future__ import annotations

import dataclasses
import functools
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from selftaught.cli.common import (
    DEFAULT_MAX_BODY_MB,
    STOP_FLAGS,
    ApiKeyOpt,
    BudgetCallsOpt,
    BudgetTokensOpt,
    BudgetUsdOpt,
    F,
    GateConfidenceOpt,
    GateMarginOpt,
    GateMetricOpt,
    GateTagMarginOpt,
    MaxBodyOpt,
    MinGainOpt,
    NightTagAlphaOpt,
    ObjectiveOpt,
    SeedOpt,
    TimeoutOpt,
    app,
    budget,
    console,
    friendly_errors,
    gate_config,
    model_options,
    out,
)
from selftaught.cli.options import EffectiveConfig, config_file, config_flags

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.errors import ConfigError, InputError, read_text
from selftaught.gate import GateConfig
from selftaught.models.errors import CALL_TIMEOUT_S
from selftaught.rollout import rollout_timeout
from selftaught.runs import json_text
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.intake.harvest import HarvestConfig
from selftaught.sleep.intake.log import parse_time
from selftaught.sleep.intake.probation import ProbationConfig
from selftaught.sleep.intake.proxy import ProxyConfig
from selftaught.sleep.move import BATCH
from selftaught.sleep.night.cycle import NightConfig, night_training_defaults
from selftaught.sleep.night.demo_modes import DemoModeConfig
from selftaught.sleep.night.dream import DreamConfig
from selftaught.sleep.night.miner import MinerConfig
from selftaught.sleep.night.split import SplitConfig
from selftaught.sleep.night.weak import WeakConfig
from selftaught.sleep.night.weight_night import WeightNightConfig
from selftaught.sleep.paths import DEFAULT_PROJECT, check_project
from selftaught.stops import Stops

# ---- sleep, part 1: the proxy and the task log ----------------------------------------

sleep_app = typer.Typer(
    help="Sleep: learn from the deployed agent's real traffic (the task log and its inputs).",
    no_args_is_help=True,
)
app.add_typer(sleep_app, name="sleep")


def _log_option(value: str | None) -> str | None:
    """--log: a file, or a postgresql:// URL; with a URL the command's adopted versions and
    night's lock live in that database too (it is $SELFTAUGHT_LOG for this command)."""
    from selftaught.sleep.paths import ENV_LOG
    from selftaught.sleep.store import display_url, is_url, url_password

    if value and is_url(value):
        os.environ[ENV_LOG] = value.strip()
        if url_password(value):  # a command line is readable by every local user (ps)
            console.print(
                f"warning: --log {display_url(value)} carries a password on the command "
                f"line, which every user of this machine can read (ps); set {ENV_LOG} in "
                "the environment instead (or use ~/.pgpass)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    return value


LogOpt = Annotated[
    str | None,
    typer.Option(
        "--log",
        help="Task log: a file (default $SELFTAUGHT_LOG or <home>/log.db) or a postgresql:// "
        "URL, whose database then also holds the adopted versions and the night's lock.",
        callback=_log_option,
    ),
]
ProjectOpt = Annotated[str, typer.Option(help="Project the interactions belong to.")]


def checked_project(value: str | None) -> str | None:
    """A --project value, refused before anything runs unless it is a valid project name (it
    names a folder under the home and goes into crontab lines)."""
    if value is None:
        return None
    try:
        return check_project(value)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


AnyProjectOpt = Annotated[
    str | None,
    typer.Option("--project", help="Only this project.", callback=checked_project),
]


PROXY_FLAGS = (
    "client_keys",
    "trusted_clients",
    "feedback_per_minute",
    "forward_embeddings",
    "forward_org_headers",
    "auto_rollback",
    "probation_every",
    "canary_share",
    "canary_mode",
    "canary_night",
    "canary_seed",
    "max_adapters",
)
PROBATION_FLAGS = ("min_outcomes", "confidence")
UPSTREAM_HELP = (
    "Where requests go: http://HOST:PORT/v1#M | http://HOST:PORT (the client's model) | "
    "openai:M | local | anthropic | openai (the vendor's API, the client's model)."
)
# the proxy's own: its fallback depends on the upstream (sleep/intake/proxy.py SHORTCUTS)
ProxyApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="SELFTAUGHT_API_KEY",
        help="The upstream's key. Else: ANTHROPIC_API_KEY for --upstream anthropic, "
        "OPENAI_API_KEY for openai and openai:M; for a URL, the client's own key.",
    ),
]
FEEDBACK_KEY_HELP = (
    "The operator's key for POST /v1/feedback: feedback sent with it is trusted (giver "
    "operator); end users' feedback is not."
)
PROXY_PROBATION_FLAGS = {**{f: f for f in PROBATION_FLAGS}, "untrusted": "probation_untrusted"}
# the proxy's own options in a config file: ProxyConfig's field names
PROXY_KEYS = {"timeout": "timeout_s", "drain_timeout": "drain_timeout_s", "log": "log_path"}


RequireKeyOpt = Annotated[
    str | None,
    typer.Option(
        envvar="SELFTAUGHT_PROXY_KEY",
        help="Clients must send this key (Authorization: Bearer or x-api-key).",
    ),
]

AllowRemoteOpt = Annotated[
    bool,
    typer.Option(help="Allow binding a non-loopback interface and any Host / Origin header."),
]

DrainTimeoutOpt = Annotated[
    int,
    typer.Option(
        help="On SIGTERM or Ctrl-C: seconds the answers in flight get to finish once the "
        "port is closed (past it they are cut and logged as errors).",
        min=0,
    ),
]

LoraOpt = Annotated[
    bool,
    typer.Option(
        help="The upstream is vLLM with runtime LoRA (--enable-lora, "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): load the adopted adapter there and send "
        "requests to it. A local upstream follows the adopted adapter without this."
    ),
]

PrintSystemdOpt = Annotated[
    bool,
    typer.Option(
        "--print-systemd",
        help="Print a sandboxed systemd unit that runs this proxy with these options "
        "(secrets go in its environment file, never in the unit), and exit.",
    ),
]


@app.command("proxy")
@friendly_errors
@config_file(keys=PROXY_KEYS, exclude=("print_systemd",))
@config_flags(ProxyConfig, PROXY_FLAGS, into="watch_fields")
@config_flags(ProbationConfig, PROXY_PROBATION_FLAGS, into="probation_fields", section="probation")
def proxy_cmd(
    ctx: typer.Context,
    watch_fields: dict[str, Any],
    probation_fields: dict[str, Any],
    upstream: Annotated[str, typer.Option(help=UPSTREAM_HELP)],
    project: ProjectOpt = ProxyConfig.project,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = ProxyConfig.host,
    port: Annotated[int, typer.Option(help="Port.")] = ProxyConfig.port,
    require_key: RequireKeyOpt = None,
    feedback_key: Annotated[
        str | None, typer.Option(envvar="SELFTAUGHT_FEEDBACK_KEY", help=FEEDBACK_KEY_HELP)
    ] = None,
    allow_remote: AllowRemoteOpt = ProxyConfig.allow_remote,
    log: LogOpt = None,
    api_key: ProxyApiKeyOpt = None,
    inject: Annotated[
        bool, typer.Option(help="Inject the adopted skill and memory.")
    ] = ProxyConfig.inject,
    timeout: Annotated[
        float, typer.Option(help="Seconds per upstream request.")
    ] = ProxyConfig.timeout_s,
    max_body_mb: MaxBodyOpt = DEFAULT_MAX_BODY_MB,
    drain_timeout: DrainTimeoutOpt = ProxyConfig.drain_timeout_s,
    lora: LoraOpt = ProxyConfig.lora,
    print_systemd: PrintSystemdOpt = False,
) -> None:
    """Logging proxy: injects the adopted skill, logs every exchange (redacted).

    It speaks chat completions, Anthropic Messages and OpenAI Responses (Claude Code, Codex, any
    OpenAI-SDK agent)."""
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
        feedback_key=feedback_key,
        allow_remote=allow_remote,
        log_path=log,
        api_key=api_key,
        timeout_s=timeout,
        inject=inject,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        drain_timeout_s=drain_timeout,
        lora=lora,
        probation=ProbationConfig(**probation_fields),
        **watch_fields,
    )
    if print_systemd:
        from selftaught.sleep.intake.service import systemd_unit

        typer.echo(systemd_unit(_proxy_service(ctx, config, log)), nl=False)
        return
    console.print(
        f"proxy for {strip_credentials(upstream)} at http://{host}:{port}/v1 (project {project})"
    )
    _say_trusted(config.trusted_clients or ())
    run_proxy(config)


def _say_trusted(trusted: tuple[str, ...]) -> None:
    """Whose words the proxy takes as the operator's, said at its start."""
    if "*" in trusted:
        console.print(
            "--trusted-clients '*': every client's words count as the operator's (their "
            "corrections may become demonstrations): for a one-person deployment only"
        )
    elif trusted:
        console.print(f"clients whose words count as the operator's: {', '.join(trusted)}")


# the proxy's options that hold a secret: never written into a unit, read from its environment
_SECRET_OPTIONS = {
    "require_key": "SELFTAUGHT_PROXY_KEY",
    "feedback_key": "SELFTAUGHT_FEEDBACK_KEY",
    "api_key": "SELFTAUGHT_API_KEY",
}
# written by the unit (a --config file's settings are written as the flags they stand for)
_UNIT_OWN = {"print_systemd", "config", "log", "client_keys", *_SECRET_OPTIONS}


def _proxy_service(ctx: typer.Context, config: ProxyConfig, log: str | None) -> Any:
    """What `--print-systemd` writes: the options given on this command line (secrets and
    paths apart), the secrets' variables, the client keys file and the log."""
    from selftaught.sleep.intake.service import ProxyService, upstream_key_variable
    from selftaught.sleep.paths import ENV_LOG
    from selftaught.sleep.store import is_url, url_password

    words: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        # typer may vendor click, so compare the source by name
        given = getattr(ctx.get_parameter_source(name), "name", "") in (
            "COMMANDLINE",
            "DEFAULT_MAP",
        )
        if param.param_type_name != "option" or name in _UNIT_OWN or not given:
            continue
        value = ctx.params[name]
        if getattr(param, "is_flag", False):
            words.append(param.opts[0] if value else param.secondary_opts[0])
            continue
        for one in value if isinstance(value, (list, tuple)) else [value]:
            words += [param.opts[0], str(Path(one).absolute() if isinstance(one, Path) else one)]
    secrets = [env for name, env in _SECRET_OPTIONS.items() if ctx.params.get(name)]
    vendor = upstream_key_variable(config.upstream) if config.api_key is None else None
    secrets += [vendor] if vendor else []
    log = log or os.environ.get(ENV_LOG) or None
    log_file = None
    if log and is_url(log) and url_password(log):
        secrets.append(ENV_LOG)  # the URL, password and all, in the environment file
    elif log:
        log_file = None if is_url(log) else Path(log).expanduser().absolute()
        words += ["--log", str(log_file or log.strip())]
    return ProxyService(
        args=tuple(words),
        project=config.project,
        port=config.port,
        drain_timeout_s=config.drain_timeout_s,
        secrets=tuple(secrets),
        client_keys=config.client_keys.absolute() if config.client_keys else None,
        log_file=log_file,
    )


log_app = typer.Typer(
    help="List, filter or export the task log; `sleep log migrate` moves it into Postgres, "
    "`sleep log forget` deletes rows for good."
)
sleep_app.add_typer(log_app, name="log")


@log_app.callback(invoke_without_command=True)
@friendly_errors
def sleep_log_cmd(
    ctx: typer.Context,
    log: LogOpt = None,
    project: AnyProjectOpt = None,
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
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per row on stdout (for grep, jq).")
    ] = False,
    threads: Annotated[
        bool, typer.Option("--threads", help="Group the rows by conversation thread.")
    ] = False,
    signals: Annotated[
        bool,
        typer.Option(
            "--signals",
            help="The verdicts read from the rows' conversations (next-turn corrections, "
            "rejections, rules, acceptances, re-asks), as a night would use them.",
        ),
    ] = False,
) -> None:
    """List, filter or export the task log."""
    from selftaught.sleep.intake.log import LogFilter, TaskLog, parse_time

    if ctx.invoked_subcommand is not None:
        return

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
    rows = task_log.query(flt)
    if threads or signals:
        _print_conversations(rows, signals, as_json)
        return
    if as_json:
        for it in rows:
            print(json_text(it.to_dict()))
        return
    out.print(log_table(rows, f"task log {task_log.path} ({task_log.count(flt)} rows match)"))


def _print_conversations(rows: list[Any], signals: bool, as_json: bool) -> None:
    """`sleep log --threads` / `--signals`: the rows as a night reads them."""
    from selftaught.sleep.intake.threads import build_threads
    from selftaught.sleep.night.mine import MineConfig
    from selftaught.sleep.night.signals import read_threads, rejected_signals

    rows = sorted(rows, key=lambda it: it.created_at)
    if not signals:
        table = Table(title=f"{len(rows)} rows", expand=True)
        for column in ("thread", "how", "rows", "replies", "first request"):
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        for thread in build_threads(rows):
            first = thread.rows[0]
            if as_json:
                ids = [r.id for r in thread.rows]
                print(json_text({"thread": thread.id, "how": thread.how, "rows": ids}))
                continue
            table.add_row(thread.id[:8], thread.how, str(len(thread.rows)),
                          str(len(thread.turns)), first.prompt_head(80))  # fmt: skip
        if not as_json:
            out.print(table)
        return
    rejected: set[str] = set()
    for project in {it.project for it in rows}:
        rejected |= rejected_signals(project)
    _, found, _ = read_threads(rows, MineConfig())
    table = Table(title=f"{len(found)} signals in {len(rows)} rows", expand=True)
    for column in ("signal", "kind", "row", "giver", "trusted", "status", "words"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for sig in found:
        status = "rejected" if sig.id in rejected else "used"
        if as_json:
            print(json_text({**sig.to_dict(), "status": status}))
            continue
        row = (sig.row_id or f"{sig.thread}#{sig.turn}")[:12]
        table.add_row(sig.id, sig.kind, row, sig.giver, "yes" if sig.trusted else "no", status,
                      sig.words[:100])  # fmt: skip
    if not as_json:
        out.print(table)


@log_app.command("migrate")
@friendly_errors
def sleep_log_migrate_cmd(
    to: Annotated[str, typer.Option("--to", help="The Postgres database: postgresql://...")],
    log: Annotated[
        Path | None,
        typer.Option("--log", help="The SQLite log to copy (default <home>/log.db)."),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Rows per transaction.")] = BATCH,
) -> None:
    """Copy a SQLite log and its projects' adopted versions into Postgres, then check every row.

    Safe to re-run: what is there is skipped, and a killed run resumes."""
    from selftaught.sleep.move import move_log
    from selftaught.sleep.paths import sleep_home

    source = log or sleep_home() / "log.db"
    result = move_log(source, to, sleep_home(), batch=batch, progress=console.print)
    for line in result.lines():
        out.print(line, soft_wrap=True, markup=False)
    if not result.ok:
        raise typer.Exit(1)


@log_app.command("forget")
@friendly_errors
def sleep_log_forget_cmd(
    log: LogOpt = None,
    project: AnyProjectOpt = None,
    source: Annotated[str | None, typer.Option(help="Only rows from this source.")] = None,
    since: Annotated[str | None, typer.Option(help="From (ISO time or 12h, 7d ago).")] = None,
    until: Annotated[
        str | None, typer.Option(help="Before (ISO time, or 30d: rows older than 30 days).")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="Only rows with this tag.")] = None,
    session: Annotated[
        str | None, typer.Option(help="Only the turns of this agent session.")
    ] = None,
    client: Annotated[
        str | None, typer.Option(help="Only what this client sent (key:<hash>, as logged).")
    ] = None,
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="This row (an id or a 6+ character prefix).")
    ] = None,
    everywhere: Annotated[
        bool,
        typer.Option(
            "--everywhere",
            help="Also rewrite the night folders and learned skills (versions, adopted, "
            "backups, live files) without what came from forgotten rows; without a filter, "
            "for every row forgotten so far.",
        ),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="Delete them; without it, only show what would go.")
    ] = False,
) -> None:
    """Delete rows from the log for good: their feedback and shadow answers go with them.

    Their ids and dedupe keys (no content) are kept, so that no harvest or copy stores them
    again; what the sleep home's recall pool, weak labels, edit ledger and workspaces hold of
    them goes too. Night folders and adopted skills keep what they learned unless
    --everywhere."""
    from selftaught.sleep.intake.log import LogFilter, TaskLog
    from selftaught.sleep.night.forget import forget_in_home
    from selftaught.sleep.paths import sleep_home

    filters = (project, source, since, until, tag, session, client, ids)
    if not any(filters) and not everywhere:
        raise InputError(
            "name the rows to forget: --project, --source, --since, --until, --tag, --session, "
            "--client or --id (`sleep log forget --until 30d` forgets what is older than 30 days)"
        )
    task_log = TaskLog(log)
    flt = LogFilter(
        project=project, source=source, tag=tag, session_id=session, client=client,
        since=parse_time(since) if since else None, until=parse_time(until) if until else None,
        ids=tuple(task_log.resolve_id(i) for i in ids) if ids else None,
    )  # fmt: skip
    if not yes:
        if any(filters):
            n = task_log.count(flt)
            title = f"{n} rows would go, with their feedback and shadow answers"
            out.print(log_table(task_log.query(dataclasses.replace(flt, limit=20)), title))
        out.print("nothing deleted: run again with --yes to forget them", soft_wrap=True)
        return
    if any(filters):
        gone = task_log.forget(flt)
        out.print(f"forgot {len(gone)} rows in {task_log.path} (shadow answers included)",
                  soft_wrap=True, markup=False)  # fmt: skip
        if not task_log.checkpoint():
            out.print("the log's WAL still holds pages from before the delete (another "
                      "process reads an older snapshot): its next checkpoint clears them",
                      soft_wrap=True, markup=False)  # fmt: skip
    done = forget_in_home(sleep_home(), task_log, everywhere=everywhere)
    for line in done.lines():
        out.print(line, soft_wrap=True, markup=False)
    if task_log.backend == "postgres":
        out.print("on Postgres the deleted rows' bytes stay in dead tuples until VACUUM "
                  "reuses their space (docs/postgres.md)",
                  soft_wrap=True, markup=False)  # fmt: skip


def log_table(rows: list[Any], title: str) -> Table:
    """One line per interaction whatever the width: text cells end in "…", never wrap."""
    table = Table(title=title, expand=True)
    # (name, min width, ratio of the width left): fixed cells first, text shares the rest
    for column, least, ratio in (
        ("id", 8, None),
        ("time", 11, None),
        ("project", 4, 1),
        ("source", 4, 1),
        ("model", 4, 1),
        ("request", 8, 3),
        ("reply", 6, 2),
        ("feedback", 4, 1),
        ("notes", 4, 2),
    ):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=least, ratio=ratio)
    for it in rows:
        table.add_row(
            it.id[:8],
            datetime.fromtimestamp(it.created_at).strftime("%m-%d %H:%M"),
            it.project,
            it.source,
            it.model or "",
            it.prompt_head(80),
            " ".join((it.reply or it.error or "").split())[:80],
            _feedback_cell(it.feedback),
            ", ".join(_notes(it)),
        )
    return table


def _feedback_cell(fb: Any) -> str:
    parts = (fb.thumb, None if fb.score is None else f"{fb.score:g}")
    return " ".join([*(x for x in parts if x), *(["ref"] if fb.reference is not None else [])])


def _notes(it: Any) -> list[str]:
    notes = [f"error {it.error_status or ''}".strip()] if it.error else []
    notes += ["private"] * it.private + [f"{it.redactions} redacted"] * bool(it.redactions)
    version = it.skill_version or ""
    notes += [f"skill v{version}" if version.isdigit() else version] * bool(version)
    return notes + [f"shadow of {(it.shadow_of or '')[:8]}"] * bool(it.shadow_of)


@sleep_app.command("import")
@friendly_errors
def sleep_import_cmd(
    file: Annotated[Path, typer.Argument(help="JSONL: our export, OpenAI chat or OpenAI evals.")],
    project: Annotated[
        str | None,
        typer.Option(help="Put every row in this project.", callback=checked_project),
    ] = None,
    log: LogOpt = None,
    trust_fields: Annotated[
        bool,
        typer.Option(
            help="Take the file's source, client, reviewed, skill_version, meta.upstream and "
            "feedback giver / trust as given (an export of your own log); without it they are "
            "an end user's."
        ),
    ] = False,
) -> None:
    """Import interactions from a JSONL file (all lines or none)."""
    from selftaught.sleep.intake.harvest.import_jsonl import import_file
    from selftaught.sleep.intake.log import TaskLog

    result = import_file(file, TaskLog(log), project, trust_fields=trust_fields)
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
    score: Annotated[float | None, typer.Option(help="A score from 0 to 1.")] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="The correct answer; for a request with tools, a corrected tool call as JSON "
            '({"name": ..., "arguments": {...}}) also.'
        ),
    ] = None,
    comment: Annotated[str | None, typer.Option(help="A comment.")] = None,
    reject_signal: Annotated[
        bool,
        typer.Option(
            "--reject-signal",
            help="Reject the verdicts read from the conversation on this row (or the signal "
            "with this id, s-...): a night will not use them (`sleep log --signals`).",
        ),
    ] = False,
    accept_signal: Annotated[
        bool, typer.Option("--accept-signal", help="Take a rejection back.")
    ] = False,
    project: AnyProjectOpt = None,
    log: LogOpt = None,
) -> None:
    """Attach feedback to a logged interaction, or reject a signal read from a conversation."""
    from selftaught.sleep.intake.log import Feedback, TaskLog, Thumb

    if reject_signal or accept_signal:
        _review_signals(TaskLog(log), interaction_id, project, accept_signal)
        return
    thumb = cast("Thumb | None", thumbs)  # Feedback checks it
    fb = Feedback(thumb=thumb, score=score, reference=reference, comment=comment)
    out.print(f"feedback attached to {TaskLog(log).add_feedback(interaction_id, fb)}")


def _review_signals(log: Any, target: str, project: str | None, accept: bool) -> None:
    from selftaught.sleep.night.signals import review_signals, signals_on_row

    if target.startswith("s-"):
        ids, where = [target], project or DEFAULT_PROJECT
    else:
        where, ids = signals_on_row(log, target)
    changed = review_signals(where, None, ids, accept=accept)
    verb = "accepted again" if accept else "rejected"
    out.print(f"{changed} of {len(ids)} signals {verb} in project {where}: {', '.join(ids)}")


@sleep_app.command("harvest")
@friendly_errors
def sleep_harvest_cmd(
    source: Annotated[str, typer.Option(help="auto | claude-code | codex")] = "auto",
    since: Annotated[
        str | None, typer.Option(help="From (ISO time or 7d ago); overrides --lookback-days.")
    ] = None,
    lookback_days: Annotated[
        float, typer.Option(help="Window when --since is not given.")
    ] = HarvestConfig.lookback_days,
    max_sessions: Annotated[
        int, typer.Option(help="Sessions read per run (newest first).")
    ] = HarvestConfig.max_sessions,
    max_tasks: Annotated[
        int, typer.Option(help="Interactions stored per run.")
    ] = HarvestConfig.max_tasks,
    project: Annotated[
        str | None,
        typer.Option(
            help="Put every row in this project (default: from the session's folder).",
            callback=checked_project,
        ),
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
    str | None,
    typer.Option(
        "--project",
        help="One project (default: every project with traffic).",
        callback=checked_project,
    ),
]
AdoptProjectOpt = Annotated[
    str, typer.Option("--project", help="Project.", callback=checked_project)
]
TargetSkillOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--target-skill-path", help="Also write the adopted skill to this file (e.g. AGENTS.md)."
    ),
]
FollowSymlinksOpt = Annotated[
    bool,
    typer.Option(
        help="Write a --target-skill-path that is a symlink where it points (and remember that "
        "file); without it a symlink is refused."
    ),
]


# --place (skills where each agent reads them, sleep/adoption/placement.py)
PlaceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--place",
        help="Also write the adopted skill where an agent reads it: claude:REPO "
        "(.claude/skills), codex:REPO (.agents/skills), agents-md:REPO (a section of "
        "AGENTS.md), codex-global (~/.codex/skills, with --allow-global). Repeatable.",
    ),
]
AllowGlobalOpt = Annotated[
    bool,
    typer.Option(help="Let --place codex-global write where every repository's Codex reads."),
]


def _preferences(value: str | None) -> str:
    """--preferences: a file's text when the value names a file, else the text itself."""
    if value and Path(value).expanduser().is_file():
        return read_text(Path(value).expanduser(), "preferences file")
    return value or ""


NIGHT_TRAINING = night_training_defaults()  # a night's SkillOpt settings: their defaults
NIGHT_FLAGS = {
    "miner_model": "miner_model",
    "lookback_days": "lookback_days",
    "max_tasks": "max_tasks",
    "max_sessions": "max_sessions",
    "max_client_share": "max_client_share",
    "recall_max": "recall_max",
    "leave_one_out": "leave_one_out",
    "weights": "weights",
    "allow_remote": "allow_remote",
    "allow_cmd_replay": "allow_cmd_replay",
    "auto_adopt": "auto_adopt",
    "follow_symlinks": "follow_symlinks",
    "report_to": "report_to",
    "scheduled": "scheduled",  # `sleep schedule` passes it; your own scheduler may too
    # many skills (nightskills): `--skills`, `--skill-min-tasks`, `--max-skills`
    "many_skills": "skills",
    "val_split": "val",  # --no-val: the daily-use night, nothing held out, the gate off
    "skill_min_tasks": "skill_min_tasks",
    "max_skills": "max_skills",
    "skill_adapters": "skill_adapters",  # with --weights: per-skill | shared
    # the user's own files as starting documents: `--skills-from REPO`, `--start-document PATH`
    "skills_from": "skills_from",
    "start_document": "start_document",
}
SPLIT_FLAGS = ("val_fraction", "test_fraction", "min_val")
DEMO_MODE_FLAGS = ("retrieval", "retrieve_k")
NIGHT_SKILL_FLAGS = (
    *("epochs", "batch_size", "rollouts_k", "demos_max", "concurrency", "max_tokens"),
    "slow_every",  # the slow update every N nights (issue 51)
    "teacher_demos",  # issue 52: never an end user's (no_demo) task
    "prompts",  # the user's own prompt templates, by file name
)
WEIGHT_FLAGS = {
    "adapter_max_steps": "weight_max_steps",
    "adapter_max_minutes": "weight_max_minutes",
}
# --weight-max-seconds (before --weight-max-minutes) still parses: crontab lines hold it
LEGACY_WEIGHT_SECONDS = WeightNightConfig.adapter_max_minutes * 60
LegacyWeightSecondsOpt = Annotated[
    float, typer.Option(hidden=True, help="Deprecated: --weight-max-minutes.")
]

PlanOpt = Annotated[
    bool,
    typer.Option(
        "--plan",
        help="Say what the night would cost (tasks, calls per phase, tokens, time, USD, the "
        "smallest gain the gate could accept) and call no model: `sleep plan`.",
    ),
]

PlanJsonOpt = Annotated[
    bool, typer.Option("--json", help="With --plan: the plan as one JSON object a project.")
]

WEAK_FLAGS = {"k": "pseudo_k", "agree": "pseudo_agree", "weak_share": "pseudo_share"}
MINER_FLAGS = {"read_followups": "miner_followups", "followup_reading": "miner_followup_reading"}
DREAM_FLAGS = {"n": "dream", "synthetic_share": "dream_share"}


NightModelOpt = Annotated[
    str | None, typer.Option(help="Target model spec (default: the upstream the proxy logged).")
]

NightJudgeOpt = Annotated[
    str | None, typer.Option(help="Judge for tasks without a reference (rubrics).")
]

SinceOpt = Annotated[
    str | None, typer.Option(help="Read from here (ISO time or 2d ago), not the last night.")
]

PreferencesOpt = Annotated[
    str | None, typer.Option(help="House rules for the analyst: text, or a file holding it.")
]

DocumentsOpt = Annotated[
    str, typer.Option(help="What to train, in order (empty with --weights: weights only).")
]


# In a config file a night's settings nest as its config does: `[training]` (with
# `[training.gate]` and `[training.budget]`), `[split]`, `[weight_training]`, `[miner]`, ...
NIGHT_KEYS = {
    **{f"gate_{k}": f"training.gate.{k}" for k in ("metric", "margin", "confidence")},
    **{f"gate_{k}": f"training.gate.{k}" for k in ("tag_alpha", "tag_margin")},
    "min_gain": "training.gate.min_gain",
    "objective": "training.gate.objective",
    **{f"budget_{k}": f"training.budget.{k}" for k in ("calls", "tokens", "usd")},
    "seed": "training.seed",
    "preferences": "training.preferences",
    "target_skill_path": "target_skill_paths",
    "log": "log_path",
}
# keys a field's rename moved (every leaf of a NightConfig has one name): an older file still
# reads, with a DeprecationWarning; --print-config writes the new key
NIGHT_RENAMED = {
    "weight_training.max_steps": "weight_training.adapter_max_steps",
    "weight_training.max_minutes": "weight_training.adapter_max_minutes",
    "weak.share": "weak.weak_share",
    "dream.share": "dream.synthetic_share",
}
# --help by phase of the night
NIGHT_PANELS = {
    "Window and mining": (
        *("since", "lookback_days", "max_tasks", "max_sessions", "max_client_share"),
        *("miner_model", *MINER_FLAGS.values(), *WEAK_FLAGS.values(), *DREAM_FLAGS.values()),
        *("allow_remote", "allow_cmd_replay"),
    ),
    "Skill": (
        *("optimizer_model", "preferences", *NIGHT_SKILL_FLAGS, *DEMO_MODE_FLAGS),
        *("skills", "skill_min_tasks", "max_skills", "skills_from", "start_document"),
        "leave_one_out",
    ),
    "Memory": ("documents", "recall_max"),
    "Weights": ("weights", *WEIGHT_FLAGS.values(), "skill_adapters"),
    "Gate": (
        *("gate", "gate_metric", "gate_margin", "gate_confidence", "gate_tag_alpha"),
        *("gate_tag_margin", "min_gain", "objective", "judge_model", "val", *SPLIT_FLAGS),
    ),
    "Budget": ("budget_calls", "budget_tokens", "budget_usd", *STOP_FLAGS, "timeout"),
    "Output": ("auto_adopt", "target_skill_path", "follow_symlinks", "report_to", "plan"),
}


@sleep_app.command("run")
@friendly_errors
@config_file(
    keys=NIGHT_KEYS,
    panels=NIGHT_PANELS,
    exclude=("plan", "as_json"),
    into="run_config",
    renamed=NIGHT_RENAMED,
)
@config_flags(NightConfig, NIGHT_FLAGS, into="night_fields")
@config_flags(
    SkillOptConfig,
    NIGHT_SKILL_FLAGS,
    into="skill_fields",
    defaults=NIGHT_TRAINING,
    section="training",
)
@config_flags(SplitConfig, SPLIT_FLAGS, into="split_fields", section="split")
@config_flags(DemoModeConfig, DEMO_MODE_FLAGS, into="demo_fields", section="demo_modes")
@config_flags(WeightNightConfig, WEIGHT_FLAGS, into="weight_fields", section="weight_training")
@config_flags(WeakConfig, WEAK_FLAGS, into="weak_fields", section="weak")
@config_flags(DreamConfig, DREAM_FLAGS, into="dream_fields", section="dream")
@config_flags(MinerConfig, MINER_FLAGS, into="miner_fields", section="miner")
@config_flags(Stops, STOP_FLAGS, into="stop_fields", section="stops")
def sleep_run_cmd(
    night_fields: dict[str, Any],
    skill_fields: dict[str, Any],
    split_fields: dict[str, Any],
    demo_fields: dict[str, Any],
    weight_fields: dict[str, Any],
    weak_fields: dict[str, Any],
    dream_fields: dict[str, Any],
    miner_fields: dict[str, Any],
    stop_fields: dict[str, Any],
    run_config: EffectiveConfig,
    project: NightProjectOpt = None,
    model: NightModelOpt = None,
    optimizer_model: Annotated[str | None, typer.Option(help="Analyst model spec.")] = None,
    judge_model: NightJudgeOpt = None,
    log: LogOpt = None,
    since: SinceOpt = None,
    gate: Annotated[str, typer.Option(help="on | off (off: accept greedily, reported).")] = "on",
    gate_metric: GateMetricOpt = None,
    gate_margin: GateMarginOpt = GateConfig.margin,
    gate_confidence: GateConfidenceOpt = None,
    gate_tag_alpha: NightTagAlphaOpt = NIGHT_TRAINING.gate.tag_alpha,
    gate_tag_margin: GateTagMarginOpt = None,
    min_gain: MinGainOpt = None,
    objective: ObjectiveOpt = None,
    preferences: PreferencesOpt = None,
    documents: DocumentsOpt = ",".join(NightConfig.documents),
    budget_calls: BudgetCallsOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    budget_usd: BudgetUsdOpt = None,
    target_skill_path: TargetSkillOpt = None,
    seed: SeedOpt = NIGHT_TRAINING.seed,
    timeout: TimeoutOpt = CALL_TIMEOUT_S,
    api_key: ApiKeyOpt = None,
    dry_run: Annotated[bool, typer.Option(hidden=True)] = False,
    plan: PlanOpt = False,
    as_json: PlanJsonOpt = False,
    weight_max_seconds: LegacyWeightSecondsOpt = LEGACY_WEIGHT_SECONDS,
) -> None:
    """One night: learn from the log (mine → split → skill, then memory), stage a proposal.

    `sleep adopt` makes the proposal live; `sleep dry-run` does it all and stages nothing;
    `sleep plan` says what it would cost and calls no model."""
    weight_fields = legacy_weights(weight_fields, weight_max_seconds)
    gates = (gate_metric, gate_margin, gate_confidence, gate_tag_alpha, gate_tag_margin)
    training = night_training(
        **skill_fields,
        preferences=_preferences(preferences),
        gate=_night_gate(gate, *gates, min_gain, objective),
        budget=budget(budget_calls, budget_tokens, budget_usd),
        seed=seed,
        timeout_s=rollout_timeout(timeout),
    )
    config = NightConfig(
        **_night_fields(night_fields, stop_fields, dry_run),
        model=model,
        optimizer_model=optimizer_model,
        judge_model=judge_model,
        project=project,
        log_path=log,
        since=parse_time(since) if since else None,
        documents=tuple(d.strip() for d in documents.split(",") if d.strip()),
        target_skill_paths=tuple(target_skill_path or ()),
        training=training,
        **_nested(split_fields, demo_fields, weight_fields, weak_fields, dream_fields),
        miner=MinerConfig(**miner_fields),
        model_options=model_options(api_key, timeout, models=(model, optimizer_model, judge_model)),
        progress=console.is_terminal,
    )
    if plan or as_json:
        return _print_plan(config, plan, as_json)
    _run_nights(config, dry_run, run_config)


def _run_nights(config: NightConfig, dry_run: bool, run_config: EffectiveConfig) -> None:
    """Each project's night, its effective config kept beside its report; exit 1 when one
    failed."""
    from selftaught.sleep.night.cycle import run_night
    from selftaught.sleep.night.plan import refuse_short_budget
    from selftaught.sleep.night.summary import print_outcomes

    refuse_short_budget(config)  # before any call: a budget that cannot gate one candidate
    outcomes = run_night(config, dry_run=dry_run, console=console)  # Busy: exit 3
    for kept in (o.night_dir for o in outcomes if o.night_dir is not None and not dry_run):
        run_config.keep(kept)  # beside its report
    print_outcomes(outcomes, out, dry_run=dry_run)
    if any(o.failed for o in outcomes):
        raise typer.Exit(1)


def _print_plan(config: NightConfig, plan: bool, as_json: bool) -> None:
    """`sleep plan`: each project's night before it runs (`sleep/night/plan.py`); a local
    model's raw decode rate is measured here first (as `selftaught doctor` does)."""
    from selftaught.sleep.night.plan import plan_lines, plan_night, plan_table

    if not plan:
        raise typer.BadParameter("--json goes with --plan (`sleep plan --json`)")

    def rate_of(spec: str) -> Any:
        from selftaught.doctor import local_path, measure_raw_rate

        console.print(f"measuring this machine's raw decode rate on {spec} ...")
        return measure_raw_rate(local_path(spec))

    for night in plan_night(config, rate_of=rate_of):
        if as_json:
            print(json_text(night.to_dict()))
            continue
        for line in plan_lines(night):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        if night.phases:
            out.print(plan_table(night))


def _night_fields(night: dict[str, Any], stops: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """NightConfig's own fields from their generated flags (a dry run adopts nothing)."""
    return {**night, "auto_adopt": night["auto_adopt"] and not dry_run, "stops": Stops(**stops)}


def _nested(
    split: dict[str, Any],
    demos: dict[str, Any],
    weights: dict[str, Any],
    weak: dict[str, Any],
    dream: dict[str, Any],
) -> dict[str, Any]:
    """The night's nested configs from their generated flags."""
    return {
        "split": SplitConfig(**split),
        "demo_modes": DemoModeConfig(**demos),
        "weight_training": WeightNightConfig(**weights),
        "weak": WeakConfig(**weak),
        "dream": DreamConfig(**dream),
    }


def legacy_weights(weights: dict[str, Any], seconds: float) -> dict[str, Any]:
    """--weight-max-seconds, as a crontab line written before --weight-max-minutes holds it."""
    if seconds == LEGACY_WEIGHT_SECONDS:
        return weights
    return {**weights, "adapter_max_minutes": seconds / 60}


def _night_gate(
    gate: str,
    metric: str | None,
    margin: float,
    confidence: float | None,
    tag_alpha: float | None,
    tag_margin: float | None,
    min_gain: float | None = None,
    objective: str | None = None,
) -> GateConfig:
    """The night's gate from `--gate on|off` and the gate options (`--gate-tag-alpha 0`: the
    per-kind veto off; `--objective score,tokens`: a tie on score goes to the cheaper)."""
    if gate not in ("on", "off"):
        raise typer.BadParameter(f"--gate must be on or off, not {gate!r}")
    veto = {"tag_alpha": tag_alpha or None, "tag_margin": tag_margin}
    aims = tuple(a.strip() for a in (objective or "score").split(",") if a.strip())
    cfg = gate_config(metric, margin, confidence, **veto, min_gain=min_gain, objective=aims)
    return dataclasses.replace(cfg, accept_all=gate == "off")


def night_training(**settings: Any) -> Any:
    """A night's SkillOpt settings: its own defaults with what the user set."""
    try:
        return dataclasses.replace(NIGHT_TRAINING, **settings)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


PRESETS = ("dry_run", "plan")


def _run_with(fn: F, flag: str, doc: str) -> F:
    """`sleep run` with `flag` set (one of `PRESETS`, each hidden): `sleep dry-run`
    (--dry-run: nothing staged), `sleep plan` (--plan: nothing called). The same options,
    one place."""
    import inspect

    sig = inspect.signature(fn, eval_str=True)  # typer reads the Annotated options from it
    hidden = Annotated[bool, typer.Option(hidden=True)]
    params = [
        p.replace(default=p.name == flag, annotation=hidden) if p.name in PRESETS else p
        for p in sig.parameters.values()
    ]

    @functools.wraps(fn)
    def preset(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    preset.__dict__["__signature__"] = sig.replace(parameters=params)  # what inspect reads
    preset.__doc__ = doc
    return cast(F, preset)


sleep_app.command("dry-run")(
    _run_with(
        sleep_run_cmd,
        "dry_run",
        "Everything `sleep run` does, staging nothing: prints the report, keeps no trace.",
    )
)
sleep_app.command("plan")(
    _run_with(
        sleep_run_cmd,
        "plan",
        "What a night would cost before it runs: tasks, calls per phase, tokens, time, USD.\n\n"
        "The night's model-free phases run on the log (window, mining, split, kinds); the model "
        "phases are counted from the options. Calls no model, writes nothing.",
    )
)


# many skills (nightskills): `sleep adopt / rollback --skill NAME` act on that skill's unit
SkillOpt = Annotated[
    str | None,
    typer.Option(
        "--skill",
        help="One of the project's skills (a night with --skills): adopt or roll back it alone.",
    ),
]


@sleep_app.command("adopt")
@friendly_errors
def sleep_adopt_cmd(
    night: Annotated[
        str | None, typer.Argument(help="Night id (default: the latest staged).")
    ] = None,
    project: AdoptProjectOpt = DEFAULT_PROJECT,
    force: Annotated[
        bool, typer.Option(help="Adopt over a version it was not gated against.")
    ] = False,
    target_skill_path: TargetSkillOpt = None,
    follow_symlinks: FollowSymlinksOpt = False,
    place: PlaceOpt = None,
    allow_global: AllowGlobalOpt = False,
    skill: SkillOpt = None,
) -> None:
    """Make a night's proposal the adopted skill and memory (atomically, with a backup)."""
    from selftaught.sleep.adoption.placement import PlacementTarget
    from selftaught.sleep.adoption.write_back import adopt_night

    targets = [
        PlacementTarget.parse(spec, allow_global=allow_global, follow_symlinks=follow_symlinks)
        for spec in place or ()
    ]  # checked before anything is adopted
    if skill is not None:  # one of the project's many skills, in its own unit
        from selftaught.sleep.adoption.skill_units import adopt_skill

        done = adopt_skill(project, skill, night, force=force)
        out.print(
            f"{project}: adopted skill {skill} of night {done.night} as its version "
            f"{done.version} (was {done.previous}; backup {done.backup})"
        )
        _print_written_back(done)
        if targets and not _place_adopted(project, targets, skill):
            raise typer.Exit(1)
        return
    done = adopt_night(  # writes a --start-document night's skill back into that file
        project,
        night,
        force=force,
        target_paths=tuple(target_skill_path or ()),
        follow_symlinks=follow_symlinks,
    )
    out.print(
        f"{project}: adopted night {done.night} as version {done.version} (was {done.previous}; "
        f"backup {done.backup})" + "".join(f"\n  wrote {p}" for p in done.live_files)
    )
    _print_written_back(done)
    if targets and not _place_adopted(project, targets):
        raise typer.Exit(1)


def _print_written_back(done: Any) -> bool:
    """The user's files an adopt wrote back (with the diff) or a rollback restored; False when
    one was left as it is (the user changed it, or a symlink now leads to it)."""
    for w in done.written_back:
        out.print(f"  wrote back {w.path} (previous bytes in {w.backup or '-'})", markup=False,
                  soft_wrap=True)  # fmt: skip
        if w.diff:
            out.print(w.diff.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    for f in done.restored:
        why = f": {f.reason}" if f.reason else ""
        out.print(f"  {f.action} {f.path}{why}", markup=False, soft_wrap=True)
    if done.note:
        out.print(f"  note: {done.note}", markup=False, soft_wrap=True)
    return not any(f.action in ("skipped-user-changed", "refused") for f in done.restored)


def _place_adopted(project: str, targets: list[Any], name: str | None = None) -> bool:
    """Place the adopted skill (or the project's skill `name`) in each target, or take it
    away when nothing is adopted (a rollback to version 0); False when a file was refused or
    skipped."""
    from selftaught.sleep.adoption.placement import (
        adopted_skill_file,
        place_skills,
        unplace_skills,
    )
    from selftaught.sleep.adoption.staging import read_adopted_files

    if name is not None:  # many skills: that skill's card and adopted body
        from selftaught.skill.skill_md import SkillFile
        from selftaught.sleep.adoption.skill_units import adopted_skills

        found = [SkillFile(s.card, s.body) for s in adopted_skills(project) if s.name == name]
        skill = found[0] if found else None
    else:
        skill = adopted_skill_file(project, read_adopted_files(project))
    ok = True
    for target in targets:
        if skill is None:  # nothing adopted: the file (or section) placed before goes
            from selftaught.skill.routing import slug_name

            result = unplace_skills([name or slug_name(project)], target)
        else:
            result = place_skills([skill], target)
        for f in result.files:
            ok = ok and f.action in ("written", "unchanged", "removed")
            why = f": {f.reason}" if f.reason else ""
            out.print(f"  {f.action} {f.path}{why}", soft_wrap=True, markup=False)
        if result.backup:
            out.print(f"  (placement backup {result.backup})", soft_wrap=True, markup=False)
    return ok


@sleep_app.command("rollback")
@friendly_errors
def sleep_rollback_cmd(
    version: Annotated[
        int | None, typer.Argument(help="Version (default: the previous one).")
    ] = None,
    project: AdoptProjectOpt = DEFAULT_PROJECT,
    target_skill_path: TargetSkillOpt = None,
    follow_symlinks: FollowSymlinksOpt = False,
    skill: SkillOpt = None,
    place: PlaceOpt = None,
    allow_global: AllowGlobalOpt = False,
) -> None:
    """Return to an earlier adopted version (0: nothing adopted).

    A user's file an undone version was written back into gets its previous bytes (unless it
    changed since); with --place, the version returned to is placed again (version 0: the
    placed file is removed), never over a file the user changed."""
    from selftaught.sleep.adoption.placement import PlacementTarget
    from selftaught.sleep.adoption.write_back import rollback_unit

    targets = [
        PlacementTarget.parse(spec, allow_global=allow_global, follow_symlinks=follow_symlinks)
        for spec in place or ()
    ]  # checked before anything is rolled back
    if skill is not None:  # that skill only; the project's other skills stay as they are
        from selftaught.sleep.adoption.skill_units import rollback_skill

        done = rollback_skill(project, skill, version)
        out.print(f"{project}: skill {skill} is at version {done.version} (was {done.previous})")
    else:
        done = rollback_unit(
            project,
            version,
            target_paths=tuple(target_skill_path or ()),
            follow_symlinks=follow_symlinks,
        )
        out.print(f"{project}: version {done.version} is adopted again (was {done.previous})")
    ok = _print_written_back(done)
    if targets and not _place_adopted(project, targets, skill):
        ok = False
    if not ok:
        raise typer.Exit(1)


@sleep_app.command("history")
@friendly_errors
def sleep_history_cmd(
    project: AdoptProjectOpt = DEFAULT_PROJECT,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON object per version, then per night (for jq)."),
    ] = False,
) -> None:
    """Adopted versions with their val scores, and the project's nights."""
    from selftaught.sleep.night.summary import history_rows, history_tables

    if as_json:
        for row in history_rows(project):
            print(json_text(row))
        return
    for table in history_tables(project):
        out.print(table)


@sleep_app.command("status")
@friendly_errors
def sleep_status_cmd(project: NightProjectOpt = None, log: LogOpt = None) -> None:
    """The last night, the staged proposal, the adopted version, its probation and the schedule.

    A night still running is shown too."""
    from selftaught.sleep.night.summary import status_lines

    for line in status_lines(project, log_path=log):
        out.print(line, soft_wrap=True, markup=False)


@sleep_app.command("resume")
@friendly_errors
def sleep_resume_cmd(project: NightProjectOpt = None) -> None:
    """Resume a schedule that `--patience` paused (every paused project by default)."""
    from selftaught.sleep import pause
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.paths import sleep_home

    home = sleep_home()
    resumed = [
        name
        for name in ([project] if project else staging.projects(home))
        if pause.read(name, home).paused is not None and pause.resume(name, home)
    ]
    for name in resumed:
        out.print(f"{name}: schedule resumed; the next scheduled night runs it", markup=False)
    if not resumed:
        out.print("no paused schedule to resume", markup=False)


@sleep_app.command("probation")
@friendly_errors
@config_flags(ProbationConfig, PROBATION_FLAGS, into="probation_fields")
def sleep_probation_cmd(
    probation_fields: dict[str, Any],
    project: AdoptProjectOpt = DEFAULT_PROJECT,
    log: LogOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object: every version, the verdicts.")
    ] = False,
    auto_rollback: Annotated[
        bool,
        typer.Option(
            help="On a drop, roll back to the version replaced (an auto_rollback event); a "
            "version adopted from a --no-val night is rolled back on a drop without it."
        ),
    ] = False,
) -> None:
    """Each adopted version's live record, and the adopted version against the one it replaced.

    The record: requests, outcomes, success rate with its 95% interval; the comparison is on
    traffic neither version was trained on."""
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import maybe_roll_back, probation_for, status_lines

    result = probation_for(project, TaskLog(log), config=ProbationConfig(**probation_fields))
    done = maybe_roll_back(project, result, by="cli", asked=auto_rollback)
    if as_json:
        rolled = {"from": done.previous, "to": done.version} if done else None
        print(json_text({**result.to_dict(), "rolled_back": rolled}))
        return
    from selftaught.sleep.intake.probation import version_table

    out.print(version_table(result))
    for line in status_lines(result, project):
        out.print(line.strip(), soft_wrap=True, markup=False)
    if done is not None:
        out.print(f"{project}: rolled back to version {done.version} (was {done.previous})")
    elif auto_rollback and result.drop:
        out.print("not rolled back: the adopted version changed, or you brought it back by hand")


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

    sleep_run_cmd_click = typer.main.get_group(sleep_app).commands["run"]
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
