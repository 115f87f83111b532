"""Benchmark: selftaught `optimize` vs GEPA 0.1.4, skillrl 1.0.0 and DSPy 3.4.1
(BootstrapFewShotWithRandomSearch, MIPROv2 light, dspy.GEPA), side by side.

Same machine, tasks, seeded disjoint splits (`bench_tasks.build_task(spec, seed=S, ...)`,
handed to every system as the very same examples), seed prompt, answer rule (the task's
instructions after the question, scored by the task's scorer), model (one OpenAI-compatible
endpoint serves target, optimizer and judge) and budget (200 target calls: GEPA's
`max_metric_calls`; selftaught's `Budget(calls=200, roles=("target",))`; skillrl and DSPy's
BootstrapFewShotWithRandomSearch / MIPROv2, which have no such budget, are cut at the 201st
target call and ship their best so far).

Every call is counted at the endpoint (a counting proxy, one route per role), and every
system's shipped prompt is scored here with `selftaught.evaluate`.

The protocol (benchmarks/README.md, "Protocol"; `protocol.py`):

    python benchmarks/bench_peers.py --report           # the latest report round
    python benchmarks/bench_peers.py --report --round 1 # round 1: report_settings.json
    python benchmarks/bench_peers.py --seeds 0 1 2      # dev run: dev seeds, val only
    python benchmarks/bench_peers.py --systems selftaught --config pool=false  # a default swept
    python benchmarks/bench_peers.py --gate             # selftaught's gate settings (dev, val)
    python benchmarks/bench_peers.py --quick            # smoke run on SmolLM2, a few minutes

`--report` runs every system once per report seed with the committed settings file and
scores the shipped prompts on val and test (paired per item with the seed prompt and with
each other: two-sided exact sign tests); it refuses a settings file with uncommitted changes,
and a re-run (`--rerun`; otherwise a sitting skips the finished system-seed pairs, so a killed
report resumes) is a new row beside the old ones in `results/report_<task>.json` (round N > 1:
`report<N>_<task>.json`). A later round (`report_settings_round<N>.json`) has fresh report
seeds, may plan fewer systems on a task (`systems_per_task`), states its targets and
selftaught's settings (`selftaught_config`), and may name the tag its sittings must run on
(`code_tag`; any other commit, or a tree with changes, is refused). Every other mode is a
design tool: dev seeds only (every round's report seeds are refused), val only (test is never
scored).

`--config KEY=VALUE ...` runs selftaught with those `SkillOptConfig` fields changed: its rows
sit beside the default's in the same results file, labelled with the change.

The server is `selftaught serve --model local:<Qwen GGUF>` started by the script (or any
endpoint: `--endpoint http://HOST:PORT/v1#MODEL`). Dev results: results/peers_<task>.json (or
gate_sweep.json); `--quick` writes under runs/bench/quick/. Tables: `python
benchmarks/tables.py` regenerates them from the results files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_tasks import build_task, needs_judge, passing_judge_check, task_kind
from common import (
    BENCH_DIR,
    QWEN_GGUF,
    REPO,
    RESULTS,
    accuracy,
    command_line,
    compare_paired,
    fmt_acc,
    machine_info,
    markdown_table,
    selftaught_server,
    split_spec,
)
from counting_proxy import CallCounter, counting_proxy
from protocol import (
    LATEST_ROUND,
    check_design_use,
    check_round_commit,
    code_state,
    load_report_settings,
    planned_systems,
    round_path,
    round_settings,
    settings_commit,
)

SYSTEMS = ("selftaught", "gepa", "skillrl", "dspy-bfrs", "dspy-mipro", "dspy-gepa")
FROZEN = load_report_settings()  # the tasks, systems and dev seeds every mode starts from
TASKS = tuple(FROZEN["tasks"])  # the first is the arithmetic task --quick runs
SEED_PROMPT = "You are a helpful assistant."
# selftaught's gate settings for --gate: margin in val items, confidence = 1 - p
GATES: dict[str, dict[str, Any]] = {
    "margin1": {"margin": 1.0},
    "p<=0.1": {"margin": 0.0, "confidence": 0.9},
    "p<=0.2": {"margin": 0.0, "confidence": 0.8},
    "margin1+p<=0.1": {"margin": 1.0, "confidence": 0.9},
}
PEERS_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
DRIVER = BENCH_DIR / "peers" / "driver.py"
RUNS = REPO / "runs" / "bench"


@dataclass
class Settings:
    """One benchmark invocation; `--quick` shrinks every size."""

    mode: str = "peers"  # peers (dev) | gate (dev) | report
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    seeds: list[int] = field(default_factory=lambda: list(FROZEN["dev_seeds"]))
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    gates: list[str] = field(default_factory=lambda: ["margin1", "p<=0.1", "p<=0.2"])
    train: int = 30
    val: int = 30
    test: int = 50
    budget: int = 200
    batch_size: int = 15
    minibatch_size: int = 5
    max_tokens: int = 256
    analyst_max_tokens: int = 768
    concurrency: int = 8
    timeout_s: float = 900.0
    seed_prompt: str = SEED_PROMPT
    quick: bool = False
    endpoint: str | None = None
    serve_model: str = f"local:{QWEN_GGUF}"
    serve_name: str = "qwen"
    selftaught_config: dict[str, Any] = field(default_factory=dict)
    rerun: bool = False  # report: run (system, seed) pairs that already have a finished row
    report_round: int = 0  # report: which round's settings file (0: not a report run)

    @property
    def splits(self) -> tuple[str, ...]:
        """What a run is scored on: val and test in a report run, val only in a design run."""
        return ("val", "test") if self.mode == "report" else ("val",)


def parse_config(pairs: Sequence[str]) -> dict[str, Any]:
    """`["pool=false", "demos_max=3"]` → `{"pool": False, "demos_max": 3}`, each key a field of
    `SkillOptConfig` (values read as JSON where they parse, else kept as text)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--config {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return check_config(out)


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` if every key is a `SkillOptConfig` field and the values make a valid config;
    a bad one fails here, before any model starts."""
    from dataclasses import fields

    from selftaught.skill import SkillOptConfig

    known = {f.name for f in fields(SkillOptConfig)}
    unknown = [key for key in config if key not in known]
    if unknown:
        raise SystemExit(
            f"--config {unknown[0]!r}: expected KEY=VALUE with KEY one of "
            f"{', '.join(sorted(known))}"
        )
    SkillOptConfig(**config)
    return config


def config_label(config: dict[str, Any]) -> str:
    """The variant name of a selftaught run with changed defaults: `pool=false,proposals=0`."""
    return ",".join(f"{k}={json.dumps(v)}" for k, v in config.items())


def parse_args(argv: Sequence[str] | None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--report", action="store_true", help="the report run (report_settings.json)")
    p.add_argument(
        "--round",
        type=int,
        help=f"--report: the report round (default {LATEST_ROUND}, the latest; 1: "
        "report_settings.json, N: report_settings_roundN.json)",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="--report: run again the (system, seed) pairs already finished (a new row beside "
        "the old; without it a sitting skips them, so a killed report resumes)",
    )
    p.add_argument("--gate", action="store_true", help="sweep selftaught's gate settings")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, SmolLM2")
    p.add_argument("--tasks", nargs="+", help=f"task specs (default: {' '.join(TASKS)})")
    p.add_argument("--seeds", nargs="+", type=int, help="split + run seeds (dev: the dev seeds)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, help="default: all of them")
    p.add_argument("--gates", nargs="+", choices=list(GATES), help="gate settings for --gate")
    p.add_argument("--budget", type=int, help="target calls per run (default 200)")
    p.add_argument("--endpoint", help="use this endpoint, http://HOST:PORT/v1#MODEL")
    p.add_argument(
        "--serve-model", help=f"model for `selftaught serve` (default local:{QWEN_GGUF})"
    )
    p.add_argument("--seed-prompt", help=f"the prompt every system starts from ({SEED_PROMPT!r})")
    p.add_argument("--concurrency", type=int, help="requests in flight per system (default 8)")
    p.add_argument(
        "--config", nargs="+", metavar="KEY=VALUE", help="selftaught SkillOptConfig changes"
    )
    args = p.parse_args(argv)
    if args.report:
        return report_settings(args)
    if args.rerun:
        raise SystemExit("--rerun is for --report (a dev run replaces its rows anyway)")
    if args.round is not None:
        raise SystemExit("--round is for --report (a dev run scores dev seeds only)")
    s = quick_settings() if args.quick else Settings()
    if args.gate:
        s.mode, s.systems = "gate", ["selftaught"]
        s.seeds = [0] if args.quick else [0, 1, 2]
    for name in ("tasks", "seeds", "systems", "gates", "budget", "endpoint", "concurrency"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.serve_model:
        s.serve_model, s.serve_name = args.serve_model, "model"
    if args.seed_prompt:
        s.seed_prompt = args.seed_prompt
    if args.config:
        s.selftaught_config = parse_config(args.config)
    for spec in s.tasks:
        task_kind(spec)  # an unknown form fails here, before any model starts
    check_design_use("bench_peers.py outside --report", seeds=s.seeds, splits=s.splits)
    return s


def report_settings(args: argparse.Namespace) -> Settings:
    """The report run's settings, all from the committed report_settings.json: its report
    seeds, tasks, systems and settings. `--tasks / --systems / --seeds` may pick a subset (a
    report run spread over sittings); `--endpoint` / `--concurrency` say where and how the same
    model is served; nothing else may change."""
    changed = [f"--{k.replace('_', '-')}" for k in ("gate", "quick", "config", "gates", "budget",
               "serve_model", "seed_prompt") if getattr(args, k)]  # fmt: skip
    if changed:
        raise SystemExit(
            f"--report takes its settings from report_settings.json; {', '.join(changed)} would "
            "change them (a changed setting is a new settings file, committed before the run)"
        )
    round_ = LATEST_ROUND if args.round is None else args.round
    frozen = round_settings(round_)
    s = Settings(**{**frozen["settings"], "mode": "report", "report_round": round_})
    check_config(s.selftaught_config)  # the file's selftaught settings, before any model
    s.tasks, s.systems, s.seeds = frozen["tasks"], frozen["systems"], frozen["report_seeds"]
    for name in ("tasks", "systems", "seeds"):
        picked = getattr(args, name)
        if picked is None:
            continue
        extra = [x for x in picked if x not in getattr(s, name)]
        if extra:
            raise SystemExit(f"--report: {name} {extra} are not in {round_path(round_).name}")
        setattr(s, name, list(picked))
    if args.endpoint:
        s.endpoint = args.endpoint
    if args.concurrency:
        s.concurrency = args.concurrency
    s.rerun = args.rerun
    return s


def quick_settings() -> Settings:
    return Settings(
        tasks=[TASKS[0]],
        seeds=[0],
        gates=["margin1", "p<=0.2"],
        train=6,
        val=6,
        test=8,
        budget=20,
        batch_size=4,
        minibatch_size=4,
        max_tokens=48,
        analyst_max_tokens=256,
        quick=True,
        serve_model="local",
        serve_name="smollm2",
    )


def planned_epochs(budget: int, train: int, val: int, batch: int) -> int:
    """Epochs for selftaught and skillrl such that the budget, not the schedule, ends the run:
    enough steps for the budget even when no step spends val calls (a step with no edit, or
    only edits rejected before, validates nothing), rounded up to whole epochs, plus one.
    The first measured runs planned for a val evaluation every step (3 epochs at the default
    settings) and ended on their schedule after 150 of the 200 target calls."""
    steps = max(1, math.ceil((budget - val) / min(batch, train)))
    return math.ceil(steps / math.ceil(train / batch)) + 1


# ---- endpoint, evaluation, one system's run ---------------------------------------------


@contextlib.contextmanager
def endpoint(s: Settings) -> Iterator[str]:
    """The upstream spec `http://HOST:PORT/v1#NAME`: the one given, or a `selftaught serve`."""
    if s.endpoint:
        yield s.endpoint
        return
    model_path = s.serve_model.removeprefix("local:")
    if s.serve_model.startswith("local:") and not Path(model_path).expanduser().exists():
        raise SystemExit(f"{model_path} is missing; run: bash benchmarks/peers/setup.sh --qwen")
    model = s.serve_model if s.serve_model == "local" else f"local:{Path(model_path).expanduser()}"
    with selftaught_server(model, s.serve_name, max_batch_size=s.concurrency) as spec:
        yield spec


@dataclass
class Bench:
    """What every run shares: the settings, the proxy's root URL and its counter."""

    s: Settings
    proxy: str
    model_name: str
    counter: CallCounter

    def url(self, role: str) -> str:
        return f"{self.proxy}/{role}/v1"

    def task(self, spec: str, seed: int) -> Any:
        """The task of `spec` on `seed`'s splits; a judge task's judge is the endpoint's model
        on the `judge` route (counted apart)."""
        judge = f"{self.url('judge')}#{self.model_name}" if needs_judge(spec) else None
        return build_task(
            spec,
            seed=seed,
            train_size=self.s.train,
            val_size=self.s.val,
            test_size=self.s.test,
            judge_model=judge,
            judge_timeout_s=self.s.timeout_s,
        )

    def score(self, task: Any, prompt: str, split: str) -> dict[str, float | None]:
        """Per-example hard scores of `prompt` on `split` (None where a rollout errored)."""
        import selftaught
        from selftaught.models import GenerationParams
        from selftaught.rollout import RolloutConfig

        params = GenerationParams(max_tokens=self.s.max_tokens, temperature=0.0)
        rollout = RolloutConfig(
            concurrency=self.s.concurrency,
            timeout_s=self.s.timeout_s,
            params=params,
            progress=False,
        )
        result = selftaught.evaluate(
            task,
            f"{self.url('eval')}#{self.model_name}",
            skill=prompt,
            split=split,  # type: ignore[arg-type]
            rollout=rollout,
            model_options={"timeout_s": self.s.timeout_s},
        )
        if result.n_errors:
            first = next(r.error for r in result.rollouts if r.error)
            print(f"warning: {result.n_errors} {split} rollouts failed, e.g. {first}", flush=True)
        return {r.example_id: (r.score.hard if r.ok and r.score else None) for r in result.rollouts}


def make_job(b: Bench, system: str, task: Any, spec: str, seed: int, out_dir: Path) -> dict:
    s = b.s
    return {
        "system": system,
        "task": {
            "spec": spec,
            "seed": seed,
            "train_size": s.train,
            "val_size": s.val,
            "test_size": s.test,
        },
        "examples": {
            split: [
                {"id": e.id, "input": e.input, "reference": str(e.reference)}
                for e in task.examples(split)
            ]
            for split in ("train", "val")
        },
        "seed": seed,
        "seed_prompt": s.seed_prompt,
        "target_url": b.url("target"),
        "optimizer_url": b.url("optimizer"),
        "judge_url": b.url("judge") if needs_judge(spec) else None,
        "model_name": b.model_name,
        "budget_calls": s.budget,
        "epochs": planned_epochs(s.budget, s.train, s.val, s.batch_size),
        "batch_size": s.batch_size,
        "minibatch_size": s.minibatch_size,
        "max_tokens": s.max_tokens,
        "analyst_max_tokens": s.analyst_max_tokens,
        "concurrency": s.concurrency,
        "timeout_s": s.timeout_s,
        "out_dir": str(out_dir),
    }


def run_driver(system: str, job: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run peers/driver.py on `job` with the system's interpreter in a fresh run dir; its
    output goes to `<out_dir>.log`. Returns the driver's result (or {"error": ...})."""
    python = sys.executable if system == "selftaught" else str(PEERS_PYTHON)
    shutil.rmtree(out_dir, ignore_errors=True)  # every system resumes from a run dir it finds
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = (
        out_dir.parent / f"{out_dir.name}.{kind}" for kind in ("job.json", "result.json", "log")
    )
    job_path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    result_path.unlink(missing_ok=True)
    import selftaught  # the driver must score with this very code

    env = {**os.environ, "PYTHONPATH": str(Path(selftaught.__file__).parents[1])}
    with open(log_path, "wb") as log:
        code = subprocess.call(
            [python, str(DRIVER), str(job_path), str(result_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    if code != 0 or not result_path.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        return {"error": f"exit {code}: " + " / ".join(tail), "log": str(log_path)}
    return json.loads(result_path.read_text(encoding="utf-8"))


def run_one(
    b: Bench, task: Any, spec: str, seed: int, system: str, variant: str, baseline: dict
) -> dict[str, Any]:
    """One system's optimization, counted at the proxy, then its shipped prompt scored on
    val and test (outside the budget) and compared with the seed prompt's scores."""
    run_name = re.sub(r"[^A-Za-z0-9.+-]+", "_", variant)  # p<=0.1 → p_0.1
    out_dir = RUNS / ("quick" if b.s.quick else "peers") / task_slug(spec) / f"s{seed}" / run_name
    job = make_job(b, system, task, spec, seed, out_dir)
    if system == "selftaught":
        job["gate"] = GATES.get(variant, {})  # {}: the package's default gate
        job["config"] = b.s.selftaught_config
    b.counter.take()
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = run_driver(system, job, out_dir)
    row: dict[str, Any] = {
        "task": spec,
        "seed": seed,
        "system": system,
        "variant": variant,
        "gate": job.get("gate"),
        "wall_s_process": round(time.perf_counter() - t0, 2),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "usage": b.counter.take(),
        **result,
    }
    if system == "selftaught":
        row["gate"] = gate_used(out_dir)
    if "error" in result:
        return row
    shipped = result["shipped_prompt"]
    for split in b.s.splits:
        scores = baseline[split] if same_prompt(shipped, b.s.seed_prompt) else None
        scores = scores or b.score(task, shipped, split)
        row[split] = {
            "seed": accuracy(baseline[split]),
            "shipped": accuracy(scores),
            "paired": compare_paired(baseline[split], scores),
        }
        if b.s.mode == "report":  # per item: the tables pair systems with each other
            row[split] |= {"items": scores, "seed_items": baseline[split]}
    row["eval_usage"] = b.counter.take()  # outside the budget, reported apart
    row["shipped_is_seed"] = same_prompt(shipped, b.s.seed_prompt)
    return row


def gate_used(run_dir: Path) -> dict[str, Any] | None:
    """The gate a selftaught run really ran with, from its run dir's config.json."""
    config = run_dir / "config.json"
    if not config.exists():
        return None
    gate = json.loads(config.read_text()).get("gate") or {}
    return {"margin": gate.get("margin"), "confidence": gate.get("confidence")}


def gate_label(gate: dict[str, Any] | None) -> str:
    """`margin 1, p<=0.2` for margin 1 plus a sign test at confidence 0.8."""
    if not gate or gate.get("margin") is None:
        return ""
    label = f"margin {gate['margin']:g}"
    if gate.get("confidence"):
        label += f", p<={1 - gate['confidence']:.2g}"
    return label


def same_prompt(a: str, b: str) -> bool:
    from selftaught.policy import Policy

    return Policy(a).skill_hash() == Policy(b).skill_hash()


def task_slug(spec: str) -> str:
    return spec.removeprefix("gym:").split("?")[0]


def report_file(round_: int, spec: str) -> str:
    """A round's results file for one task: round 1's `report_<task>.json` kept its name."""
    return f"report{'' if round_ == 1 else round_}_{task_slug(spec)}.json"


def variants(s: Settings, spec: str | None = None) -> list[tuple[str, str]]:
    """(system, variant) pairs to run per task and seed; a report round runs on `spec` only
    the systems it plans there."""
    if s.mode == "gate":
        return [("selftaught", gate) for gate in s.gates]
    systems = s.systems
    if s.mode == "report" and spec is not None:
        planned = planned_systems(round_settings(s.report_round), spec)
        systems = [system for system in s.systems if system in planned]
    # a report round's selftaught settings are its file's, and its rows are "selftaught"
    changed = "" if s.mode == "report" else config_label(s.selftaught_config)
    return [
        (system, changed if system == "selftaught" and changed else system) for system in systems
    ]


def finished_report_runs(s: Settings, spec: str) -> set[tuple[str, int]]:
    """The (variant, seed) pairs a report sitting skips: those with a finished row saved
    (a failed run is not a result, so it runs again), unless `--rerun` asks for a new row."""
    path = results_dir(s) / report_file(s.report_round, spec)
    if s.mode != "report" or s.rerun or not path.exists():
        return set()
    return set(first_runs(json.loads(path.read_text())["runs"]))


# what the seed prompt's per-item scores depend on, beside the task, seed and settings commit
BASELINE_FIELDS = ("train", "val", "test", "max_tokens", "seed_prompt", "serve_model", "endpoint")


def saved_baseline(s: Settings, spec: str, seed: int) -> dict[str, dict[str, Any]] | None:
    """The seed prompt's per-item val and test scores from a finished report row of this task
    and seed, measured under the same settings commit: a resumed sitting reuses them instead
    of scoring the seed prompt again (130 calls, ~8 min on Qwen on 2 CPUs). None when there
    is no such row, and always under `--rerun` (a re-run measures everything afresh)."""
    path = results_dir(s) / report_file(s.report_round, spec)
    if s.mode != "report" or s.rerun or not path.exists():
        return None
    saved = json.loads(path.read_text())
    mine = asdict(s)
    if any(saved.get("settings", {}).get(k) != mine.get(k) for k in BASELINE_FIELDS):
        return None
    commit = settings_commit(round_path(s.report_round))
    for row in first_runs(saved["runs"]).values():
        if row["seed"] != seed or row.get("meta", {}).get("settings_commit") != commit:
            continue
        if all("seed_items" in row.get(split, {}) for split in s.splits):
            return {split: row[split]["seed_items"] for split in s.splits}
    return None


def unchecked_judge(s: Settings, spec: str) -> str | None:
    """Why a report run skips `spec`: a judge task whose judge (the endpoint's model) has no
    saved judge check in which it grades (`bench_tasks.py --judge-check`); a judge that
    cannot tell a right answer from a wrong one would make its rows noise."""
    if s.mode != "report" or not needs_judge(spec):
        return None
    judge = s.endpoint or s.serve_model
    if passing_judge_check(spec, judge, RESULTS) is not None:
        return None
    return (
        f"[{task_slug(spec)}] skipped: no judge check in {RESULTS} in which {judge} grades "
        f"this task; run: python benchmarks/bench_tasks.py {spec} --judge-check --model {judge}"
    )


def run_task(
    b: Bench, spec: str, on_row: Callable[[list[dict[str, Any]]], None] | None = None
) -> list[dict[str, Any]]:
    """Every (system, seed) run on one task; `on_row` sees the rows so far after each run."""
    rows: list[dict[str, Any]] = []
    done = finished_report_runs(b.s, spec)
    planned = variants(b.s, spec)
    for seed in b.s.seeds:
        todo = [(sys_, v) for sys_, v in planned if (v, seed) not in done]
        for _, variant in sorted(set(planned) - set(todo)):
            print(f"[{task_slug(spec)} s{seed}] {variant}: finished before, skipped (see --rerun)")
        if not todo:
            continue
        task = b.task(spec, seed)
        b.counter.take()
        baseline = saved_baseline(b.s, spec, seed)
        where, splits = f"[{task_slug(spec)} s{seed}]", ", ".join(b.s.splits)
        if baseline is None:
            print(f"{where} scoring the seed prompt on {splits} ...", flush=True)
            baseline = {split: b.score(task, b.s.seed_prompt, split) for split in b.s.splits}
        else:
            print(f"{where} the seed prompt's {splits} scores: the saved ones", flush=True)
        for system, variant in todo:
            print(f"[{task_slug(spec)} s{seed}] {variant} ...", flush=True)
            row = run_one(b, task, spec, seed, system, variant, baseline)
            print(f"[{task_slug(spec)} s{seed}] {variant}: {row_line(row)}", flush=True)
            rows.append(row)
            if on_row is not None:
                on_row(rows)
    return rows


# ---- tables -----------------------------------------------------------------------------


def scored_split(row: dict[str, Any]) -> str:
    """The split a row's table shows: test where it was scored (report runs, and dev runs
    from before the protocol), else val."""
    return "test" if "test" in row else "val"


def row_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"FAILED ({row['error']})"
    split = scored_split(row)
    t = row[split]
    return (
        f"{split} {fmt_acc(t['seed'])} -> {fmt_acc(t['shipped'])}, "
        f"W/L {t['paired']['wins']}/{t['paired']['losses']}, "
        f"target calls {calls(row, 'target')}, optimizer calls {calls(row, 'optimizer')}"
    )


def calls(row: dict[str, Any], role: str) -> int:
    return int(row.get("usage", {}).get(role, {}).get("calls", 0))


def calls_cell(row: dict[str, Any], role: str) -> str:
    """Answered calls, plus the ones sent but given up on (still work for the server)."""
    use = row.get("usage", {}).get(role, {})
    unanswered = int(use.get("sent", 0)) - int(use.get("calls", 0))
    return f"{calls(row, role)}" + (f" (+{unanswered} unanswered)" if unanswered > 0 else "")


def tokens(row: dict[str, Any]) -> int:
    return sum(int(u.get("tokens", 0)) for u in row.get("usage", {}).values())


def p_two_sided(paired: dict[str, Any]) -> float:
    from selftaught.stats import sign_test_two_sided

    return sign_test_two_sided(int(paired["wins"]), int(paired["losses"]))


def fmt_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def detectable_line(n: int, what: str) -> str:
    """The table header's statement of the smallest gain `n` paired items can show."""
    from selftaught.stats import min_detectable_difference, min_detectable_wins

    wins = min_detectable_wins(0.05)
    mdd = min_detectable_difference(n, 0.05)
    if mdd is None:
        return f"{n} {what} items cannot show any difference at α = 0.05 (two-sided)."
    return (
        f"Paired tests are two-sided exact sign tests (McNemar). On {n} {what} items the "
        f"smallest difference they can show at α = 0.05 is **{mdd:.3f}** ({wins} items won, "
        "none lost); a smaller Δ is not evidence either way."
    )


def peers_table(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown row per run: the scored split (seed prompt → shipped), the paired test
    against the seed prompt (two-sided), calls per role and tokens within the budget, wall
    time."""
    header = [
        "system",
        "seed",
        "split",
        "seed → shipped [95% CI]",
        "Δ",
        "W/L",
        "p (two-sided)",
        "target calls",
        "optimizer calls",
        "tokens",
        "wall s",
        "accepted / steps",
    ]
    body = []
    for r in rows:
        if "error" in r:
            body.append([system_label(r), r["seed"], "", f"failed: {r['error']}", *[""] * 8])
            continue
        split = scored_split(r)
        t = r[split]
        body.append(
            [
                system_label(r),
                r["seed"],
                split,
                f"{fmt_acc(t['seed'])} → {fmt_acc(t['shipped'])}",
                f"{t['paired']['delta']:+.2f}",
                f"{t['paired']['wins']}/{t['paired']['losses']}",
                fmt_p(p_two_sided(t["paired"])),
                calls_cell(r, "target"),
                calls_cell(r, "optimizer"),
                f"{tokens(r):,}",
                f"{r.get('wall_s', 0):.0f}",
                f"{_or_dash(r.get('accepted'))} / {_or_dash(r.get('steps'))}",
            ]
        )
    return markdown_table(header, body)


def system_label(row: dict[str, Any]) -> str:
    """`gepa 0.1.4`, or `selftaught 0.1.0 (p<=0.1)` for one of the gate sweep's settings."""
    label = f"{row['system']} {row.get('version', '')}".strip()
    if row["variant"] != row["system"]:
        return f"{label} ({row['variant']})"
    gate = gate_label(row.get("gate")) if row["system"] == "selftaught" else ""
    return f"{label} (gate: {gate})" if gate else label


def _or_dash(value: Any) -> str:
    return "–" if value is None else str(value)


def gate_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per gate setting, over tasks × seeds, on each row's scored split (val in a design
    run): accepted-step rate, regressions and gains (by the intervals and by the two-sided
    paired sign test at p ≤ 0.05), mean change."""
    out = []
    for gate in dict.fromkeys(r["variant"] for r in rows):
        done = [r for r in rows if r["variant"] == gate and "error" not in r]
        steps = sum(int(r.get("steps") or 0) for r in done)
        accepted = sum(int(r.get("accepted") or 0) for r in done)
        tests = [r[scored_split(r)]["paired"] for r in done]
        out.append(
            {
                "gate": gate,
                "runs": len(done),
                "failed": sum(1 for r in rows if r["variant"] == gate and "error" in r),
                "steps": steps,
                "accepted": accepted,
                "accept_rate": round(accepted / steps, 3) if steps else 0.0,
                "shipped_changed": sum(not r["shipped_is_seed"] for r in done),
                "regressions_ci": sum(t["regression_beyond_ci"] for t in tests),
                "regressions_paired": sum(t["delta"] < 0 and p_two_sided(t) <= 0.05 for t in tests),
                "test_drops": sum(t["delta"] < 0 for t in tests),
                "gains_ci": sum(t["gain_beyond_ci"] for t in tests),
                "gains_paired": sum(t["delta"] > 0 and p_two_sided(t) <= 0.05 for t in tests),
                "mean_delta": round(sum(t["delta"] for t in tests) / len(tests), 4)
                if tests
                else 0.0,
            }
        )
    return out


def gate_table(summary: Sequence[dict[str, Any]]) -> str:
    header = [
        "gate",
        "runs",
        "accepted / steps",
        "shipped ≠ seed",
        "regressions (CI / two-sided p≤0.05 / any drop)",
        "gains (CI / two-sided p≤0.05)",
        "mean Δ",
    ]
    body = [
        [
            g["gate"],
            g["runs"] + g["failed"] if not g["failed"] else f"{g['runs']} (+{g['failed']} failed)",
            f"{g['accepted']} / {g['steps']} ({g['accept_rate']:.0%})",
            g["shipped_changed"],
            f"{g['regressions_ci']} / {g['regressions_paired']} / {g['test_drops']}",
            f"{g['gains_ci']} / {g['gains_paired']}",
            f"{g['mean_delta']:+.3f}",
        ]
        for g in summary
    ]
    return markdown_table(header, body)


def header_lines(s: dict[str, Any], meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The run's command, machine, load, versions and settings (`s`: Settings as a dict)."""
    peer_versions = sorted({f"{r['system']} {r['version']}" for r in rows if "version" in r})
    split = scored_split(rows[0]) if rows and "error" not in rows[0] else "val"
    n = s["test"] if split == "test" else s["val"]
    return "\n".join(
        [
            f"Command: `{meta['command']}`  ",
            f"Date: {meta['date']}; machine: {meta['machine']}, {meta['cpu_count']} CPUs; "
            f"load average (1/5/15 min) at start {meta['loadavg']}, at end "
            f"{meta.get('loadavg_end', '(still running)')}; total wall {meta['wall_s']:.0f} s  ",
            f"Versions: {', '.join(peer_versions)}; python {meta['python']}; "
            f"model `{meta['endpoint']}`  ",
            f"Settings: train {s['train']} / val {s['val']} / test {s['test']}, budget "
            f"{s['budget']} target calls, batch {s['batch_size']}, minibatch "
            f"{s['minibatch_size']}, max_tokens {s['max_tokens']} (optimizer "
            f"{s['analyst_max_tokens']}), temperature 0, concurrency {s['concurrency']}, "
            f"seed prompt {s['seed_prompt']!r}  ",
            detectable_line(n, split),
        ]
    )


def report(
    s: dict[str, Any], meta: dict[str, Any], by_task: dict[str, list[dict[str, Any]]]
) -> str:
    rows = [r for task_rows in by_task.values() for r in task_rows]
    parts = [header_lines(s, meta, rows), ""]
    if s["mode"] == "gate":
        parts += ["All tasks and seeds together:", "", gate_table(gate_summary(rows)), ""]
    for spec, task_rows in by_task.items():
        parts += [f"`{spec}`:", "", peers_table(task_rows), ""]
    return "\n".join(parts)


def saved_peers_report(out_dir: Path) -> str:
    """Every task measured so far on dev seeds (one `peers_<task>.json` each, maybe from
    separate runs of the script), each under its own command, date and load."""
    sections = []
    for path in sorted(out_dir.glob("peers_*.json")):
        if "." in path.stem:
            continue  # a copy kept aside by `merged_runs` (other settings), not a current task
        saved = json.loads(path.read_text())
        spec = saved["runs"][0]["task"] if saved["runs"] else path.stem.removeprefix("peers_")
        sections.append(report(saved["settings"], saved["meta"], {spec: saved["runs"]}))
    return "\n".join(sections)


# ---- the report run's tables ------------------------------------------------------------


def first_runs(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The first finished run of each (system, seed): what a report counts. A re-run is a
    new row the tables show beside it, never a replacement."""
    first: dict[tuple[str, int], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r.get("meta", {}).get("date", "")):
        if "error" not in r:
            first.setdefault((r["variant"], r["seed"]), r)
    return first


def first_reruns(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The first finished re-run of each (system, seed) that has one: shown beside the first
    runs, never counted by the targets. The first, not the best, so that re-running cannot
    pick a number."""
    first = first_runs(rows)
    later = [r for r in rows if "error" not in r and r is not first[(r["variant"], r["seed"])]]
    return first_runs(later)


def pooled(rows: Sequence[dict[str, Any]], a: str, b: str, reruns: bool = False) -> dict[str, Any]:
    """`b`'s shipped prompt against `a`'s (the seed prompt when `a` is "seed") on the same
    test items of every seed both ran: wins, losses, Δ, two-sided p. `a` is read from its
    first runs; `b` from its first re-run per seed when `reruns`, else its first runs."""
    from common import compare_paired

    first = first_runs(rows)
    left: dict[str, float | None] = {}
    right: dict[str, float | None] = {}
    for (variant, seed), row in (first_reruns(rows) if reruns else first).items():
        if variant != b or (a != "seed" and (a, seed) not in first):
            continue
        base = row["test"]["seed_items"] if a == "seed" else first[(a, seed)]["test"]["items"]
        left |= {f"s{seed}/{k}": v for k, v in base.items()}
        right |= {f"s{seed}/{k}": v for k, v in row["test"]["items"].items()}
    c = compare_paired(left, right)
    return {**c, "p_two_sided": p_two_sided(c)}


def report_task_table(saved: dict[str, Any]) -> str:
    """One report task: every run (date, commits), then per system the pooled gain over the
    seed prompt and its pairing with selftaught on the very same test items."""
    rows = saved["runs"]
    s = saved["settings"]
    lines = [
        f"Settings file commit `{saved['settings_commit'][:10]}`; train {s['train']} / val "
        f"{s['val']} / test {s['test']} per seed, budget {s['budget']} target calls, model "
        f"`{s['serve_model']}`.  ",
        detectable_line(s["test"], "test") + " Pooled over the seeds, n is larger.",
        "",
    ]
    body = []
    for r in rows:
        when = r.get("meta", {}).get("date", "")[:16]
        commit = r.get("code", {}).get("commit", "")[:8] + (
            "+" if r.get("code", {}).get("dirty") else ""
        )
        if "error" in r:
            body.append(
                [system_label(r), r["seed"], f"{when} {commit}", f"failed: {r['error']}", *[""] * 5]
            )
            continue
        t = r["test"]
        body.append(
            [
                system_label(r),
                r["seed"],
                f"{when} {commit}",
                f"{fmt_acc(t['seed'])} → {fmt_acc(t['shipped'])}",
                f"{t['paired']['delta']:+.2f}",
                f"{t['paired']['wins']}/{t['paired']['losses']}",
                fmt_p(p_two_sided(t["paired"])),
                " / ".join(calls_cell(r, role) for role in ("target", "optimizer", "judge")),
                f"{r.get('wall_s', 0):.0f}",
            ]
        )
    header = ["system", "seed", "run (UTC, commit)", "test: seed → shipped [95% CI]", "Δ", "W/L",
              "p (two-sided)", "calls: target / optimizer / judge", "wall s"]  # fmt: skip
    lines += [markdown_table(header, body), ""]
    variants = list(dict.fromkeys(v for v, _ in first_runs(rows)))
    rerun = list(dict.fromkeys(v for v, _ in first_reruns(rows)))
    summary = []
    for v, again in [(v, False) for v in variants] + [(v, True) for v in rerun]:
        gain = pooled(rows, "seed", v, reruns=again)
        vs = (
            pooled(rows, "selftaught", v, reruns=again)
            if (again or v != "selftaught") and "selftaught" in variants
            else None
        )
        summary.append(
            [
                f"{v}, re-run (not counted)" if again else v,
                gain["n_paired"],
                f"{gain['delta']:+.3f}",
                f"{gain['wins']}/{gain['losses']}",
                fmt_p(gain["p_two_sided"]),
                "–" if vs is None else versus_cell(vs),
            ]
        )
    header = ["system (first run per seed; a re-run: its first per seed)", "test items",
              "Δ vs seed prompt", "W/L", "p (two-sided)",
              "vs selftaught's first run on the same items: Δ (W/L, two-sided p)"]  # fmt: skip
    frozen = round_settings(saved_round(saved))  # what the round plans, not the last sitting
    planned = (planned_systems(frozen, saved["task"]), frozen["report_seeds"])
    lines += [markdown_table(header, summary), "",
              targets_line(rows, *planned, **round_targets(frozen))]  # fmt: skip
    return "\n".join(lines)


def saved_round(saved: dict[str, Any]) -> int:
    """The round a saved report file belongs to (round 1's files predate the field)."""
    return int(saved.get("settings", {}).get("report_round") or 1)


def round_targets(frozen: dict[str, Any]) -> dict[str, Any]:
    """A round's targets as `targets` keywords (round 1's file predates the field: issue
    #34's targets, one seed's gain; round 2 adds issue #52's: two seeds, no peer ahead)."""
    wanted = frozen.get("targets", {})
    return {
        "min_gain_seeds": int(wanted.get("min_gain_seeds", 1)),
        "no_peer_ahead_beyond_chance": bool(wanted.get("no_peer_ahead_beyond_chance", False)),
    }


def targets(
    rows: Sequence[dict[str, Any]],
    systems_planned: Sequence[str] = (),
    seeds_planned: Sequence[int] = (),
    min_gain_seeds: int = 1,
    no_peer_ahead_beyond_chance: bool = False,
) -> dict[str, Any]:
    """A round's targets on one task, read from the first runs: selftaught's mean test gain
    over the seeds ≥ every peer's; at least `min_gain_seeds` seeds whose gain is beyond chance
    (two-sided p < 0.05) and no seed with a loss beyond it; with
    `no_peer_ahead_beyond_chance`, no peer ahead of selftaught beyond chance on the same
    items (pooled over the seeds both ran). The verdict stays "open" until every planned
    system ran every planned seed; then it is "met" or "missed"."""
    first = first_runs(rows)
    seeds = sorted({seed for _, seed in first})
    systems = sorted({variant for variant, _ in first})

    def mean_gain(v: str, on: Sequence[int]) -> float:
        # rounded: deltas are stored to 6 places, and two sums of the same items gained must
        # tie (0.30 + 0.41 + 0.59 and 0.39 + 0.36 + 0.55 differ in the 16th digit as floats)
        return round(sum(first[(v, s)]["test"]["paired"]["delta"] for s in on) / len(on), 9)

    mine = [s for s in seeds if ("selftaught", s) in first]
    st = [first[("selftaught", s)]["test"]["paired"] for s in mine]
    beyond = [p for p in st if p_two_sided(p) < 0.05]
    behind = []  # peers ahead of selftaught on the seeds both ran
    for v in systems:
        both = [s for s in mine if (v, s) in first]
        if v != "selftaught" and both and mean_gain(v, both) > mean_gain("selftaught", both):
            behind.append(v)
    all_systems, all_seeds = set(systems_planned) | set(systems), set(seeds_planned) | set(seeds)
    finished = sum((v, s) in first for v in all_systems for s in all_seeds)
    gains, losses = sum(p["delta"] > 0 for p in beyond), sum(p["delta"] < 0 for p in beyond)
    complete = finished == len(all_systems) * len(all_seeds)
    ahead = []  # peers ahead of selftaught beyond chance, pooled on the same items
    if no_peer_ahead_beyond_chance and mine:
        for v in (v for v in systems if v != "selftaught"):
            vs = pooled(rows, "selftaught", v)
            if vs["n_paired"] and vs["delta"] > 0 and vs["p_two_sided"] < 0.05:
                ahead.append(v)
    met = not behind and not ahead and gains >= min_gain_seeds and losses == 0
    ran = {v: [s for w, s in first if w == v] for v in systems if v != "selftaught"}
    peers = [(v, mean_gain(v, on), len(on)) for v, on in ran.items()]  # (name, gain, seeds)
    return {
        "seeds": seeds, "systems": systems, "n_seeds_planned": len(all_seeds),
        "n_systems_planned": len(all_systems), "finished": finished, "complete": complete,
        "ours": mean_gain("selftaught", mine) if mine else None, "behind": behind,
        "ahead_beyond_chance": ahead, "min_gain_seeds": min_gain_seeds,
        "best_peer": max(peers, key=lambda p: p[1]) if peers else None,
        "n_selftaught": len(st), "gains": gains, "losses": losses,
        "verdict": ("met" if met else "missed") if complete else "open",
    }  # fmt: skip


def targets_line(
    rows: Sequence[dict[str, Any]],
    systems_planned: Sequence[str] = (),
    seeds_planned: Sequence[int] = (),
    **wanted: Any,
) -> str:
    t = targets(rows, systems_planned, seeds_planned, **wanted)
    planned = f" of {t['n_systems_planned']} systems × {t['n_seeds_planned']} seeds planned"
    if t["behind"]:
        owners = [v + "'s" for v in t["behind"]]
        names = " and ".join([", ".join(owners[:-1]), owners[-1]] if owners[:-1] else owners)
        comparison = f", below {names} on the seeds both ran"
    elif t["best_peer"] is None:
        comparison = " (no peer has run yet)"
    else:
        comparison = ", ≥ every peer's on the seeds both ran"
    return (
        f"Targets ({len(t['seeds'])} seed(s), {len(t['systems'])} system(s) with a finished run"
        + ("" if t["complete"] else planned)
        + f": **{t['verdict']}**): selftaught's mean test gain "
        + ("–" if t["ours"] is None else f"{t['ours']:+.3f}")
        + comparison
        + (
            f"; ahead of it beyond chance on the same items: {', '.join(t['ahead_beyond_chance'])}"
            if t["ahead_beyond_chance"]
            else ""
        )
        + f"; seeds with a gain beyond chance (two-sided p < 0.05): "
        f"{t['gains']} of {t['n_selftaught']}"
        + (f" (the target: {t['min_gain_seeds']})" if t["min_gain_seeds"] > 1 else "")
        + f"; with a loss beyond it: {t['losses']}."
    )


def seeds_count(n: int) -> str:
    return f"{n} seed{'s' * (n != 1)}"


def report_status_table(out_dir: Path, round_: int = 1) -> str:
    """Every task the round's settings file plans, in its order: how far its report run is
    and its targets' verdict; a judge task without a judge that passed the judge check says
    so."""
    frozen = round_settings(round_)
    seeds = frozen["report_seeds"]
    judge = frozen["settings"]["serve_model"]
    body = []
    for spec in frozen["tasks"]:
        systems = planned_systems(frozen, spec)
        path = out_dir / report_file(round_, spec)
        if not path.exists():
            unchecked = needs_judge(spec) and not passing_judge_check(spec, judge, out_dir)
            why = "not run: no judge passed the judge check" if unchecked else "not run yet"
            body.append([task_slug(spec), f"0 / {len(systems) * len(seeds)}", "–", "–", "–", why])
            continue
        t = targets(json.loads(path.read_text())["runs"], systems, seeds, **round_targets(frozen))
        peer = "–"
        if t["best_peer"] is not None:
            name, gain, n_seeds = t["best_peer"]
            peer = f"{gain:+.3f} ({name}, {seeds_count(n_seeds)})"
        body.append([
            task_slug(spec),
            f"{t['finished']} / {t['n_systems_planned'] * t['n_seeds_planned']}",
            "–" if t["ours"] is None else f"{t['ours']:+.3f} ({seeds_count(t['n_selftaught'])})",
            peer,
            f"{t['gains']} / {t['losses']} of {t['n_selftaught']}",
            t["verdict"],
        ])  # fmt: skip
    wanted = round_targets(frozen)
    seeds_wanted = (
        "a seed's" if wanted["min_gain_seeds"] == 1 else f"{wanted['min_gain_seeds']} seeds'"
    )
    ahead = "; no peer ahead beyond chance" if wanted["no_peer_ahead_beyond_chance"] else ""
    header = ["task", "runs finished", "selftaught mean Δ", "best peer's mean Δ",
              "seeds: gain / loss beyond chance",
              f"targets (≥ every peer{ahead}; {seeds_wanted} gain beyond chance; "
              "no loss beyond it)"]  # fmt: skip
    return markdown_table(header, body)


def versus_cell(c: dict[str, Any]) -> str:
    return f"{c['delta']:+.3f} ({c['wins']}/{c['losses']}, p {fmt_p(c['p_two_sided'])})"


def saved_report_tables(out_dir: Path = RESULTS, round_: int = 1) -> str:
    paths = sorted(out_dir.glob(report_file(round_, "*")))
    sections = ["Status, per task the settings file plans:", "",
                report_status_table(out_dir, round_), ""]  # fmt: skip
    if not paths:
        return "\n".join(sections + ["No run yet: `python benchmarks/bench_peers.py --report "
                                      f"--round {round_}` (see above)."])  # fmt: skip
    saved_files = [json.loads(path.read_text()) for path in paths]
    for saved in saved_files:
        sections += [f"`{saved['task']}`:", "", report_task_table(saved), ""]
    sections.append(many_comparisons_line([saved["runs"] for saved in saved_files]))
    return "\n".join(sections).strip()


def round_comparisons(runs_per_task: Sequence[Sequence[dict[str, Any]]]) -> list[float]:
    """The two-sided p of every comparison the targets read, over a round's tasks: each of
    selftaught's seeds against the seed prompt, and every peer against selftaught pooled on
    the same items (first runs only)."""
    ps = []
    for rows in runs_per_task:
        first = first_runs(rows)
        ps += [p_two_sided(r["test"]["paired"]) for (v, _), r in first.items() if v == "selftaught"]
        if any(v == "selftaught" for v, _ in first):
            peers = sorted({v for v, _ in first} - {"selftaught"})
            ps += [pooled(rows, "selftaught", v)["p_two_sided"] for v in peers]
    return ps


def holm_passes(ps: Sequence[float], alpha: float = 0.05) -> int:
    """How many of `ps` Holm's step-down procedure rejects at family-wise `alpha`."""
    passed = 0
    for rank, p in enumerate(sorted(ps)):
        if p > alpha / (len(ps) - rank):
            break
        passed += 1
    return passed


def many_comparisons_line(runs_per_task: Sequence[Sequence[dict[str, Any]]]) -> str:
    """What the round's many tests mean together: the per-comparison α the tables and the
    targets use, how many would pass by chance alone, and how many survive Holm."""
    ps = round_comparisons(runs_per_task)
    raw = sum(p < 0.05 for p in ps)
    return (
        f"Many comparisons: the targets read {len(ps)} two-sided tests over these tasks "
        f"(selftaught's seeds against the seed prompt; every peer against selftaught, pooled), "
        f"each at a per-comparison α = 0.05: {raw} pass, and {0.05 * len(ps):.1f} would pass by "
        f"chance alone if no system differed from another; {holm_passes(ps)} pass Holm's "
        "correction at a family-wise α = 0.05 (the targets stay read per comparison, as the "
        "issue states them)."
    )


# ---- main -------------------------------------------------------------------------------


def check_peers_installed(s: Settings) -> None:
    peers = set(s.systems) - {"selftaught"}
    if peers and not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing; run: bash benchmarks/peers/setup.sh")
    modules = {p.split("-")[0] for p in peers}  # gepa, skillrl, dspy
    if modules and subprocess.call([str(PEERS_PYTHON), "-c", f"import {', '.join(modules)}"],
                                   stderr=subprocess.DEVNULL) != 0:  # fmt: skip
        raise SystemExit(
            f"the peers' venv lacks one of {', '.join(sorted(modules))}; "
            "run: bash benchmarks/peers/setup.sh"
        )


# settings two runs must share to sit in one results file (seeds, systems and tasks may differ)
COMPARABLE = ("train", "val", "test", "budget", "batch_size", "minibatch_size", "max_tokens",
              "analyst_max_tokens", "seed_prompt", "serve_model", "endpoint")  # fmt: skip


def merged_runs(path: Path, settings: dict, meta: dict, rows: list[dict]) -> list[dict]:
    """A dev run's rows plus the saved runs of other (system, seed) pairs measured with the
    same settings, each row keeping the meta (date, load, command) of the run that made it;
    so a benchmark spread over sittings (one seed or system at a time) loses nothing."""
    fresh = [{**r, "meta": r.get("meta") or meta} for r in rows]
    if not path.exists():
        return fresh
    saved = json.loads(path.read_text())
    if any(saved["settings"].get(k) != settings.get(k) for k in COMPARABLE):
        backup = path.with_suffix(f".{time.strftime('%Y%m%d-%H%M%S')}.json")
        shutil.copy2(path, backup)  # other settings: kept aside, never mixed in
        return fresh
    new = {(r["system"], r.get("variant"), r["seed"]) for r in rows}
    kept = [
        {**r, "meta": r.get("meta") or saved["meta"]}
        for r in saved["runs"]
        if (r["system"], r.get("variant"), r["seed"]) not in new
    ]
    return kept + fresh


def appended_runs(path: Path, rows: list[dict]) -> list[dict]:
    """A report run's rows after every saved row: nothing is replaced (a row of this
    invocation, saved after each run, is updated in place by its `run_id`)."""
    saved = json.loads(path.read_text())["runs"] if path.exists() else []
    mine = {r["run_id"] for r in rows}
    return [r for r in saved if r.get("run_id") not in mine] + rows


def results_dir(s: Settings) -> Path:
    """Where results are saved and read back: `--quick` runs never touch benchmarks/results."""
    return RUNS / "quick" if s.quick else RESULTS


def write_results(s: Settings, meta: dict, by_task: dict[str, list[dict]]) -> list[Path]:
    from selftaught.runs import atomic_write_json, atomic_write_text

    out_dir = results_dir(s)
    settings = asdict(s)
    paths = []
    if s.mode == "report":
        for spec, rows in by_task.items():
            path = out_dir / report_file(s.report_round, spec)
            data = {"task": spec, "settings": settings, "settings_commit": meta["settings_commit"],
                    "runs": appended_runs(path, rows)}  # fmt: skip
            atomic_write_json(path, data)
            paths.append(path)
        return paths
    if s.mode == "gate":
        rows = [r for task_rows in by_task.values() for r in task_rows]
        path = out_dir / "gate_sweep.json"
        data = {"meta": meta, "settings": settings, "summary": gate_summary(rows), "runs": rows}
        atomic_write_json(path, data)
        paths = [path]
    else:
        for spec, rows in by_task.items():
            path = out_dir / f"peers_{task_slug(spec)}.json"
            runs = merged_runs(path, settings, meta, rows)
            atomic_write_json(path, {"meta": meta, "settings": settings, "runs": runs})
            paths.append(path)
    markdown = report(settings, meta, by_task) if s.mode == "gate" else saved_peers_report(out_dir)
    md_path = out_dir / ("gate_sweep.md" if s.mode == "gate" else "peers.md")
    atomic_write_text(md_path, markdown + "\n")
    return [*paths, md_path]


def stamp(s: Settings, meta: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A row as saved: its date and load, the code it ran on and, in a report run, an id that
    makes a re-run a new row."""
    code = meta.get("code") or code_state()  # the code the invocation started with
    row = {**row, "meta": {**meta, "date": machine_info()["date"]}, "code": code}
    if s.mode == "report":
        row["run_id"] = f"{row['variant']}/s{row['seed']}/{row['meta']['date']}"
    return row


def main(argv: Sequence[str] | None = None) -> None:
    s = parse_args(argv)
    check_peers_installed(s)
    meta = {**machine_info(), "command": command_line(), "code": code_state()}
    if s.mode == "report":
        meta["settings_commit"] = settings_commit(round_path(s.report_round))  # committed only
        check_round_commit(round_settings(s.report_round))  # on the round's tagged commit
    tasks = []
    for spec in s.tasks:  # before the endpoint starts: a skipped task loads no model
        if why := unchecked_judge(s, spec):
            print(why, flush=True)
        else:
            tasks.append(spec)
    if not tasks:
        return
    t0 = time.perf_counter()
    by_task: dict[str, list[dict[str, Any]]] = {}
    with endpoint(s) as upstream:
        base, name = split_spec(upstream)
        meta["endpoint"] = s.endpoint or f"selftaught serve --model {s.serve_model}"
        counter = CallCounter()
        with counting_proxy(base, counter) as proxy:
            bench = Bench(s, proxy, name, counter)

            def save_so_far(spec: str, rows: list[dict[str, Any]]) -> None:
                # an interrupted benchmark keeps every finished run (rewritten after each)
                rows[-1] = stamp(s, meta, rows[-1]) if "code" not in rows[-1] else rows[-1]
                by_task[spec] = rows
                meta["wall_s"] = round(time.perf_counter() - t0, 1)
                write_results(s, meta, by_task)

            for spec in tasks:
                by_task[spec] = run_task(
                    bench, spec, lambda rows, spec=spec: save_so_far(spec, rows)
                )
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    for path in write_results(s, meta, by_task):
        print(f"wrote {path}")
    print("tables: python benchmarks/tables.py")
    if s.mode != "report":
        print(report(asdict(s), meta, by_task))


if __name__ == "__main__":
    main()
