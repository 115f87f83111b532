"""Does sleep make a deployed agent better, and never worse with the gate on? A simulated
deployment, night after night.

A user sends a stream of requests through `selftaught proxy` (reasoning-gym
`basic_arithmetic` questions about distances; each request's reference carries the unit, and
the user corrects every reply with it: "7 km"). The house rule, *answers end with the unit*,
is not in any prompt: the agent can only learn it from the corrections. Each night
`sleep run --auto-adopt` learns from that night's traffic; then a fixed held-out set of
questions (never in the stream) is answered with the adopted skill and memory and scored by
the same check (the number, and the unit at the end). Three configurations, each its own
deployment with the same stream: the gate on (default margin gate), the gate off (accept
greedily: SkillOpt-Sleep's ablation, where accuracy collapsed 0.554 → 0.026), and the gate on
with rollouts-k 4 (contrastive reflection). Per night: held-out accuracy with a 95% Wilson
interval, the night's status and gate decisions, calls and tokens (traffic, night, held-out).
The user's corrections are demonstrations too (`sleep` turns them into demos); `gate-on` and
`gate-off` show them as a static block only, `retrieval` (gate on) also tries, each night,
the whole pool with the `--retrieve-k` most similar demos per request (BM25, needs
`selftaught[retrieval]`). Each night records which demo mode won and the smallest gain its
gate could have accepted at its val size.

    python benchmarks/bench_sleep.py --quick            # a smoke test: 1 night, tiny sizes
    python benchmarks/bench_sleep.py                    # 4 nights x 24 requests, 60 held out
    python benchmarks/bench_sleep.py --optimizer-model 'http://127.0.0.1:8011/v1#qwen'

Results: benchmarks/results/sleep_<target>.json (written after every night).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from selftaught.gate import GateConfig  # noqa: E402
from selftaught.models.base import ChatModel, GenerationParams  # noqa: E402
from selftaught.policy import Policy  # noqa: E402
from selftaught.rollout import RolloutConfig  # noqa: E402
from selftaught.runs import atomic_write_json, slug  # noqa: E402
from selftaught.skill.config import SkillOptConfig  # noqa: E402
from selftaught.sleep.night.checks import quantity  # noqa: E402
from selftaught.sleep.night.split import SplitConfig  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402

PROJECT = "bench"
UNIT = "km"
CONFIGS = ("gate-on", "gate-off", "retrieval", "rollouts-k4")
DEFAULT_CONFIGS = ("gate-on", "gate-off", "retrieval")


@dataclass
class Request:
    question: str
    reference: str  # "<number> km"


def make_stream(args: argparse.Namespace) -> tuple[list[list[Request]], list[Request]]:
    """The nights' requests and the held-out set, from one seeded reasoning-gym generator."""
    from selftaught.tasks import load_task

    per_night = args.requests_per_night
    total = args.nights * per_night
    task = load_task(args.gym, train_size=total, val_size=1, test_size=args.heldout, seed=args.seed)

    def as_request(ex: Example) -> Request:
        text = f"{ex.input} The numbers are distances in {UNIT}."
        return Request(text, f"{ex.reference} {UNIT}")

    stream = [as_request(ex) for ex in task.examples("train")]
    heldout = [as_request(ex) for ex in task.examples("test")]
    return [stream[i * per_night : (i + 1) * per_night] for i in range(args.nights)], heldout


class HeldOut:
    """The held-out questions as a task, scored by the number and the unit at the end."""

    name = "sleep-bench-heldout"
    kind = "agent"
    instructions = ""

    def __init__(self, requests: list[Request]):
        self._examples = [Example(f"h{i}", r.question, r.reference) for i, r in enumerate(requests)]

    def examples(self, split: str) -> list[Example]:
        return list(self._examples) if split == "test" else []

    def score(self, output: str, example: Example) -> Score:
        return quantity(output, example)


# ---- the deployment ---------------------------------------------------------------------------


@contextlib.contextmanager
def proxy(home: Path, target: ChatModel, target_spec: str) -> Iterator[tuple[str, Any]]:
    """`selftaught proxy` for the project, in this process, in front of the target."""
    import httpx

    from selftaught.serve import create_app
    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background

    config = ProxyConfig(
        upstream=target_spec, project=PROJECT, port=0, log_path=home / "log.db", home=home
    )
    upstream = None
    if target_spec == "local" or target_spec.startswith("local:"):  # share the loaded model
        name = target.name.split(":")[-1]
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(target, name)), timeout=3600
        )
        upstream = Upstream(client, "http://localhost/v1", name, True, None, False)
    with proxy_in_background(config, upstream=upstream) as running:
        yield running


