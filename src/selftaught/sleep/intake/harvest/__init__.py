"""Ways real traffic gets into the task log besides the proxy and `log_interaction`: a JSONL
import (`import_jsonl`) and one harvester per coding agent's transcripts (`claude_code`,
`codex`).

A harvester turns each user request of a session into one interaction (the request, a little
of the conversation before it, and the agent's final answer), with a lookback window and
per-run caps. The tool calls the agent made in the turn are kept in the row (`tool_calls`, in
the OpenAI shape, arguments as JSON) with their results (`meta["tool_results"]`: the call's
id, its output cut at `RESULT_CHARS`, whether it failed); `meta["tools"]` names the tools
used. Without the tools' schemas (transcripts do not hold them) such a row is replayed as a
plain task. Harvesting is idempotent: each row carries a dedupe key per source message, so
running it again adds only what is new. Transcripts hold private code, so every harvested row
is marked `private`: part 2 never sends it to a remote model unless the row is reviewed or
the user passes --allow-remote. A torn or malformed transcript line (the agent may be writing
the file right now) is skipped and reported with its file and line.
"""

from __future__ import annotations

from pathlib import Path

from selftaught.errors import InputError
from selftaught.sleep.intake.harvest.common import HarvestConfig, Harvester, HarvestReport
from selftaught.sleep.intake.log import Interaction, TaskLog

__all__ = [
    "HarvestConfig",
    "HarvestReport",
    "Harvester",
    "harvest",
    "harvesters",
    "resolve_sources",
]


def harvesters() -> dict[str, Harvester]:
    from selftaught.sleep.intake.harvest.claude_code import ClaudeCodeHarvester
    from selftaught.sleep.intake.harvest.codex import CodexHarvester

    found: list[Harvester] = [ClaudeCodeHarvester(), CodexHarvester()]
    return {h.name: h for h in found}


def resolve_sources(source: str) -> list[str]:
    """`auto` means every harvester whose transcript folder exists here."""
    known = harvesters()
    if source == "auto":
        return [name for name, h in known.items() if h.default_root().is_dir()]
    if source not in known:
        raise InputError(f"unknown source {source!r}; valid: auto, {', '.join(known)}")
    return [source]


def harvest(
    source: str, log: TaskLog, config: HarvestConfig | None = None, root: Path | None = None
) -> HarvestReport:
    """Read one source's sessions (newest first) into the log, within the window and caps."""
    config = config or HarvestConfig()
    harvester = harvesters()[source]
    root = Path(root).expanduser() if root else harvester.default_root()
    report = HarvestReport(source, str(root))
    cutoff = config.cutoff()
    rows: list[Interaction] = []
    files = sorted(harvester.session_files(root), key=_mtime, reverse=True)
    for path in files:
        if _mtime(path) < cutoff:  # written before the window (or gone): nothing new in it
            report.sessions_too_old += 1
            continue
        if report.sessions_read >= config.max_sessions:
            report.capped = "max-sessions"
            break
        if len(rows) >= config.max_tasks:
            report.capped = "max-tasks"
            break
        report.sessions_read += 1
        found = [
            it for it in harvester.read_session(path, config, report) if it.created_at >= cutoff
        ]
        room = config.max_tasks - len(rows)
        if len(found) > room:
            found, report.capped = found[len(found) - room :], "max-tasks"  # keep the newest
        rows.extend(found)
    report.found = len(rows)
    report.inserted = log.add_many(rows)
    return report


# ---- helpers ------------------------------------------------------------------------------


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # deleted since it was listed
        return -1.0
