"""`mcp` and `sleep hook ...`: plugins for coding agents (an MCP server, session-end hooks)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from selftaught.cli.common import app, friendly_errors, out
from selftaught.cli.sleep import LogOpt, sleep_app

hook_app = typer.Typer(
    help="Session-end hooks: harvest an agent's session into the log as soon as it ends.",
    no_args_is_help=True,
)
sleep_app.add_typer(hook_app, name="hook")
AgentOpt = Annotated[str, typer.Option("--agent", help="claude-code | codex")]
ScopeOpt = Annotated[
    str,
    typer.Option(
        help="user (~/.claude/settings.json, $CODEX_HOME/config.toml) | project "
        "(./.claude/settings.json; Claude Code only)"
    ),
]


@app.command("mcp")
@friendly_errors
def mcp_cmd(
    project: Annotated[
        str | None,
        typer.Option(help="Project (default: the one this folder's sessions are harvested into)."),
    ] = None,
    log: LogOpt = None,
    trust_feedback: Annotated[
        bool,
        typer.Option(
            "--trust-feedback",
            help="Store the agent's feedback as the operator's (trusted). Default: evidence "
            "(untrusted), since the agent may have read untrusted content.",
        ),
    ] = False,
) -> None:
    """Run the MCP server (stdio) through which a coding agent gives feedback and reads its skill.

    The agent reads its adopted skill and last night's report there; it acts on this project
    and this folder's sessions only. Needs the `mcp` extra."""
    from selftaught.sleep.mcp_server import serve

    serve(project, log, trust_feedback)


@hook_app.command("install")
@friendly_errors
def hook_install_cmd(
    agent: AgentOpt,
    project: Annotated[
        str | None,
        typer.Option(help="Put harvested rows in this project (default: the session's folder)."),
    ] = None,
    scope: ScopeOpt = "user",
    log: LogOpt = None,
) -> None:
    """Register the agent's session-end hook in its settings file (idempotent).

    Other settings are kept; the original file is backed up once beside it."""
    from selftaught.sleep.intake.hook_install import Scope, install

    done = install(agent, scope=cast(Scope, scope), project=project, log=log)  # it checks scope
    what = "installed in" if done.changed else "already installed in"
    backup = f" (original backed up to {done.backup})" if done.backup else ""
    out.print(f"{agent}: hook {what} {done.path}{backup}", soft_wrap=True)


@hook_app.command("uninstall")
@friendly_errors
def hook_uninstall_cmd(agent: AgentOpt, scope: ScopeOpt = "user") -> None:
    """Remove our hook (only ours) from the agent's settings."""
    from selftaught.sleep.intake.hook_install import Scope, uninstall

    done = uninstall(agent, scope=cast(Scope, scope))  # it checks scope
    if not done.changed:
        out.print(f"{agent}: no selftaught hook in {done.path}", soft_wrap=True)
        return
    how = " (the original file is back)" if done.restored else ""
    out.print(f"{agent}: hook removed from {done.path}{how}", soft_wrap=True)


@hook_app.command("status")
@friendly_errors
def hook_status_cmd(
    folder: Annotated[
        Path | None, typer.Option(help="Project folder for the project scope (default: here).")
    ] = None,
) -> None:
    """Where a hook is installed, its command, and the last runs (from <home>/hooks.log)."""
    from selftaught.sleep.intake.hook_install import last_runs, states

    for found in states(folder):
        out.print(found.describe(), soft_wrap=True, markup=False, highlight=False)
    for line in last_runs():
        out.print(f"  last run: {line}", soft_wrap=True, markup=False, highlight=False)
