"""One task log under load: several proxy processes writing it at once, a night reading it
meanwhile, one proxy killed with kill -9 mid-load; SQLite and Postgres side by side.

Per backend: a fresh log; a fake upstream (`tests/fake_upstream.py`, its own process);
`--proxies` `selftaught proxy` processes (each its own sleep home: its own "host") logging to
the same log; this client sends `--requests` requests to each (half streamed) at
`--concurrency` in flight per proxy, and feedback with a reference on every 10th answer.
When 40% of all requests are answered, it snapshots the ids in the log and starts a scripted
night (`run_night`, scripted target and analyst, its window recorded); when proxy 0 has
answered `--kill-at` of its requests it is killed with SIGKILL. Then it checks: every answered
request in the log (answered-but-unlogged per proxy), nothing duplicated, the night saw every
row written before it started. Also measured: what logging before the answer would cost (one
synchronous `TaskLog.add` per request on each backend; one fsynced spool append), and with
Postgres, how long a replica (every surviving proxy) takes to serve an adopt made by another
process (the bench), and a rollback; and a proxy whose database goes away for a third of its
requests (a relay cut, then restored): answered, spooled, replayed, lost, latency per phase.

    python benchmarks/bench_log_load.py            # 4 proxies x 500 requests, 32 in flight each
    python benchmarks/bench_log_load.py --quick    # 2 proxies x 100: a smoke test

Postgres: $SELFTAUGHT_TEST_POSTGRES (a server URL), else a throwaway cluster this script starts
with `initdb` (fsync on). Results: benchmarks/results/log_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = REPO / "src"
sys.path[:0] = [str(SRC), str(REPO), str(HERE)]

from common import RESULTS, free_port, machine_info, wait_healthy  # noqa: E402

from selftaught.runs import atomic_write_json, atomic_write_text  # noqa: E402

PROJECT = "load"
ID_HEADER = "x-selftaught-interaction-id"

NIGHT = """
import json, sys
from pathlib import Path
sys.path[:0] = [{src!r}, {repo!r}]
from selftaught.sleep.night import cycle
from tests.scripted import append, canned_analyst, edits_json, rule_target
home, out = Path(sys.argv[1]), Path(sys.argv[2])
real = cycle._window_rows

def recording(log, config, home, until):  # what the night read: every row of its window
    windows = real(log, config, home, until)
    ids = [it.id for _, rows in windows.values() for it in rows]
    out.write_text(json.dumps({{"until": until, "ids": ids}}))
    return windows

