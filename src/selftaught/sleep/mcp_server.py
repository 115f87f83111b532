"""`selftaught mcp`: an MCP server (stdio) a coding agent runs to talk to its own sleep.

Three tools, and nothing that changes what the agent serves (no adopt, no rollback):

- `give_feedback`: thumbs, a corrected reference and/or a comment on the current session's
  last answered turn. The session is the `session_id` the agent passes, else the session that
  started the server (Claude Code sets CLAUDE_CODE_SESSION_ID in an MCP server's
  environment; Codex gives its shell commands CODEX_THREAD_ID), else the newest session logged
  in the project. A session whose transcript is on this machine is harvested first (only what
  is new; the turn still running, the one calling this tool, is left out), so feedback works
  without the proxy; a session neither logged nor on disk is an error that says so.

A project is a wall: the server acts on its own project only. A session is found only among
the project's rows, and a transcript is harvested only when its session ran in the server's
folder (the repository the agent started it in): a session of another project or repository
gets the same answer as one that does not exist, and nothing of it is returned or stored.
The agent calling the tool may have read untrusted content (a web page, an issue) that
steers it, so its feedback is evidence: stored untrusted (giver `mcp`) unless the operator
starts the server with `trust_feedback` (`selftaught mcp --trust-feedback`).
- `adopted_skill`: the project's adopted skill, memory and version (`read_adopted`).
- `last_night_report`: the status and report of the project's last night.

Errors (bad input, nothing logged, no night yet) come back as MCP tool errors with one
sentence. Needs the `mcp` extra (the official SDK, `mcp.server.mcpserver.MCPServer`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from selftaught.errors import InputError, MissingDependency, SelftaughtError
from selftaught.sleep.intake.harvest.common import project_from_cwd
from selftaught.sleep.intake.hooks import (
    AGENTS,
    find_transcript,
    harvest_session,
    last_answered_turn,
)
from selftaught.sleep.intake.log import (
    USER_FIELDS,
    Feedback,
    Interaction,
    LogFilter,
    TaskLog,
    as_thumb,
    iso_utc,
)
from selftaught.sleep.intake.sessions import check_session_id
from selftaught.sleep.intake.storable import storable
from selftaught.sleep.paths import check_project, read_adopted

SERVER_NAME = "selftaught"
GIVER = "mcp"
SESSION_ENV = ("CLAUDE_CODE_SESSION_ID", "CODEX_THREAD_ID")  # what the agents set for children
REPORT_CHARS = 20_000  # a longer night report is cut (the file has it all)
NEWEST_SESSION_ROWS = 200  # rows read back to find the project's newest session
INSTRUCTIONS = (
    "selftaught learns from this agent's past sessions at night. Use give_feedback when the "
    "user says an answer of this session was good or wrong (pass the correct answer as "
    "reference when they give one); adopted_skill shows what the agent has learned; "
    "last_night_report shows what the last night did. Nothing here adopts or rolls back."
)
T = TypeVar("T")


class NothingLogged(InputError):
    """The session asked about has no row in the log and no transcript on this machine."""


@dataclass
class SleepTools:
    """What the MCP tools do, without MCP: each method returns a JSON-able dict or raises a
    `SelftaughtError` whose message the agent sees."""

    project: str
    log_path: str | Path | None = None  # a file, or a postgresql:// URL
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    folder: Path = field(default_factory=Path.cwd)
    """The repository this server serves: only transcripts of sessions that ran here are
    harvested."""
    trust_feedback: bool = False
    """Store the agent's feedback as the operator's (trusted); by default it is evidence."""

    def __post_init__(self) -> None:
        check_project(self.project)

    # -- feedback
    def give_feedback(
        self,
        thumb: str | None = None,
        reference: str | None = None,
        comment: str | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        # what the agent sends is hostile bytes: a lone surrogate or a NUL is stored as
        # U+FFFD, as the proxy stores it (`storable`), never an encoding error
        (reference, comment), _ = storable([reference, comment])
        fb = Feedback(thumb=as_thumb(thumb), reference=reference, comment=comment)
        if fb.empty():
            raise InputError("feedback is empty: give a thumb, a reference or a comment")
        with TaskLog(self.log_path) as log:
            sid, how = self._session(session_id, log)
            harvested = self._harvest(sid, log)
            turn = last_answered_turn(log, sid, self.project)
            if turn is None:  # one answer whether it is elsewhere or nowhere (no oracle)
                raise NothingLogged(
                    f"nothing is logged for session {sid} in project {self.project}: no row "
                    "of it in the log and no Claude Code or Codex transcript of it from this "
                    "folder (run the agent through `selftaught proxy`, or give feedback from "
                    "the machine and folder it ran in)"
                )
            log.add_feedback(turn.id, fb, giver=GIVER, trusted=self.trust_feedback)
        return {
            "attached_to": turn.id,
            "session_id": sid,
            "session_from": how,
            "project": turn.project,
            "turn": _turn_summary(turn),
            "feedback": {k: v for k, v in fb.to_dict().items() if k in USER_FIELDS},
            "trusted": self.trust_feedback,
            "harvested_new_turns": harvested,
        }

    def _session(self, given: str | None, log: TaskLog) -> tuple[str, str]:
        """The session id and where it came from."""
        if given:
            return check_session_id(given.strip()), "argument"
        for name in SESSION_ENV:
            if self.env.get(name):
                return check_session_id(self.env[name]), name
        for row in log.query(LogFilter(project=self.project, limit=NEWEST_SESSION_ROWS)):
            if row.session_id:
                return row.session_id, f"newest session logged in project {self.project}"
        raise NothingLogged(
            f"no agent session is logged in project {self.project!r}; pass session_id "
            "(Claude Code: $CLAUDE_CODE_SESSION_ID, Codex: $CODEX_THREAD_ID)"
        )

    def _harvest(self, session_id: str, log: TaskLog) -> int:
        """Bring what is new of the session's transcript (if on this machine and its session
        ran in this server's folder) into the log."""
        new = 0
        for agent in AGENTS:
            path = find_transcript(agent, session_id)
            if path is not None:
                done = harvest_session(
                    agent,
                    log,
                    transcript=path,
                    project=self.project,
                    leave_open_turn=True,
                    folder=self.folder,
                )
                new += done.inserted
        return new

    # -- reading
    def adopted_skill(self) -> dict[str, Any]:
        adopted = read_adopted(self.project)
        return {
            "project": self.project,
            "version": adopted.version,
            "skill": adopted.skill,
            "memory": adopted.memory,
            "adapter": str(adopted.adapter) if adopted.adapter else None,
        }

    def last_night_report(self) -> dict[str, Any]:
        from selftaught.sleep.adoption.staging import current_version, list_nights
        from selftaught.sleep.night.summary import render_markdown

        nights = list_nights(self.project)
        if not nights:
            raise InputError(f"project {self.project!r} has not been through a night yet")
        night_dir, night = nights[-1]
        md = night_dir / "report.md"
        text = md.read_text(encoding="utf-8") if md.is_file() else render_markdown(night_dir, night)
        cut = len(text) > REPORT_CHARS
        return {
            "project": self.project,
            "night": night_dir.name,
            "status": night.status,
            "reason": night.reason,
            "adopted_version": current_version(self.project),
            "report": text[:REPORT_CHARS] + (f"\n[... cut; all of it in {md}]" if cut else ""),
        }


