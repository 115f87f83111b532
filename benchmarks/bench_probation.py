"""Probation under known truth: how many requests until a worse adopted version is flagged,
how often an equally good one is flagged by mistake, and whether --auto-rollback rolls back.

A simulated deployment (no model runs):
- a scripted upstream answers "What is a + b?"; whether an answer is right depends only on
  the injected skill, which states its accuracy (`accuracy: 0.8`): request i of repeat s is
  right when `Random(f"{s}:{i}").random() < p`;
- a simulated user gives a thumb by the ground truth (up when right) on a share of requests
  (`Random(f"{s}:fb:{i}").random() < feedback_share`);
- version 1 (p_good) serves `warmup` requests; night 2 trained on the first `trained` of them
  (its tasks.jsonl lists them, so probation leaves them out); its proposal (p_new) is adopted
  over version 1 with force; requests go on until probation flags a drop or `horizon`.

Two measurements, from the same simulated traffic:
- **through the proxy** (`selftaught proxy --auto-rollback`, a few repeats): the proxy in a
  thread in front of the scripted upstream, feedback POSTed, the background watch checked
  after each feedback; the rollback and its events.jsonl row are asserted;
- **many repeats** (the same seeds and more): the tallies counted as the proxy's watch counts
  them and the package's own `probation.compare` asked after each feedback (the verdict
  function the proxy uses); the repeats run through the proxy must flag at the same request.

    PYTHONPATH=src python benchmarks/bench_probation.py            # ~1-2 min
    PYTHONPATH=src python benchmarks/bench_probation.py --quick

Writes benchmarks/results/probation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command_line, machine_info, write_tables  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402  (module level: the endpoint's annotation)

from selftaught.runs import atomic_write_json, atomic_write_text  # noqa: E402
from selftaught.sleep.intake.probation import (  # noqa: E402
    ProbationConfig,
    Tally,
    compare,
)
from selftaught.stats import z_for  # noqa: E402

PROJECT = "bench"
FEEDBACK_KEY = "bench-operator-feedback-key"  # the simulated feedback is the operator's


@dataclass(frozen=True)
class Setting:
    p_good: float = 0.8
    p_new: float = 0.5
    feedback_share: float = 0.5
    warmup: int = 200  # requests version 1 serves before version 2 is adopted
    trained: int = 60  # of them, night 2 trained or gated on (left out)
    horizon: int = 1000  # requests version 2 serves at most
    min_outcomes: int = 20
    confidence: float = 0.95


def right(seed: int, i: int, p: float) -> bool:
    return random.Random(f"{seed}:{i}").random() < p


def gives_feedback(seed: int, i: int, share: float) -> bool:
    return random.Random(f"{seed}:fb:{i}").random() < share


# ---- many repeats: the tallies the watch keeps, the verdict function it uses -------------


def flagged_at(seed: int, s: Setting) -> int | None:
    """Requests version 2 served until the check after a feedback found a drop (None: not
    within the horizon)."""
    config = ProbationConfig(s.min_outcomes, s.confidence)
    z = z_for(s.confidence)
    old = Tally("1")
    for i in range(s.trained, s.warmup):  # the first `trained` fed night 2: left out
        if gives_feedback(seed, i, s.feedback_share):
            old.outcomes += 1
            old.successes += right(seed, i, s.p_good)
    old.close(z)
    new = Tally("2")
    for k in range(s.horizon):
        i = s.warmup + k
        if not gives_feedback(seed, i, s.feedback_share):
            continue
        new.outcomes += 1
        new.successes += right(seed, i, s.p_new)
        new.close(z)
        if compare("adopted", new, old, config).verdict == "drop":
            return k + 1
    return None


def summarize(found: list[int | None], horizon: int) -> dict[str, Any]:
    hits = sorted(x for x in found if x is not None)
    out: dict[str, Any] = {
        "repeats": len(found),
        "flagged": len(hits),
        "flagged_share": round(len(hits) / len(found), 4),
        "horizon": horizon,
    }
    if hits:
        deciles = statistics.quantiles(hits, n=10, method="inclusive") if len(hits) > 1 else hits
        out.update(
            median=statistics.median(hits),
            p90=deciles[-1] if len(hits) > 1 else hits[0],
            min=hits[0],
            max=hits[-1],
        )
    return out


# ---- through the proxy ------------------------------------------------------------------------


def upstream_app(seed: int) -> Any:
    app = FastAPI()

    async def chat(request: Request) -> Any:
        body = await request.json()
        system = " ".join(str(m["content"]) for m in body["messages"] if m["role"] == "system")
        m = re.search(r"accuracy: ([0-9.]+)", system)
        p = float(m.group(1)) if m else 0.0
        i, a, b = map(int, re.findall(r"\d+", body["messages"][-1]["content"]))
        text = str(a + b if right(seed, i, p) else a + b + 1)
        message = {"role": "assistant", "content": text}
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip

    app.post("/v1/chat/completions")(chat)
    return app


def _stage(home: Path, night: str, p: float, trained_ids: list[str]) -> None:
    from selftaught.sleep.adoption import staging

    folder = staging.nights_dir(PROJECT, home) / night
    atomic_write_text(folder / "proposal" / "skill.md", f"Answer with the number. accuracy: {p}\n")
    atomic_write_text(folder / "proposal" / "memory.md", "")
    atomic_write_json(folder / "report.json", {"kind": staging.NIGHT_KIND, "night": night,
                      "project": PROJECT, "status": "staged", "base_version": 0})  # fmt: skip
    rows = [{"id": f"t{n}", "split": ("train", "val")[n % 2], "sources": [iid]}
            for n, iid in enumerate(trained_ids)]  # fmt: skip
    atomic_write_text(folder / "tasks.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def _ask(client: Any, url: str, seed: int, i: int, s: Setting) -> str:
    rng = random.Random(f"{seed}:q:{i}")
    a, b = rng.randrange(100), rng.randrange(100)
    body = {"model": "m", "messages": [{"role": "user", "content": f"Q{i}: what is {a} + {b}?"}]}
    r = client.post(f"{url}/chat/completions", json=body)
    r.raise_for_status()
    iid = r.headers["x-selftaught-interaction-id"]
    if gives_feedback(seed, i, s.feedback_share):
        ok = r.json()["choices"][0]["message"]["content"] == str(a + b)
        body = {"id": iid, "thumb": "up" if ok else "down"}
        client.post(f"{url}/feedback", json=body, headers={"x-api-key": FEEDBACK_KEY})
    return iid


def through_proxy(seed: int, s: Setting) -> dict[str, Any]:
    """One deployment through the proxy with --auto-rollback; the request it was flagged at."""
    import httpx

    from selftaught.sleep.adoption import staging
    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        _stage(home, "n1", s.p_good, [])
        staging.adopt(PROJECT, "n1", home=home)
        transport = httpx.ASGITransport(app=upstream_app(seed))
        upstream = Upstream(httpx.AsyncClient(transport=transport), "http://up/v1", "m",
                            False, None, False)  # fmt: skip
        config = ProxyConfig(upstream="http://up/v1#m", project=PROJECT, port=0,
                             log_path=Path(tmp) / "log.db", home=home, auto_rollback=True,
                             probation=ProbationConfig(s.min_outcomes, s.confidence),
                             feedback_key=FEEDBACK_KEY)  # fmt: skip
        started = time.perf_counter()
        with proxy_in_background(config, upstream=upstream) as (url, app), \
                httpx.Client(timeout=30) as client:  # fmt: skip
            watch = app.state.proxy.watch
            ids = [_ask(client, url, seed, i, s) for i in range(s.warmup)]
            _stage(home, "n2", s.p_new, ids[: s.trained])
            staging.adopt(PROJECT, "n2", home=home, force=True)  # gated against 0: --force
            flagged = None
            for k in range(s.horizon):
                _ask(client, url, seed, s.warmup + k, s)
                assert watch.wait_idle(60), "the probation watch did not finish"
                if staging.current_version(PROJECT, home) != 2:
                    flagged = k + 1
                    break
            checks = watch.checks
        events = [e for e in staging.events(PROJECT, home) if e["event"] == "auto_rollback"]
        return {
            "seed": seed,
            "flagged_at": flagged,
            "rolled_back_to": staging.current_version(PROJECT, home) if flagged else None,
            "auto_rollback_event": events[-1] if events else None,
            "checks": checks,
            "seconds": round(time.perf_counter() - started, 2),
        }


# ---- the run ----------------------------------------------------------------------------------


def run(repeats: int, proxy_repeats: int) -> dict[str, Any]:
    settings = {
        "worse (0.8 -> 0.5)": Setting(),
        "slightly worse (0.8 -> 0.7)": Setting(p_new=0.7),
        "equally good (0.8 -> 0.8)": Setting(p_new=0.8),
        "worse, 99% intervals": Setting(confidence=0.99),
        "equally good, 99% intervals": Setting(p_new=0.8, confidence=0.99),
    }
    out: dict[str, Any] = {"settings": {}, "proxy": []}
    for name, s in settings.items():
        started = time.perf_counter()
        found = [flagged_at(seed, s) for seed in range(repeats)]
        out["settings"][name] = {
            "setting": asdict(s),
            **summarize(found, s.horizon),
            "seconds": round(time.perf_counter() - started, 2),
        }
        print(name, json.dumps({k: v for k, v in out["settings"][name].items() if k != "setting"}))
    worse = Setting()
    for seed in range(proxy_repeats):
        e2e = through_proxy(seed, worse)
        simulated = flagged_at(seed, worse)
        e2e["simulated_flagged_at"] = simulated
        assert e2e["flagged_at"] == simulated, e2e
        assert e2e["rolled_back_to"] == 1 and e2e["auto_rollback_event"]["previous"] == 2, e2e
        out["proxy"].append(e2e)
        print("through the proxy:", {k: v for k, v in e2e.items() if k != "auto_rollback_event"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--proxy-repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="200 repeats, 2 through the proxy")
    args = parser.parse_args()
    repeats, proxy_repeats = (200, 2) if args.quick else (args.repeats, args.proxy_repeats)
    started = time.perf_counter()
    result = {
        "command": command_line(),
        "machine": machine_info(),
        **run(repeats, proxy_repeats),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "probation.json"
    atomic_write_json(path, result)
    write_tables()  # the README's probation table comes from this file
    print(f"wrote {path} in {result['seconds']} s")


if __name__ == "__main__":
    main()
