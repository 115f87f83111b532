"""benchmarks/bench_tool_rest.py --kv-arms, its pure parts: the alternating order, each arm's
run directory and report, and the summary (the runs themselves are the lead's, on a quiet
machine)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_tool_rest as bench  # noqa: E402
from common import RssTrace  # noqa: E402

from selftaught.runs import atomic_write_json  # noqa: E402


def test_the_arms_alternate_and_each_run_has_its_own_folder_and_report(tmp_path):
    assert bench.kv_plan(["pool", "dynamic"], 3) == [
        (0, "pool"),
        (0, "dynamic"),
        (1, "dynamic"),
        (1, "pool"),
        (2, "pool"),
        (2, "dynamic"),
    ]
    args = argparse.Namespace(output=tmp_path / "runs" / "bench", result=tmp_path / "r" / "t.json")
    output, result = bench.kv_unit_paths(args, 1, "pool")
    assert output == tmp_path / "runs" / "bench-kv" / "pool-1"
    assert result == tmp_path / "r" / "tool_rest_kv_pool-1.json"


def test_the_summary_reads_each_report_and_pairs_the_arms(tmp_path):
    units = []
    for repeat, arm, wall, rss in ((0, "pool", 900.0, 3.0), (0, "dynamic", 1200.0, 6.0)):
        path = tmp_path / f"{arm}.json"
        atomic_write_json(
            path,
            {
                "wall_seconds": wall,
                "max_rss_gb": rss,
                "memory": {"peak_rss_gb": rss - 0.1},
                "shipped": {"hard": 0.7},
                "raw_decode": {"tok_per_s": 120.0},
            },
        )
        units.append({"repeat": repeat, "arm": arm, "report": str(path)})
    summary = bench.summarize_kv(units)
    assert summary["arms"]["pool"]["max_rss_gb"] == 3.0
    assert summary["arms"]["dynamic"]["raw_tok_per_s"] == 120.0
    assert summary["pool_vs_dynamic"] == [{"repeat": 0, "wall": 0.75, "max_rss": 0.5}]


def test_the_rss_trace_samples_while_it_runs_and_keeps_its_peak():
    with RssTrace(0.01) as trace:
        block = bytearray(64 * 2**20)  # 64 MB touched: resident
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(0.1)
        del block
    summary = trace.summary(points=5)
    if summary["peak_rss_gb"] is None:
        pytest.skip("no /proc/self/statm here")
    assert len(trace.samples) >= 5 and len(summary["rss_trace_gb"]) <= 8
    assert max(gb for _, gb in summary["rss_trace_gb"]) == summary["peak_rss_gb"]
    assert summary["max_rss_gb"] >= summary["peak_rss_gb"] - 0.01
