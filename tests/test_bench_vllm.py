"""benchmarks/bench_vllm.py off a GPU: it refuses in one sentence and measures nothing, and the
raw engine's process gets the run's own settings (the benchmark itself runs on a GPU machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_vllm  # noqa: E402

SCRIPT = Path(bench_vllm.__file__)


def test_without_a_gpu_and_vllm_it_refuses_and_writes_nothing(tmp_path):
    if bench_vllm.missing() is None:
        import pytest

        pytest.skip("this machine has a GPU and vLLM")
    before = sorted(p.name for p in bench_vllm.RESULTS.glob("vllm*.json"))
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True)
    assert run.returncode != 0 and "needs a CUDA GPU and vLLM" in run.stderr
    assert sorted(p.name for p in bench_vllm.RESULTS.glob("vllm*.json")) == before


def test_the_raw_engine_process_gets_the_same_settings():
    args = bench_vllm.parser().parse_args(
        ["--task", "t.jsonl", "--model", "local:/m", "--prompts", "5", "-k", "3", "--eval", "7"]
    )
    args.max_tokens, args.gpu_memory = 32, 0.25
    again = bench_vllm.parser().parse_args([*bench_vllm.passed(args), "--part", "raw"])
    for name in ("task", "model", "prompts", "k", "max_tokens", "eval", "gpu_memory"):
        assert getattr(again, name) == getattr(args, name), name