cycle._window_rows = recording
config = cycle.NightConfig(home=home, max_tasks=10**6, training=cycle.night_training_defaults())
analyst = canned_analyst(failure=edits_json(append("rule alpha")))
models = cycle.NightModels(rule_target(), "scripted-target", analyst, "scripted-analyst")
outcomes = cycle.run_night(config, models=models)
print(json.dumps([{{"project": o.project, "status": o.status}} for o in outcomes]))
"""


# ---- processes ---------------------------------------------------------------------------


def serve_upstream() -> None:
    """The fake upstream in a process of its own: prints its URL, serves until killed."""
    from tests.fake_upstream import FakeUpstream

    with FakeUpstream() as up:
        print(up.base_url, flush=True)
        while True:
            time.sleep(3600)


def upstream_process(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream"], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    return proc, proc.stdout.readline().strip()  # type: ignore[union-attr]


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


# ---- the load ------------------------------------------------------------------------------


class Load:
    """Requests to every proxy; what was answered (id, proxy, latency, when)."""

    def __init__(self, urls: list[str], requests: int, concurrency: int, tag: str):
        self.urls, self.requests, self.concurrency, self.tag = urls, requests, concurrency, tag
        self.answered: list[tuple[str, int, float, float]] = []  # (id, proxy, latency s, time)
        self.per_proxy = [0] * len(urls)
        self.failed = [0] * len(urls)
        self.feedback = {"given": 0, "failed": 0}
        self.events: dict[str, float] = {}

    async def run(self, hooks: list[Any]) -> float:
        import httpx

        limits = httpx.Limits(max_connections=self.concurrency * len(self.urls))
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            started = time.perf_counter()
            await asyncio.gather(*(self._proxy(client, k, hooks) for k in range(len(self.urls))))
            return time.perf_counter() - started

    async def _proxy(self, client: Any, k: int, hooks: list[Any]) -> None:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int) -> None:
            async with sem:
                await self._one(client, k, i)
                for hook in hooks:
                    await hook(self)

        await asyncio.gather(*(one(i) for i in range(self.requests)))

    async def _one(self, client: Any, k: int, i: int) -> None:
        import httpx

        text = f"{self.tag}: proxy {k} request {i}"
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": i % 2 == 1}
        t0 = time.perf_counter()
        try:
            async with client.stream("POST", f"{self.urls[k]}/chat/completions", json=body) as r:
                raw = b"".join([chunk async for chunk in r.aiter_raw()])
                if r.status_code != 200 or not raw.rstrip().endswith((b"}", b"[DONE]")):
                    self.failed[k] += 1
                    return
                iid = r.headers[ID_HEADER]
        except httpx.HTTPError:
            self.failed[k] += 1
            return
        self.answered.append((iid, k, time.perf_counter() - t0, time.time()))
        self.per_proxy[k] += 1
        if i % 10 == 0 and k != 0:  # an operator's correction: these rows are tasks
            try:
                fb = await client.post(
                    f"{self.urls[k]}/feedback", json={"id": iid, "reference": f"echo: {text}"}
                )
                self.feedback["given" if fb.status_code == 200 else "failed"] += 1
            except httpx.HTTPError:
                self.feedback["failed"] += 1


def kill_hook(proc: subprocess.Popen[bytes], at: int) -> Any:
    async def hook(load: Load) -> None:
        if "killed" not in load.events and load.per_proxy[0] >= at:
            os.kill(proc.pid, signal.SIGKILL)
            load.events["killed"] = time.time()
            load.events["killed_after"] = load.per_proxy[0]

    return hook


def night_hook(location: str, home: Path, out: Path, logs: Path, at: int, state: dict) -> Any:
    """At `at` answers: snapshot the ids in the log, then start the night."""

    async def hook(load: Load) -> None:
        if "night" in load.events or len(load.answered) < at:
            return
        load.events["night"] = time.time()
        state["before"] = await asyncio.to_thread(all_ids, location)
        env = {**os.environ, "PYTHONPATH": str(SRC), "SELFTAUGHT_LOG": location}
        cmd = [sys.executable, "-c", NIGHT.format(src=str(SRC), repo=str(REPO)), str(home)]
        state["proc"] = start([*cmd, str(out)], env, logs / "night.log")
        load.events["night_started"] = time.time()

    return hook


def all_ids(location: str) -> set[str]:
    from selftaught.sleep.intake.log import TaskLog

    with TaskLog(location) as log:
        return {it.id for it in log.query()}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def proxy_process(location: str, upstream_url: str, home: Path) -> tuple[Any, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "SELFTAUGHT_LOG": location,
           "SELFTAUGHT_HOME": str(home)}  # fmt: skip
    cmd = [sys.executable, "-m", "selftaught", "proxy", "--upstream", f"{upstream_url}#m",
           "--port", str(port), "--log", location, "--project", PROJECT]  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    proc = start(cmd, env, home / "proxy.log")
    return proc, f"http://127.0.0.1:{port}/v1"


def run_backend(backend: str, location: str, args: argparse.Namespace, work: Path) -> dict:
    """One backend's load: start everything, drive it, check the log; then the kill trials."""
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(SRC), "SELFTAUGHT_LOG": location}
    upstream, upstream_url = upstream_process(env)
    try:
        result = main_load(backend, location, upstream_url, args, work)
        result["kill_trials"] = kill_trials(location, upstream_url, args, work)
        if backend == "postgres":
            result["outage"] = outage(location, upstream_url, args, work)
    finally:
        upstream.kill()
        upstream.wait(timeout=30)
    return result


