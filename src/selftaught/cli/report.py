"""`report`: an HTML page of a run directory; `watch`: the same, live, on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from selftaught.cli.common import (
    app,
    console,
    friendly_errors,
    out,
)

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.report.live import DEFAULT_INTERVAL_S


# ---- report ---------------------------------------------------------------------------------
@app.command("report")
@friendly_errors
def report_cmd(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="Run directory of optimize (also --skills) or train, or a night's folder "
            "(HOME/projects/P/nights/N)."
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="HTML file to write (default RUN_DIR/report.html)."),
    ] = None,
    open_page: Annotated[
        bool, typer.Option("--open", help="Open the page in the web browser.")
    ] = False,
) -> None:
    """A self-contained HTML report of a run, also of one still in progress.

    Learning curves with 95% intervals, gate decisions, edits, skill diffs, usage, failures,
    config."""
    import webbrowser

    from selftaught.report import write_report

    if (run_dir / "clusters.json").is_file():  # `optimize --skills`: one report per skill
        _skill_set_report(run_dir)
        return
    path = write_report(run_dir, output)
    out.print(str(path))
    if open_page and not webbrowser.open(path.resolve().as_uri()):
        console.print(f"no web browser found; open {path} yourself")


def _skill_set_report(run_dir: Path) -> None:
    """A skill set's table (once finished) and each skill run's own report page."""
    from selftaught.cli.optimize import print_skill_set
    from selftaught.report import write_report
    from selftaught.runs import read_json
    from selftaught.skill.skillset import SkillSetResult

    if (run_dir / "result.json").is_file():
        print_skill_set(SkillSetResult.from_dict(read_json(run_dir / "result.json")))
    else:
        console.print(f"{run_dir}: a skill set still in progress (no result.json yet)")
    for sub in sorted(p for p in (run_dir / "skills").glob("*") if (p / "config.json").is_file()):
        out.print(str(write_report(sub, None)))


# ---- watch ----------------------------------------------------------------------------------
@app.command("watch")
@friendly_errors
def watch_cmd(
    run_dir: Annotated[
        Path, typer.Argument(help="Run directory of optimize or train, or a night's folder.")
    ],
    port: Annotated[
        int, typer.Option(help="Port on 127.0.0.1 (0: a free one, printed).", min=0, max=65535)
    ] = 0,
    interval: Annotated[
        float, typer.Option(help="Seconds between the page's polls.", min=0.1)
    ] = DEFAULT_INTERVAL_S,
    open_page: Annotated[
        bool, typer.Option("--open", help="Open the page in the web browser.")
    ] = False,
) -> None:
    """A live page of a run on 127.0.0.1, updated as the run writes its history.

    Steps, candidates, gate decisions, the val curve and the budget used; every text redacted;
    loopback only (a foreign Host or Origin is refused). The page says "finished" at the end."""
    import webbrowser

    from selftaught.report.live import serve_watch

    def ready(url: str) -> None:
        out.print(url)
        console.print(f"watching {run_dir} at {url} (Ctrl-C stops)")
        if open_page and not webbrowser.open(url):
            console.print(f"no web browser found; open {url} yourself")

    serve_watch(run_dir, port=port, interval_s=interval, on_ready=ready)
