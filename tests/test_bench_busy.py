"""benchmarks/bench_busy.py's pure parts: the interleaved plan, resuming, the arms' settings and
the summary against the target (the benchmark itself runs on a quiet machine, not here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_busy  # noqa: E402


def test_arms_interleave_and_rotate_and_a_resume_skips_what_ran():
    order = bench_busy.plan(2)
    assert order == [
        (0, "alone"),
        (0, "busy"),
        (0, "busy_all_cores"),
        (1, "busy"),
        (1, "busy_all_cores"),
        (1, "alone"),
    ]
    ran = [{"repeat": 0, "arm": "alone"}, {"repeat": 0, "arm": "busy"}]
    assert bench_busy.pending(bench_busy.plan(3), ran)[:2] == [(0, "busy_all_cores"), (1, "busy")]
    assert len(bench_busy.pending(bench_busy.plan(3), ran)) == 7


def test_the_old_behaviour_fixes_torch_default_threads():
    base = {"PATH": "/bin", "SELFTAUGHT_THREADS": "1"}
    assert bench_busy.arm_env("busy", base, 8) == {"PATH": "/bin"}
    assert bench_busy.arm_env("busy_all_cores", base, 8)["SELFTAUGHT_THREADS"] == "8"
    command = bench_busy.eval_command(40, "/tmp/x.jsonl")
    assert command[:2] == ["selftaught", "eval"] and "--limit" in command
    assert command[command.index("--task") + 1] == "gym:basic_arithmetic?max_terms=2&max_digits=1"


def test_summary_medians_ratios_and_target():
    runs = [
        {"repeat": 0, "arm": "alone", "seconds": 60.0},
        {"repeat": 0, "arm": "busy", "seconds": 66.0},
        {"repeat": 0, "arm": "busy_all_cores", "seconds": 140.0},
        {"repeat": 1, "arm": "alone", "seconds": 70.0},
        {"repeat": 1, "arm": "busy", "seconds": 90.0},
    ]
    s = bench_busy.summarize(runs)
    assert s["arms"]["alone"]["median"] == 65.0 and s["arms"]["busy"]["median"] == 78.0
    assert s["busy_vs_alone"] == pytest.approx(1.2) and s["met"] is True
    assert s["busy_vs_alone_per_repeat"] == [1.1, 1.286]
    assert s["busy_all_cores_vs_alone"] == pytest.approx(2.154, abs=1e-3)
    assert bench_busy.summarize(runs[:1])["arms"]["alone"]["seconds"] == [60.0]


def test_a_resume_refuses_other_settings(tmp_path):
    from selftaught.runs import atomic_write_json

    path = tmp_path / "busy.json"
    assert bench_busy.resumed_units(path, {"items": 40}) == []
    atomic_write_json(path, {"settings": {"items": 40}, "runs": [{"repeat": 0, "arm": "alone"}]})
    assert bench_busy.resumed_units(path, {"items": 40}) == [{"repeat": 0, "arm": "alone"}]
    with pytest.raises(SystemExit, match="other settings"):
        bench_busy.resumed_units(path, {"items": 20})