def main_load(
    backend: str, location: str, upstream_url: str, args: argparse.Namespace, work: Path
) -> dict:
    import httpx

    started = [
        proxy_process(location, upstream_url, work / f"home{k}") for k in range(args.proxies)
    ]
    proxies, urls = [p for p, _ in started], [u for _, u in started]
    night_state: dict[str, Any] = {}
    try:
        for proc, url in started:
            wait_healthy(url.removesuffix("/v1") + "/health", proc, 120)
        load = Load(urls, args.requests, args.concurrency, "load")
        at = int(0.4 * args.requests * args.proxies)
        hooks = [
            kill_hook(proxies[0], int(args.kill_at * args.requests)),
            night_hook(location, work / "night-home", work / "night.json", work, at, night_state),
        ]
        wall = asyncio.run(load.run(hooks))
        for url in urls[1:]:  # every answer handed to a writer is written (or counted)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                h = httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()["log"]
                if h["queued"] == 0:
                    break
                time.sleep(0.2)
        healths = [httpx.get(u.removesuffix("/v1") + "/health").json()["log"] for u in urls[1:]]
        adopt = adopt_latency(location, urls[1:], work) if backend == "postgres" else None
    finally:
        for proc in proxies:
            proc.terminate()
        for proc in proxies:
            proc.wait(timeout=60)
    night_proc = night_state.get("proc")
    night_rc = night_proc.wait(timeout=900) if night_proc else None
    return check(backend, location, load, wall, healths, night_state, night_rc, work, adopt)


def outage(location: str, upstream_url: str, args: argparse.Namespace, work: Path) -> dict:
    """One proxy logging to Postgres through a relay that is cut once a quarter of its
    requests are answered (the database gone: connections reset, new ones closed) and
    restored `--outage-s` later (or at three quarters):
    what was answered, spooled, replayed and lost, latency per phase, and how long the spool
    took to empty after the database came back."""
    import httpx

    from tests.pg import Relay

    relay = Relay(location)
    proc, url = proxy_process(relay.url, upstream_url, work / "outage")
    n = 3 * args.trial_requests
    try:
        wait_healthy(url.removesuffix("/v1") + "/health", proc, 120)
        load = Load([url], n, args.concurrency, "outage")

        async def phases(load: Load) -> None:
            done = len(load.answered)
            away = time.time() - load.events.get("cut", time.time())
            if "cut" not in load.events and done >= n // 4:
                relay.cut()
                load.events["cut"] = time.time()
            elif (
                "cut" in load.events
                and "restored" not in load.events
                and (away >= args.outage_s or done >= 3 * n // 4)
            ):
                relay.restore()
                load.events["restored"] = time.time()

        asyncio.run(load.run([phases]))
        health = url.removesuffix("/v1") + "/health"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            log = httpx.get(health, timeout=30).json()["log"]
            if log["state"] == "ok" and log["spool_waiting"] == 0 and log["queued"] == 0:
                break
            time.sleep(0.1)
        emptied = time.time()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        relay.close()
    logged = all_ids(location)
    cut, restored = load.events["cut"], load.events["restored"]

    def phase(lo: float, hi: float) -> dict:
        lat = [x[2] for x in load.answered if lo <= x[3] < hi]
        if not lat:
            return {"answered": 0}
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        return {
            "answered": len(lat),
            "p50_ms": round(1000 * p50, 1),
            "p99_ms": round(1000 * p99, 1),
        }

    return {
        "requests": n,
        "answered": len(load.answered),
        "not_answered": load.failed[0],
        "answered_but_unlogged": sum(iid not in logged for iid, *_ in load.answered),
        "database_away_s": round(restored - cut, 2),
        "spool_emptied_s_after_restore": round(emptied - restored, 2),
        "writer": log,
        "before": phase(0, cut),
        "database_away": phase(cut, restored),
        "after": phase(restored, float("inf")),
    }


def kill_trials(location: str, upstream_url: str, args: argparse.Namespace, work: Path) -> dict:
    """One proxy at a time under load (`--concurrency` in flight), killed with SIGKILL at a
    random point between 30% and 70% of `--trial-requests`: how many answered requests never
    reach the log, trial by trial."""
    import random

    rng = random.Random(0)
    trials = []
    for t in range(args.kill_trials):
        proc, url = proxy_process(location, upstream_url, work / f"trial{t}")
        try:
            wait_healthy(url.removesuffix("/v1") + "/health", proc, 120)
            load = Load([url], args.trial_requests, args.concurrency, f"trial {t}")
            at = int(rng.uniform(0.3, 0.7) * args.trial_requests)
            asyncio.run(load.run([kill_hook(proc, at)]))
        finally:
            proc.kill()
            proc.wait(timeout=60)
        logged = all_ids(location)
        answered = [iid for iid, *_ in load.answered]
        trials.append({"answered": len(answered),
                       "unlogged": sum(iid not in logged for iid in answered)})  # fmt: skip
    unlogged = sum(t["unlogged"] for t in trials)
    answered = sum(t["answered"] for t in trials)
    return {
        "trials": trials,
        "answered": answered,
        "answered_but_unlogged": unlogged,
        "share": round(unlogged / answered, 4) if answered else None,
    }


def check(
    backend: str,
    location: str,
    load: Load,
    wall: float,
    healths: list[dict],
    night_state: dict,
    night_rc: int | None,
    work: Path,
    adopt: dict | None,
) -> dict:
    from selftaught.sleep.intake.log import TaskLog

    with TaskLog(location) as log:
        rows = log.query()
    logged = {it.id for it in rows}
    texts = [it.messages[0]["content"] for it in rows if it.messages]
    duplicated = len(texts) - len(set(texts))
    unlogged = [0] * len(load.urls)
    for iid, k, *_ in load.answered:
        unlogged[k] += iid not in logged
    seen = json.loads((work / "night.json").read_text())["ids"] if night_rc == 0 else []
    before = night_state.get("before", set())
    latencies = [lat for _, _, lat, _ in load.answered]
    return {
        "backend": backend,
        "answered": len(load.answered),
        "answered_per_proxy": load.per_proxy,
        "not_answered_per_proxy": load.failed,
        "rows_in_log": len(rows),
        "answered_but_unlogged_per_proxy": unlogged,
        "answered_but_unlogged_survivors": sum(unlogged[1:]),
        "answered_but_unlogged_killed": unlogged[0],
        "killed_after_answers": load.events.get("killed_after"),
        "duplicated_rows": duplicated,
        "feedback": load.feedback,
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(load.answered) / wall, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.5), 1),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        "writers": healths,
        "night": {
            "exit_code": night_rc,
            "rows_before_it_started": len(before),
            "rows_it_read": len(seen),
            "rows_written_before_it_missed": len(before - set(seen)),
        },
        "adopt_to_replica": adopt,
    }


