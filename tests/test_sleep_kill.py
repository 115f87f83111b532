"""kill -9 in the middle of a night (a real `selftaught sleep run` process): the task log, the
adopted skill and the staging folder stay consistent, the lock is free, and the next night
runs, marks the killed one interrupted and reads its interactions again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import TaskLog
from selftaught.sleep.lock import read_holder
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.paths import read_adopted
from tests.fake_upstream import FakeUpstream
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models
from tests.test_sleep_night_cli import answer

SRC = str(Path(__file__).resolve().parents[1] / "src")


def slow_answer(messages: list[dict]) -> str:
    time.sleep(0.15)
    return answer(messages)


def test_kill_9_mid_night_leaves_everything_consistent_and_the_next_night_runs(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (first,) = run_night(config(tmp_path), models=models())
    staging.adopt("demo", home=tmp_path)  # version 1 is live before the killed night
    fill_log(tmp_path, ALPHA_NIGHT, start=100)
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "SELFTAUGHT_HOME": str(tmp_path),
        "SELFTAUGHT_LOG": str(tmp_path / "log.db"),
    }
    with FakeUpstream(slow_answer) as server:
        cmd = ["sleep", "run", "--model", f"{server.base_url}#fake-model", "--concurrency", "1"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "selftaught", *cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                evidence = [
                    p
                    for p in staging.nights_dir("demo", tmp_path).glob("*/evidence.jsonl")
                    if p.parent != first.night_dir
                ]
                if evidence and len(evidence[0].read_text().splitlines()) >= 3:
                    break  # the night is replaying
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the night never started replaying"
                time.sleep(0.05)
            assert read_holder(tmp_path)["pid"] == proc.pid  # it holds the lock
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    log = TaskLog(tmp_path / "log.db")
    assert log.integrity_check() == "ok" and log.count() == 2 * len(ALPHA_NIGHT)
    adopted = read_adopted("demo", tmp_path)
    assert adopted.version == "1" and adopted.skill.strip() == "rule alpha"
    assert staging.adopted_consistent("demo", tmp_path)
    assert read_holder(tmp_path) is None  # the kernel released the lock
    killed_dir = staging.list_nights("demo", tmp_path)[-1][0]
    killed = staging.read_report(killed_dir)  # complete JSON: every write is atomic
    assert killed["status"] == "running" and not (killed_dir / "proposal").exists()
    try:
        staging.adopt("demo", killed_dir.name, home=tmp_path)
        raise AssertionError("a killed night must not be adoptable")
    except staging.StagingError as err:
        assert "nothing to adopt (status running" in str(err)

    from selftaught.sleep.night.summary import status_lines

    shown = " ".join(status_lines("demo", tmp_path))
    assert f"last night {killed_dir.name}: interrupted" in shown and "running now" not in shown
    (night,) = run_night(config(tmp_path), models=models())
    assert staging.read_report(killed_dir)["status"] == "interrupted"
    assert night.window.read == len(ALPHA_NIGHT)  # the killed night's rows again
    assert night.status in ("staged", "no_proposal") and not night.failed
