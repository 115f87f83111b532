"""Per-rollout start cost of each coding-agent CLI: one trivial prompt against the scripted
upstream (`tests/agent_upstream.py`: it answers at once, so the time is the agent's own), run
through selftaught's agent model (fresh workspace, per-run HOME, instruction file, snapshot
and diff, the CLI process) and, for comparison, the bare CLI command alone. The variants
alternate (ABAB...) so that machine load hits each alike.

    python benchmarks/bench_agent_start.py [--repeats 15] [--agents claude-code,codex,cmd]

Claude Code also runs with its Bash sandbox off (`SELFTAUGHT_CLAUDE_SANDBOX=0`), to show what
the sandbox's setup costs. `cmd` is a trivial Python script behind `cmd:` (selftaught's own
cost plus one interpreter start). Prints the median seconds per call with a 95% interval of
the median (order statistics, distribution-free); writes benchmarks/results/agent_start.json.
Needs the pinned CLIs (scripts/install-agent-clis.sh), node, bubblewrap and socat.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the scripted upstream lives in the tests
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import RESULTS, machine_info  # noqa: E402

from selftaught.models import GenerationParams, load_model  # noqa: E402
from selftaught.runs import atomic_write_json  # noqa: E402
from tests.agent_upstream import (  # noqa: E402
    AgentUpstream,
    cli_dir,
    codex_config,
    find_cli,
    needs_skill,
)

KEY = "bench-key-0000"
PROMPT = "Say hi."
TRIVIAL_AGENT = "import sys; sys.stdin.read(); print('SOLVED')\n"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval of the median: order statistics j..k with
    P(j <= rank of the median <= k) >= confidence under Binomial(n, 1/2)."""
    xs = sorted(values)
    n = len(xs)
    if n < 6:
        return xs[0], xs[-1]
    cdf = [sum(math.comb(n, i) for i in range(k + 1)) / 2**n for k in range(n + 1)]
    tail = (1 - confidence) / 2
    j = max(k for k in range(n) if cdf[k] <= tail)  # P(X <= j) <= tail
    return xs[j], xs[n - 1 - j]


def summary(times: list[float]) -> dict[str, float | int]:
    low, high = median_interval(times)
    return {
        "n": len(times),
        "median_s": round(statistics.median(times), 3),
        "ci95_s": [round(low, 3), round(high, 3)],
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


def wrapped(spec: str, **settings: object) -> Callable[[], float]:
    """One call of selftaught's agent model (the CLI found and version-checked once, before);
    `settings` override `AgentSettings` fields."""
    model = load_model(spec)
    if settings:
        model.settings = dataclasses.replace(model.settings, **settings)  # type: ignore[attr-defined]
    model.chat([{"role": "user", "content": PROMPT}], GenerationParams())  # warm: preflight

    def call() -> float:
        t0 = time.perf_counter()
        reply = model.chat([{"role": "user", "content": PROMPT}], GenerationParams())
        assert reply.text.strip() in ("SOLVED", "UNSOLVED"), reply.text
        return time.perf_counter() - t0

    return call


def bare(kind: str, home: Path) -> Callable[[], float]:
    """The CLI's own command, in a workspace made once, with the same environment shape."""
    program = find_cli({"claude-code": "claude", "codex": "codex"}[kind])
    assert program is not None
    workspace = Path(tempfile.mkdtemp(prefix="bench-agent-ws-"))
    if kind == "claude-code":
        argv = [program, "-p", "--output-format", "stream-json", "--verbose"]
        argv += ["--permission-mode", "dontAsk", "--no-session-persistence"]
    else:
        argv = [program, "exec", "--skip-git-repo-check", "--json", "--sandbox"]
        argv += ["workspace-write", "-"]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
    env.update(
        HOME=str(home),
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        CODEX_HOME=os.environ["CODEX_HOME"],
        ANTHROPIC_BASE_URL=os.environ["ANTHROPIC_BASE_URL"],
        ANTHROPIC_API_KEY=KEY,
        X_KEY=KEY,
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )

    def call() -> float:
        t0 = time.perf_counter()
        done = subprocess.run(
            argv, input=PROMPT, text=True, capture_output=True, cwd=workspace, env=env
        )
        assert done.returncode == 0, done.stderr[-500:]
        return time.perf_counter() - t0

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--agents", default="claude-code,codex,cmd")
    args = parser.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    os.environ["SELFTAUGHT_AGENT_CLIS"] = str(cli_dir())
    work = Path(tempfile.mkdtemp(prefix="bench-agent-start-"))
    load_before = os.getloadavg()
    with AgentUpstream(needs_skill("MARKER")) as up:
        os.environ["ANTHROPIC_BASE_URL"] = up.root_url
        os.environ["ANTHROPIC_API_KEY"] = KEY
        codex_config(work / "codex-home", up.base_url, model=up.model, key_env="X_KEY")
        os.environ["CODEX_HOME"] = str(work / "codex-home")
        os.environ["X_KEY"] = KEY
        script = work / "trivial_agent.py"
        script.write_text(TRIVIAL_AGENT)
        variants: dict[str, Callable[[], float]] = {}
        for kind in agents:
            if kind == "cmd":
                spec = f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
                variants["cmd (selftaught)"] = wrapped(spec)
                continue
            variants[f"{kind} (selftaught)"] = wrapped(kind)
            if kind == "claude-code":
                variants[f"{kind} (selftaught, no sandbox)"] = wrapped(kind, claude_sandbox=False)
            home = work / f"home-{kind}"
            home.mkdir()
            variants[f"{kind} (bare CLI)"] = bare(kind, home)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):  # ABAB...: each round runs every variant once
            for name, call in variants.items():
                times[name].append(call())
    load_after = os.getloadavg()
    results = {
        "machine": machine_info(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "repeats": args.repeats,
        "prompt": PROMPT,
        "variants": {
            name: summary(ts) | {"times_s": [round(t, 3) for t in ts]} for name, ts in times.items()
        },
    }
    RESULTS.mkdir(exist_ok=True)
    atomic_write_json(RESULTS / "agent_start.json", results)
    print(f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    for name, s in results["variants"].items():
        low, high = s["ci95_s"]
        print(f"{name:38s} median {s['median_s']:.3f} s  (95% CI {low:.3f}-{high:.3f}, n={s['n']})")
    print(f"wrote {RESULTS / 'agent_start.json'}")


if __name__ == "__main__":
    main()