# ---- adopt on one host, served by the others --------------------------------------------------


def adopt_latency(location: str, urls: list[str], work: Path, flips: int = 6) -> dict:
    """Adopt / roll back in this process (its own home: "host A"); time until every
    surviving proxy ("replicas", other homes) reports the new version on /health."""
    import httpx

    os.environ["SELFTAUGHT_LOG"] = location
    from selftaught.sleep.adoption import staging

    home = work / "host-a"
    folder = staging.nights_dir(PROJECT, home) / "n1"
    atomic_write_text(folder / "proposal" / "skill.md", "Answer briefly.")
    atomic_write_text(folder / "proposal" / "memory.md", "")
    atomic_write_json(folder / "report.json", {"kind": staging.NIGHT_KIND, "night": "n1",
                      "project": PROJECT, "status": "staged", "base_version": 0})  # fmt: skip
    times = []
    for flip in range(flips):
        t0 = time.monotonic()
        if flip == 0:
            staging.adopt(PROJECT, "n1", home=home)
        else:
            staging.rollback(PROJECT, 0 if flip % 2 else 1, home=home)
        want = "1" if flip % 2 == 0 else "0"
        for url in urls:
            while httpx.get(url.removesuffix("/v1") + "/health").json()["adopted_version"] != want:
                time.sleep(0.01)
        times.append(time.monotonic() - t0)
    from selftaught.sleep.store import versions

    return {
        "flips": flips,
        "replicas": len(urls),
        "poll_s": versions.POLL_S,
        "seconds_until_every_replica_serves_it": [round(t, 3) for t in times],
        "max_s": round(max(times), 3),
        "median_s": round(statistics.median(times), 3),
    }