def send_traffic(
    home: Path, target: ChatModel, spec: str, requests: list[Request], args: argparse.Namespace
) -> dict[str, int]:
    """The night's requests through the proxy, each corrected by the user with its reference."""
    import concurrent.futures
    import threading

    import httpx

    usage = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    lock = threading.Lock()
    with proxy(home, target, spec) as (url, app):

        def one(r: Request) -> None:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": r.question}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            resp = httpx.post(f"{url}/chat/completions", json=body, timeout=3600)
            resp.raise_for_status()
            iid = resp.headers["x-selftaught-interaction-id"]
            got = resp.json().get("usage") or {}
            with lock:
                usage["requests"] += 1
                usage["prompt_tokens"] += int(got.get("prompt_tokens") or 0)
                usage["completion_tokens"] += int(got.get("completion_tokens") or 0)
            fb = {"id": iid, "thumb": "down", "reference": r.reference}
            httpx.post(f"{url}/feedback", json=fb, timeout=60).raise_for_status()

        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, requests))
        app.state.proxy.writer.flush(60)
    return usage


def heldout_accuracy(
    home: Path, target: ChatModel, heldout: HeldOut, args: argparse.Namespace
) -> dict[str, Any]:
    from selftaught.evaluation import evaluate_split
    from selftaught.sleep.paths import read_adopted

    adopted = read_adopted(PROJECT, home)
    result = evaluate_split(
        heldout,
        target,
        Policy(adopted.skill, adopted.memory),
        split="test",
        rollout=RolloutConfig(
            concurrency=args.concurrency,
            params=GenerationParams(max_tokens=args.max_tokens, temperature=0.0),
            progress=False,
        ),
    )
    return {
        "adopted_version": adopted.version or "0",
        "n": result.n,
        "errors": result.n_errors,
        "hard": round(result.hard, 4),
        "hard_ci95": [round(x, 4) for x in result.hard_ci],
        "soft": round(result.soft, 4),  # half for the number, half for the unit
        "tokens": result.prompt_tokens + result.completion_tokens,
    }


def training_for(name: str, args: argparse.Namespace) -> SkillOptConfig:
    base = SkillOptConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        analyst_max_tokens=args.analyst_max_tokens,
        concurrency=args.concurrency,
        preferences=args.preferences,
        seed=args.seed,
        gate=GateConfig(),  # the night's default gate (`night_training_defaults`)
    )
    if name == "gate-off":
        return replace(base, gate=GateConfig(accept_all=True))
    if name == "rollouts-k4":
        return replace(base, rollouts_k=4)
    return base