def _turn_summary(turn: Interaction) -> dict[str, Any]:
    reply = " ".join((turn.reply or "").split())
    return {
        "at": iso_utc(turn.created_at),
        "source": turn.source,
        "request": turn.prompt_head(120),
        "reply": reply if len(reply) <= 120 else reply[:119] + "…",
    }


# ---- the MCP server ------------------------------------------------------------------------


def _tool_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """A `SelftaughtError` becomes an MCP tool error carrying its sentence."""
    import functools

    from mcp.server.mcpserver.exceptions import ToolError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except SelftaughtError as err:
            raise ToolError(str(err)) from None

    return wrapper


_Tool = Callable[..., dict[str, Any]]
_Register = Callable[[_Tool], _Tool]  # what MCPServer.tool(...) returns: registers a tool


def build_server(tools: SleepTools) -> Any:
    """The MCP server for one project's tools (`mcp.server.mcpserver.MCPServer`)."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.types import ToolAnnotations
    except ImportError:
        raise MissingDependency(
            "the MCP server needs the official MCP SDK: pip install 'selftaught[mcp]'"
        ) from None
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, log_level="WARNING")
    # the decorators typed here: without the mcp extra the checker sees `server` as Any
    writing: _Register = server.tool(
        annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False)
    )
    reading: _Register = server.tool(
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False)
    )

    @writing
    @_tool_errors
    def give_feedback(
        thumb: Annotated[
            Literal["up", "down"] | None, Field(description="Was the answer good (up) or not?")
        ] = None,
        reference: Annotated[
            str | None, Field(description="The correct answer, when the user gave one.")
        ] = None,
        comment: Annotated[str | None, Field(description="What was right or wrong.")] = None,
        session_id: Annotated[
            str | None,
            Field(
                description="This session's id (Claude Code: $CLAUDE_CODE_SESSION_ID, Codex: "
                "$CODEX_THREAD_ID); default: the session that started this server."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Record the user's feedback on this session's last answered turn (for tonight's
        learning). Give at least one of thumb, reference, comment."""
        return tools.give_feedback(thumb, reference, comment, session_id)

    @reading
    @_tool_errors
    def adopted_skill() -> dict[str, Any]:
        """The skill and memory this project has adopted (what the agent is taught), and
        their version."""
        return tools.adopted_skill()

    @reading
    @_tool_errors
    def last_night_report() -> dict[str, Any]:
        """What the project's last night of learning did: status, reason and its report."""
        return tools.last_night_report()

    return server


def serve(
    project: str | None = None, log_path: str | Path | None = None, trust_feedback: bool = False
) -> None:
    """Run the server on stdio until the client closes it. The project defaults to the one
    transcripts from this folder are harvested into (its name, as `sleep harvest` names it);
    the folder it serves is the working one (where the agent started it)."""
    tools = SleepTools(
        project or project_from_cwd(os.getcwd()), log_path, trust_feedback=trust_feedback
    )
    build_server(tools).run("stdio")
