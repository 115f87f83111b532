"""The window phase: what the night reads of its window, capped by `max_tasks` interactions and
`max_sessions` transcript sessions (what the caps leave waits for the next night), no client
holding more than its fair share (`max_client_share`, `window.py`: its rows over it are left
out)."""

from __future__ import annotations

from selftaught.runs import (
    atomic_write_text,
)
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.night.config import NightConfig
from selftaught.sleep.night.phases.context import NightContext, Phase
from selftaught.sleep.night.window import take_fairly
from selftaught.sleep.records import (
    ClientWindow,
    WindowRecord,
)
from selftaught.sleep.result import ROWS_READ_FILE, NightDraft


class WindowPhase(Phase):
    """Keep what the night reads of the window's rows (`ctx.rows`), record the ids it read
    (a forget --everywhere finds the night by them, never by its words)."""

    name = "window"

    def run(self, ctx: NightContext) -> WindowRecord:
        night = ctx.night
        ctx.rows = _take_window(night, ctx.rows, ctx.since, ctx.until, ctx.config)
        atomic_write_text(ctx.night_dir / ROWS_READ_FILE, "".join(f"{it.id}\n" for it in ctx.rows))
        assert night.window is not None
        return night.window


def _take_window(
    night: NightDraft, rows: list[Interaction], since: float, until: float, config: NightConfig
) -> list[Interaction]:
    """The rows this night reads (the caps may leave the newest for the next night, a client's
    rows over its share are left out)."""
    take = take_fairly(rows, config.max_tasks, config.max_sessions, config.max_client_share)
    taken, capped = take.rows, take.capped
    night.window = WindowRecord(
        since=since,
        until=until,
        read=len(taken),
        capped=capped,
        max_client_share=config.max_client_share,
        allowance=take.allowance,
        share=take.share,
        clients={
            c: ClientWindow(window=n, read=take.read[c], left_out=take.left_out[c])
            for c, n in take.window.most_common()
        },
    )
    night.consumed_until = taken[-1].created_at + 1e-6 if capped and taken else until
    for client, n in take.left_out.items():
        night.note(
            f"client {client!r} sent {take.window[client]} of the window's {len(rows)} "
            f"interactions: {take.read[client]} read, {n} left out over its share "
            f"({take.allowance} rows, {take.share:.0%} of the night)"
        )
    if capped:
        waiting = len(rows) - len(taken) - sum(take.left_out.values())
        night.note(f"stopped reading at {capped}: {waiting} interactions wait for the next night")
    return taken