def run_config(
    name: str,
    args: argparse.Namespace,
    nights: list[list[Request]],
    heldout: HeldOut,
    models: Any,
    root: Path,
    results: dict[str, Any],
    save: Any,
) -> None:
    from selftaught.sleep.night.cycle import SleepConfig, run_night
    from selftaught.sleep.night.demo_modes import DemoModeConfig

    home = root / name
    rows: list[dict[str, Any]] = []
    results["configs"][name] = {"training": training_for(name, args).to_dict(), "nights": rows}
    t0 = time.perf_counter()
    rows.append({"night": 0, "heldout": heldout_accuracy(home, models.target, heldout, args)})
    save()
    for k, requests in enumerate(nights, 1):
        traffic = send_traffic(home, models.target, models.target_spec, requests, args)
        config = SleepConfig(
            home=home,
            log_path=home / "log.db",
            project=PROJECT,
            auto_adopt=True,
            documents=tuple(args.documents.split(",")),
            training=training_for(name, args),
            split=SplitConfig(min_val=args.min_val, seed=args.seed),
            demo_modes=DemoModeConfig("on" if name == "retrieval" else "off", args.retrieve_k),
        )
        (night,) = run_night(config, models=models)
        report = night.report
        modes = ((report.get("phases") or {}).get("skill") or {}).get("demo_modes") or {}
        rows.append(
            {
                "night": k,
                "status": report["status"],
                "reason": report.get("reason"),
                "decisions": {
                    d: p.get("decisions") for d, p in (report.get("phases") or {}).items()
                },
                "proposal": report.get("proposal"),
                "splits": report.get("splits"),
                "recall": report.get("recall"),
                "smallest_gain": (report.get("gate") or {}).get("smallest_gain"),
                "demo_modes": {
                    "winner": modes.get("winner"),
                    "pool": modes.get("pool"),
                    "val": {m: c["hard"] for m, c in (modes.get("candidates") or {}).items()},
                },
                "traffic": traffic,
                "night_usage": report.get("usage"),
                "heldout": heldout_accuracy(home, models.target, heldout, args),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        save()
        h = rows[-1]["heldout"]
        print(
            f"[{name}] night {k}: {report['status']} · held-out {h['hard']:.3f} "
            f"CI95 {h['hard_ci95']} (adopted v{h['adopted_version']}) · demos "
            f"{modes.get('winner')} · smallest acceptable gain "
            f"{(rows[-1]['smallest_gain'] or {}).get('why')}",
            flush=True,
        )


def summarize(results: dict[str, Any]) -> None:
    """Per configuration: start vs last night, and whether any night fell below the start's
    interval (the gate's promise: it never does with the gate on)."""
    for cfg in results["configs"].values():
        nights = cfg["nights"]
        start = nights[0]["heldout"]
        worst = min(nights, key=lambda r: r["heldout"]["hard"])
        cfg["summary"] = {
            "start": start["hard"],
            "last": nights[-1]["heldout"]["hard"],
            "worst": worst["heldout"]["hard"],
            "worst_night": worst["night"],
            "dropped_below_start_ci": worst["heldout"]["hard"] < start["hard_ci95"][0],
            "adopted": sum(1 for r in nights[1:] if r.get("status") == "adopted"),
        }


def load_models(args: argparse.Namespace) -> Any:
    from selftaught.models import load_model
    from selftaught.sleep.night.cycle import NightModels

    target = load_model(args.target)
    optimizer = (
        target if args.optimizer_model in (None, args.target) else load_model(args.optimizer_model)
    )
    return NightModels(target, args.target, optimizer, args.optimizer_model or args.target)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 night, tiny sizes: a smoke test")
    p.add_argument("--target", default="local", help="model spec of the deployed agent")
    p.add_argument("--optimizer-model", default=None, help="analyst spec (default: the target)")
    p.add_argument("--gym", default="gym:basic_arithmetic?max_terms=2&max_digits=1")
    p.add_argument("--nights", type=int, default=4)
    p.add_argument("--requests-per-night", type=int, default=24)
    p.add_argument("--heldout", type=int, default=60)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=", ".join(CONFIGS))
    p.add_argument("--retrieve-k", type=int, default=4, help="demos retrieved per request")
    p.add_argument("--documents", default="skill,memory")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--min-val", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--analyst-max-tokens", type=int, default=384)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--preferences", default="", help="house rules given to the analyst")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.nights, args.requests_per_night, args.heldout = 1, 6, 4
        args.max_tokens, args.analyst_max_tokens, args.min_val = 16, 64, 4
        args.documents, args.batch_size = "skill", 8
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        p.error(f"unknown config(s) {unknown}; valid: {', '.join(CONFIGS)}")
    output = args.output or HERE / "results" / (
        f"sleep_{slug(args.target)}{'_quick' if args.quick else ''}.json"
    )
    nights, heldout_requests = make_stream(args)
    heldout = HeldOut(heldout_requests)
    models = load_models(args)
    results: dict[str, Any] = {
        "benchmark": "sleep",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_at_start": os.getloadavg(),
        },
        "house_rule": f"answers end with the unit ({UNIT}); never stated in a prompt",
        "configs": {},
    }

    def save() -> None:
        atomic_write_json(output, results)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="selftaught-bench-sleep-") as root:
        for name in names:
            run_config(name, args, nights, heldout, models, Path(root), results, save)
            summarize(results)
            save()
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["machine"]["load_at_end"] = os.getloadavg()
    save()
    print(json.dumps({k: v["summary"] for k, v in results["configs"].items()}, indent=2))
    print(f"results: {output}")


if __name__ == "__main__":
    main()