# ---- what logging before the answer would cost ------------------------------------------------


def synchronous_cost(location: str, work: Path, n: int) -> dict:
    """Per-request latency of writing the row before answering: one `TaskLog.add` (its own
    transaction) per request, and one fsynced append to a spool file."""
    from selftaught.sleep.intake.log import Interaction, TaskLog
    from selftaught.sleep.intake.spool import Spool

    def row(i: int) -> Interaction:
        text = f"synchronous {i} " + "words " * 40
        return Interaction([{"role": "user", "content": text}], "echo: " + text, source="proxy")

    adds = []
    with TaskLog(location) as log:
        for i in range(n):
            it = row(i)
            t0 = time.perf_counter()
            log.add(it)
            adds.append(time.perf_counter() - t0)
    spool = Spool(work / "spool")
    appends = []
    for i in range(n):
        it = row(i)
        t0 = time.perf_counter()
        spool.append([it])
        appends.append(time.perf_counter() - t0)
    spool.close()
    return {
        "requests": n,
        "log_add_p50_ms": round(1000 * percentile(adds, 0.5), 2),
        "log_add_p99_ms": round(1000 * percentile(adds, 0.99), 2),
        "spool_fsync_p50_ms": round(1000 * percentile(appends, 0.5), 2),
        "spool_fsync_p99_ms": round(1000 * percentile(appends, 0.99), 2),
    }


# ---- main ----------------------------------------------------------------------------------------


def postgres_server(stack: ExitStack) -> str:
    from tests import pg

    if os.environ.get(pg.ENV):
        return os.environ[pg.ENV]
    cluster = pg.Cluster(durable=True)
    stack.callback(cluster.stop)
    return cluster.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--proxies", type=int, default=4)
    parser.add_argument("--requests", type=int, default=500, help="per proxy")
    parser.add_argument("--concurrency", type=int, default=32, help="in flight per proxy")
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of proxy 0's requests")
    parser.add_argument("--kill-trials", type=int, default=8, help="single proxies killed")
    parser.add_argument("--trial-requests", type=int, default=300)
    parser.add_argument("--outage-s", type=float, default=5.0, help="the database away")
    parser.add_argument("--quick", action="store_true", help="2 proxies x 100 requests")
    parser.add_argument("--out", type=Path, default=RESULTS / "log_load.json")
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream()
        return
    if args.quick:
        args.proxies, args.requests, args.kill_trials, args.trial_requests = 2, 100, 2, 100
    from tests import pg

    report: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0],
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "serve_upstream")},
        "machine_before": machine_info(),
    }
    report["config"]["out"] = str(args.out)
    work = Path(tempfile.mkdtemp(prefix="bench-log-load-"))
    with ExitStack() as stack:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                location = str(work / "sqlite" / "log.db")
                (work / "sqlite").mkdir()
            else:
                location = stack.enter_context(pg.fresh_database(postgres_server(stack)))
            print(f"{backend}: {args.proxies} proxies x {args.requests} requests ...", flush=True)
            result = run_backend(backend, location, args, work / backend / "run")
            result["synchronous_logging"] = synchronous_cost(location, work / backend, 300)
            report[backend] = result
            print(json.dumps(result, indent=2), flush=True)
    report["machine_after"] = machine_info()
    if "sqlite" in report and "postgres" in report:
        s, p = report["sqlite"], report["postgres"]
        report["postgres_vs_sqlite"] = {
            "throughput": round(p["throughput_rps"] / s["throughput_rps"], 3),
            "p50": round(p["p50_ms"] / s["p50_ms"], 3),
            "answered_but_unlogged_killed": [
                p["answered_but_unlogged_killed"],
                s["answered_but_unlogged_killed"],
            ],
            "kill_trials_unlogged_share": [p["kill_trials"]["share"], s["kill_trials"]["share"]],
        }
    atomic_write_json(args.out, report)
    print(f"wrote {args.out} (work folder {work})")


if __name__ == "__main__":
    main()
