"""Make the README's report screenshot (docs/report.png) with headless Chromium.

    python docs/report_screenshot.py                 # a scripted-model optimize run (seconds)
    python docs/report_screenshot.py RUN_DIR         # any optimize / train run directory

Needs Debian's `chromium` and the `playwright` package (the dev extra); no browser download."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def scripted_run(root: Path) -> Path:
    """SkillOpt on the toy task with the scripted rule target and analyst: rules that help,
    one poisonous edit the gate rejects, and steps where the analyst has nothing left."""
    sys.path.insert(0, str(ROOT))
    from selftaught.skill import SkillOptConfig, SkillTrainer
    from tests.scripted import POISON, ToyTask, canned_analyst, rule_target, schedule_of_rules

    task = ToyTask(
        train={"alpha": 6, "beta": 5, "gamma": 3, "delta": 2},
        val={"alpha": 10, "beta": 8, "gamma": 6, "delta": 3, "epsilon": 3},
        test={"alpha": 16, "beta": 12, "gamma": 8, "delta": 4, "epsilon": 4},
    )
    analyst = canned_analyst(
        failure=schedule_of_rules("rule delta", "rule alpha", POISON, "rule beta", "rule gamma")
    )
    config = SkillOptConfig(epochs=2, batch_size=4, concurrency=4)
    initial = "# Arithmetic skill\nReply as 'Answer: N'.\n"
    SkillTrainer(
        config, task, rule_target(), analyst, initial, output_dir=root, progress=False
    ).train()
    return root


def screenshot(run_dir: Path, png: Path, width: int = 1280, height: int = 1500) -> None:
    from playwright.sync_api import sync_playwright

    from selftaught.report import write_report

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium binary: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        page_path = write_report(run_dir, Path(tmp) / "report.html")
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(Path(tmp) / "profile"),
                executable_path=chromium,
                headless=True,
                args=LAUNCH_ARGS,
                viewport={"width": width, "height": height},
            )
            page = browser.new_page()
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(png))
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path, help="default: a scripted-model run")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "report.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or scripted_run(Path(tmp) / "optimize-toy")
        screenshot(run_dir, args.output)
    print(args.output)


if __name__ == "__main__":
    main()
