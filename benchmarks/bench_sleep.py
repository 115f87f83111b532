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

`weights` and `both` let the nights train a LoRA adapter (`NightConfig.weights`, sft by
default; a local target only): `weights` trains no text, `both` trains the skill and memory
too, and one gate picks text, adapter or both. The adopted adapter serves the next night's
traffic and the held-out set through the proxy's local upstream, as it would be deployed.

    python benchmarks/bench_sleep.py --configs gate-on,weights,both --nights 3

Results: benchmarks/results/sleep_<target>.json, written after every night; each
deployment's state is snapshotted beside it (`.state/<config>.night<k>`), so a killed run
resumes after its last completed night (same settings; `--fresh` starts over).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from common import (  # noqa: E402
    PROJECT,
    RESULTS,
    ProxyClient,
    add_deployment_options,
    deployment_proxy,
    load_night_models,
    night_config,
    night_row,
    night_training,
    resume_state,
    snapshot_state,
)

from selftaught.gate import GateConfig  # noqa: E402
from selftaught.models.base import ChatModel, GenerationParams  # noqa: E402
from selftaught.policy import Policy  # noqa: E402
from selftaught.rollout import RolloutConfig  # noqa: E402
from selftaught.runs import atomic_write_json, slug  # noqa: E402
from selftaught.skill.config import SkillOptConfig  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402
from selftaught.tasks.scorers import quantity  # noqa: E402

FEEDBACK_KEY = "bench-operator-feedback-key"  # the simulated feedback is the operator's
UNIT = "km"
CONFIGS = ("gate-on", "gate-off", "retrieval", "rollouts-k4", "weights", "both")
DEFAULT_CONFIGS = ("gate-on", "gate-off", "retrieval")
WEIGHT_CONFIGS = {"weights": (), "both": None}  # weights-only trains no text; both: the default


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


FEEDBACK_MODES = ("explicit", "conversation", "rules", "reask")
CORRECT = "No, that's wrong: it's {ref}. Please answer with just the number and {unit}."
RESTATE = "Please answer with just the number and {unit}."
THANKS = "Thanks, that's right."


def followup(mode: str, i: int, r: Request, reply: str) -> str | None:
    """The user's next turn in an unlabeled stream (None: none): a wrong reply is corrected
    (`conversation`), corrected or only told the rule, alternately (`rules`), or asked again
    (`reask`, sent as a new conversation); a right one is thanked."""
    right = quantity(reply, Example("q", r.question, r.reference)).hard
    if right:
        return THANKS
    if mode == "reask":
        return None
    if mode == "rules" and i % 2:
        return RESTATE.format(unit=UNIT)
    return CORRECT.format(ref=r.reference, unit=UNIT)


def send_traffic(
    home: Path, target: ChatModel, spec: str, requests: list[Request], args: argparse.Namespace
) -> dict[str, int]:
    """The night's requests through the proxy. `--feedback explicit`: each reply corrected by the
    operator's feedback call with its reference; otherwise no feedback call at all, only what
    the user says next in the conversation (`followup`), the app resending the history."""
    import concurrent.futures
    import threading

    import httpx

    followups = 0
    lock = threading.Lock()
    trusted = ("*",) if args.feedback != "explicit" and args.trust == "operator" else ()
    proxy = deployment_proxy(home, target, spec, trusted=trusted, feedback_key=FEEDBACK_KEY)
    with proxy as (url, app):
        client = ProxyClient(url, args.max_tokens)

        def one(item: tuple[int, Request]) -> None:
            nonlocal followups
            i, r = item
            history = [{"role": "user", "content": r.question}]
            iid, message = client.ask(history)
            reply = message.get("content") or ""
            if args.feedback == "explicit":
                fb = {"id": iid, "thumb": "down", "reference": r.reference}
                httpx.post(
                    f"{url}/feedback", json=fb, headers={"x-api-key": FEEDBACK_KEY}, timeout=60
                ).raise_for_status()
                return
            said = followup(args.feedback, i, r, reply)
            if said is None:  # a re-ask: the same question in a new conversation
                client.ask(history)
            else:
                client.ask([*history, {"role": "assistant", "content": reply},
                            {"role": "user", "content": said}])  # fmt: skip
            with lock:
                followups += 1

        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, enumerate(requests)))
        app.state.proxy.writer.flush(60)
    return {**client.usage, "followups": followups}


def heldout_accuracy(
    home: Path, target: ChatModel, heldout: HeldOut, args: argparse.Namespace
) -> dict[str, Any]:
    from selftaught.evaluation import evaluate_split
    from selftaught.sleep.intake.proxy import follow_adopted
    from selftaught.sleep.paths import read_adopted

    adopted = read_adopted(PROJECT, home)
    result = evaluate_split(
        heldout,
        follow_adopted(target, PROJECT, home),  # with the adopted adapter, if one serves
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
        "adapter": str(adopted.adapter.relative_to(home)) if adopted.adapter else None,
        "n": result.n,
        "errors": result.n_errors,
        "hard": round(result.hard, 4),
        "hard_ci95": [round(x, 4) for x in result.hard_ci],
        "soft": round(result.soft, 4),  # half for the number, half for the unit
        "tokens": result.prompt_tokens + result.completion_tokens,
    }


def training_for(name: str, args: argparse.Namespace) -> SkillOptConfig:
    base = night_training(args)
    if name == "gate-off":
        return replace(base, gate=GateConfig(accept_all=True))
    if name == "rollouts-k4":
        return replace(base, rollouts_k=4)
    return base


