"""benchmarks/bench_dtype.py's pure parts: the interleaved plan and resuming, the paired ratio
with its interval, the summary and the README's note before any run (the benchmark itself runs
on a quiet machine, not here)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_dtype  # noqa: E402


def test_units_interleave_the_dtypes_and_a_resume_skips_what_ran():
    order = bench_dtype.plan(2, ["sft", "eval"])
    assert order[:4] == [(0, "sft", "fp32"), (0, "sft", "bf16"), (0, "eval", "fp32"),
                         (0, "eval", "bf16")]  # fmt: skip
    assert order[4:6] == [(1, "sft", "bf16"), (1, "sft", "fp32")]  # flipped next repeat
    ran = [{"repeat": 0, "part": "sft", "dtype": "fp32"}]
    assert bench_dtype.pending(order, ran) == order[1:]


def test_the_ratio_is_a_geometric_mean_with_a_t_interval():
    r = bench_dtype.ratio_ci([0.5, 0.5, 0.5])
    assert r["ratio"] == 0.5 and r["ci95"] == [0.5, 0.5]
    spread = bench_dtype.ratio_ci([0.6, 0.7, 0.8])
    lo, hi = spread["ci95"]
    assert lo < spread["ratio"] < hi
    logs = [math.log(x) for x in (0.6, 0.7, 0.8)]
    half = 4.303 * 0.1438 / math.sqrt(3)  # t(2) x sd of the logs / sqrt(n)
    assert hi == pytest.approx(math.exp(sum(logs) / 3 + half), abs=2e-3)
    assert "ci95" not in bench_dtype.ratio_ci([0.7])


def test_the_summary_pairs_by_repeat_and_the_readme_notes_a_missing_file(tmp_path):
    runs = []
    for rep in range(2):
        for dtype, f in (("fp32", 1.0), ("bf16", 0.5)):
            replies, hard = {"a": "x", "b": dtype}, {"a": 1.0, "b": f // 1}
            runs.append({"repeat": rep, "part": "eval", "dtype": dtype, "tok_per_s": 30 / f,
                         "replies": replies, "hard": hard})  # fmt: skip
    runs.append(
        {"repeat": 2, "part": "eval", "dtype": "fp32", "tok_per_s": 1.0, "replies": {}, "hard": {}}
    )  # fmt: skip  (no bf16 pair yet: left out)
    s = bench_dtype.summarize(runs)["eval"]
    assert s["tok_per_s_bf16_vs_fp32"]["ratios"] == [2.0, 2.0]
    assert s["identical_replies"] == [1, 1] and s["items"] == 2
    assert s["paired_bf16_vs_fp32"]["losses"] == 1
    assert "Not measured yet" in bench_dtype.readme_body(tmp_path)
    (tmp_path / "dtype_cpu.json").write_text(
        json.dumps(
            {"summary": {"eval": s}, "machine": {"cpu_bf16": {"amx": True}}, "settings": {}}
        )  # fmt: skip
    )
    body = bench_dtype.readme_body(tmp_path)
    assert "CPU bf16 instructions: amx" in body and "| 2.00 [2.00, 2.00] |" in body
