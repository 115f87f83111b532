"""vLLM on a GPU: selftaught's sampling through `vllm serve` against vLLM's own engine and the
local engine, and one ReST round end to end with and without `--sampler-url`.

Tokens/s: the same ReST-style sampling (the task's train prompts, k completions each at
temperature 0.8, `max_tokens` 64) three ways, each counting the completion tokens it got:
- raw: vLLM's own engine in a process of its own (`vllm.LLM.chat`, one call for every
  prompt, `n = k`): the limit;
- served: selftaught's rollouts (`OpenAICompatModel` → `run_rollouts`, one `n = k` request a
  prompt, scored by the task) against the server `selftaught vllm-up` starts;
- local: the same rollouts on the in-process engine (`LocalModel`) on the GPU.
Then one ReST round (sample, fine-tune a LoRA adapter, evaluate val and test) on the server
(the adapter loaded at run time and checked) and in process, each timed whole and by phase.

    python benchmarks/bench_vllm.py                 # 64 prompts, k=4
    python benchmarks/bench_vllm.py --quick         # 16 prompts, k=4
    python benchmarks/bench_vllm.py --task data.jsonl --model local:/path/to/model

Needs a CUDA GPU and vLLM installed; refuses to start otherwise. Writes
benchmarks/results/vllm.json (vllm_quick.json with --quick). Status: ready, not yet measured.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, free_port, machine_info, wait_healthy

TASK = "gym:basic_arithmetic?max_terms=2&max_digits=1"


def missing() -> str | None:
    """Why this machine cannot run the benchmark (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def tokens_per_s(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 1) if seconds > 0 else 0.0


def setup(args: argparse.Namespace) -> tuple[Any, Path, list[Any]]:
    """The task, the model folder and the prompts as chat messages."""
    from selftaught.models.embedded import resolve_local_path
    from selftaught.models.spec import parse_model_spec
    from selftaught.policy import Policy
    from selftaught.tasks import load_task

    task = load_task(args.task, train_size=args.prompts, val_size=args.eval, test_size=args.eval)
    path = resolve_local_path(parse_model_spec(args.model).model or None)
    prompts = [Policy().messages(task, ex) for ex in task.examples("train")]
    return task, path, prompts


# ---- tokens/s ------------------------------------------------------------------------------


def raw_engine(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's own engine on the prompts (run in a process of its own: `--part raw`)."""
    from vllm import LLM, SamplingParams

    _, path, prompts = setup(args)
    llm = LLM(model=str(path), gpu_memory_utilization=args.gpu_memory, seed=0)
    params = SamplingParams(n=args.k, temperature=0.8, top_p=1.0, max_tokens=args.max_tokens)
    llm.chat(prompts[:2], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outputs = llm.chat(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"tokens": tokens, "seconds": round(seconds, 2), "tok_s": tokens_per_s(tokens, seconds)}


def rollouts_rate(chat: Any, task: Any, args: argparse.Namespace) -> dict[str, Any]:
    """selftaught's sampling path on `chat`: the rate of completion tokens, scored included."""
    from selftaught.models.base import GenerationParams
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, run_rollouts

    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.8, seed=0)
    config = RolloutConfig(
        concurrency=args.concurrency, samples=args.k, params=params, progress=False
    )
    examples = task.examples("train")
    run_rollouts(chat, Policy(), task, examples[:2], config)  # warm-up
    t0 = time.perf_counter()
    rollouts = run_rollouts(chat, Policy(), task, examples, config)
    seconds = time.perf_counter() - t0
    tokens = sum(r.completion_tokens for r in rollouts)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tok_s": tokens_per_s(tokens, seconds),
        "errors": sum(not r.ok for r in rollouts),
        "solved": round(sum(bool(r.score and r.score.hard) for r in rollouts) / len(rollouts), 3),
    }


# ---- one ReST round ------------------------------------------------------------------------


def rest_round(task: Any, path: Path, out: Path, sampler_url: str | None, args: Any) -> Any:
    """One ReST round, timed whole and by phase (the server's adapter loads counted)."""
    from selftaught.weights.config import BackendConfig, RestConfig
    from selftaught.weights.rest import RestTrainer

    config = RestConfig(
        rounds=1,
        samples_per_prompt=args.k,
        max_tokens=args.max_tokens,
        sampler_url=sampler_url,
        backend=BackendConfig(device="cuda"),
    )
    trainer = RestTrainer(config, task, path, output_dir=out, progress=False)
    t0 = time.perf_counter()
    result = trainer.train()
    row = trainer.run.history()[-1]
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "sample_seconds": row.get("sample_seconds"),
        "samples_per_s": row.get("samples_per_s"),
        "train_seconds": (row.get("train") or {}).get("train_seconds"),
        "adapter_loads": trainer.server.loads if trainer.server else None,
        "base_test": result.base_test.hard,
        "shipped_test": result.shipped_test.hard,
        "shipped": result.shipped,
    }


