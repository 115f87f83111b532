"""`selftaught report RUN_DIR`: a self-contained HTML page for an optimize or train run
(learning curves with 95% intervals, gate decisions, each step's candidates and their fate,
the shipped worked examples, edits and their reasons, skill diffs, usage per role, failures
with the scorer's feedback, config). No script and no network at view time: charts are
inline SVG, styles inline.

    from selftaught.report import write_report
    path = write_report("runs/optimize/gym-basic_arithmetic_max_terms_2_max_digits_1")
    # → .../report.html
"""

from __future__ import annotations

from pathlib import Path

from selftaught.errors import writing_to
from selftaught.report.html import Html, page
from selftaught.report.readers import ReportError, RestRun, Run, SkillRun, detect_kind, load_run
from selftaught.report.skill_page import skill_page
from selftaught.report.train_pages import rest_page, rl_page
from selftaught.runs import atomic_write_text

DEFAULT_NAME = "report.html"


def render_body(run: Run) -> tuple[str, Html]:
    """(page title, body) for any run the adapters read."""
    if isinstance(run, SkillRun):
        return skill_page(run)
    if isinstance(run, RestRun):
        return rest_page(run)
    return rl_page(run)


def render_report(run_dir: str | Path) -> str:
    """The HTML page for the run in `run_dir` (whatever exists so far)."""
    title, body = render_body(load_run(run_dir))
    return page(title, body)


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the page (atomically) to `output`, default RUN_DIR/report.html; returns the path."""
    html = render_report(run_dir)
    path = Path(output) if output is not None else Path(run_dir) / DEFAULT_NAME
    if path.is_dir():
        raise ReportError(f"--output {path} is a directory; give a file name")
    with writing_to(path, "the report"):
        atomic_write_text(path, html)
    return path


__all__ = [
    "DEFAULT_NAME",
    "ReportError",
    "detect_kind",
    "load_run",
    "render_report",
    "write_report",
]