def sleep_config(name: str, args: argparse.Namespace, home: Path) -> Any:
    from selftaught.sleep.night.demo_modes import DemoModeConfig

    changes: dict[str, Any] = {}
    if name in WEIGHT_CONFIGS:
        changes["weights"] = args.weights_mode
        if WEIGHT_CONFIGS[name] is not None:
            changes["documents"] = WEIGHT_CONFIGS[name]
    return night_config(
        args,
        home,
        training_for(name, args),
        demo_modes=DemoModeConfig("on" if name == "retrieval" else "off", args.retrieve_k),
        **changes,
    )


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
    """One deployment, night after night; resumes after its last completed night."""
    from selftaught.sleep.night.cycle import run_night

    home = root / name
    entry = results["configs"].setdefault(
        name, {"training": training_for(name, args).to_dict(), "nights": []}
    )
    rows: list[dict[str, Any]] = entry["nights"]
    if not rows:
        start = next((c["nights"][0] for c in results["configs"].values() if c["nights"]), None)
        # night 0 is the same deployment (the base model, nothing adopted) in every config
        rows.append(
            start or {"night": 0, "heldout": heldout_accuracy(home, models.target, heldout, args)}
        )
        home.mkdir(parents=True, exist_ok=True)
        snapshot_state(home, 0)
        save()
    resume_state(home, len(rows) - 1)
    for k, requests in list(enumerate(nights, 1))[len(rows) - 1 :]:
        t0 = time.perf_counter()
        traffic = send_traffic(home, models.target, models.target_spec, requests, args)
        (night,) = run_night(sleep_config(name, args, home), models=models)
        night_s = time.perf_counter() - t0
        row = night_row(k, night.report_dict())
        row.update(
            traffic=traffic,
            heldout=heldout_accuracy(home, models.target, heldout, args),
            night_s=round(night_s, 1),
            load=os.getloadavg(),
        )
        rows.append(row)
        snapshot_state(home, k)
        save()
        h = row["heldout"]
        print(
            f"[{name}] night {k}: {row['status']} in {night_s:.0f} s · held-out {h['hard']:.3f} "
            f"CI95 {h['hard_ci95']} (adopted v{h['adopted_version']}, adapter {h['adapter']}) · "
            f"weights {(row['weights'] or {}).get('winner')} · demos "
            f"{row['demo_modes']['winner']} · smallest acceptable gain "
            f"{(row['smallest_gain'] or {}).get('why')}",
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
            # the target: after night 2, the held-out interval lies wholly above night 0's
            "night2_above_start_ci": len(nights) > 2
            and nights[2]["heldout"]["hard_ci95"][0] > start["hard_ci95"][1],
            "night_s": [r.get("night_s") for r in nights[1:]],
            "adopted": sum(1 for r in nights[1:] if r.get("status") == "adopted"),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 night, tiny sizes: a smoke test")
    add_deployment_options(p, max_tokens=48)
    p.add_argument("--gym", default="gym:basic_arithmetic?max_terms=2&max_digits=1")
    p.add_argument("--nights", type=int, default=4)
    p.add_argument("--requests-per-night", type=int, default=24)
    p.add_argument("--heldout", type=int, default=60)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=", ".join(CONFIGS))
    p.add_argument("--retrieve-k", type=int, default=4, help="demos retrieved per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights-mode", default="sft", help="weights / both configs: sft | dpo | auto")
    p.add_argument(
        "--feedback",
        default="explicit",
        choices=FEEDBACK_MODES,
        help="explicit: the operator's feedback call with the reference; conversation / rules "
        "/ reask: no feedback call, the user's next turn only (a one-person deployment)",
    )
    p.add_argument(
        "--trust",
        default="operator",
        choices=("operator", "end-user"),
        help="unlabeled streams: whose words the users' turns are (operator: a one-person "
        "deployment, `--trusted-clients '*'`; end-user: evidence only)",
    )
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
    stream = "" if args.feedback == "explicit" else f"_{args.feedback}"
    stream += "_untrusted" if args.trust == "end-user" and args.feedback != "explicit" else ""
    output = args.output or RESULTS / (
        f"sleep_{slug(args.target)}{stream}{'_quick' if args.quick else ''}.json"
    )
    nights, heldout_requests = make_stream(args)
    heldout = HeldOut(heldout_requests)
    state = output.with_suffix(".state")  # each deployment's home, snapshotted per night
    results = load_results(output, args, state)
    models = load_night_models(args.target, args.optimizer_model)

    def save() -> None:
        atomic_write_json(output, results)

    t0 = time.perf_counter()
    for name in names:
        run_config(name, args, nights, heldout, models, state, results, save)
        summarize(results)
        save()
    results["wall_s"] = round(results.get("wall_s", 0) + time.perf_counter() - t0, 1)
    results["machine"]["load_at_end"] = os.getloadavg()
    save()
    if output.resolve().parent == RESULTS.resolve():
        from common import write_tables

        write_tables()  # the README's sleep tables come from these files
    print(json.dumps({k: v.get("summary") for k, v in results["configs"].items()}, indent=2))
    print(f"results: {output}")


RESUME_KEYS = (
    "feedback",
    "trust",
    "target",
    "optimizer_model",
    "gym",
    "nights",
    "requests_per_night",
    "heldout",
    "seed",
    "max_tokens",
    "documents",
    "weights_mode",
    "max_steps",
    "min_val",
)


def load_results(output: Path, args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """The saved results to go on from (same settings), or a fresh start."""
    import shutil

    if output.exists() and not args.fresh:
        saved = json.loads(output.read_text())
        given = {"feedback": "explicit", "trust": "operator", **saved["args"]}  # older files
        same = all(given.get(k) == getattr(args, k) for k in RESUME_KEYS)
        if same:
            print(f"resuming {output} ({', '.join(saved['configs']) or 'no config yet'})")
            return saved
        print(f"{output} was written with other settings: starting over")
    shutil.rmtree(state, ignore_errors=True)
    return {
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


if __name__ == "__main__":
    main()