@contextlib.contextmanager
def vllm_up(path: Path, args: argparse.Namespace) -> Iterator[str]:
    """`selftaught vllm-up` (the command users run) on a free port; yields its /v1 URL."""
    port = free_port()
    log = RESULTS / "vllm_serve.log"
    cmd = [sys.executable, "-m", "selftaught", "vllm-up", "--model", f"local:{path}"]
    cmd += ["--port", str(port), "--", "--gpu-memory-utilization", str(args.gpu_memory)]
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 900)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Raw engine (its own process, so its GPU memory is freed), then the server, then the
    local engine; the two ReST rounds in their own run directories."""
    from selftaught.models import load_model
    from selftaught.models.openai_compat import OpenAICompatModel

    task, path, _ = setup(args)
    me = [sys.executable, str(Path(__file__).resolve()), "--part", "raw"]
    raw = subprocess.run(me + passed(args), capture_output=True, text=True, check=True)
    report: dict[str, Any] = {"raw": json.loads(raw.stdout.strip().splitlines()[-1])}
    runs = REPO / "runs" / "bench" / "vllm"
    with vllm_up(path, args) as url:
        report["served"] = rollouts_rate(OpenAICompatModel("base", base_url=url), task, args)
        report["rest_served"] = rest_round(task, path, runs / "served", url, args)
    local = load_model(f"local:{path}", device="cuda", max_batch_size=args.concurrency * args.k)
    try:
        report["local"] = rollouts_rate(local, task, args)
    finally:
        close = getattr(local, "close", None)
        if callable(close):
            close()
    report["rest_local"] = rest_round(task, path, runs / "local", None, args)
    for name in ("served", "local"):
        report[f"{name}_vs_raw"] = round(report[name]["tok_s"] / report["raw"]["tok_s"], 3)
    return report


def passed(args: argparse.Namespace) -> list[str]:
    """The settings, as this script's own flags (for the raw engine's process)."""
    return [
        *("--task", args.task, "--model", args.model, "--prompts", str(args.prompts)),
        *("-k", str(args.k), "--max-tokens", str(args.max_tokens), "--eval", str(args.eval)),
        *("--gpu-memory", str(args.gpu_memory)),
    ]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default=TASK)
    ap.add_argument("--model", default="local")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--eval", type=int, default=48, help="val and test items of the ReST round")
    ap.add_argument("--concurrency", type=int, default=16, help="prompts in flight")
    ap.add_argument("--gpu-memory", type=float, default=0.4, help="vLLM's share of the GPU")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("all", "raw"), default="all", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    why = missing()
    if why is not None:
        sys.exit(f"bench_vllm needs a CUDA GPU and vLLM: {why}; nothing was measured")
    if args.quick:  # before `passed`: the raw engine's process gets the sizes, not --quick
        args.prompts, args.eval = 16, 16
    if args.part == "raw":
        print(json.dumps(raw_engine(args)))
        return
    import torch

    from selftaught.runs import atomic_write_json

    report = {
        "benchmark": "vllm",
        "machine": {**machine_info(), "gpu": torch.cuda.get_device_name(0)},
        "settings": {k: v for k, v in vars(args).items() if k != "part"},
        **run_all(args),
    }
    out = RESULTS / ("vllm_quick.json" if args.quick else "vllm.json")
    atomic_write_json(out, report)
    print(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
