"""The benchmark scripts' pure helpers and the counting proxy (benchmarks/ is not a package:
its folder goes on sys.path, as when a script runs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_overhead  # noqa: E402
import bench_peers  # noqa: E402
import bench_quickstart  # noqa: E402
from common import accuracy, compare_paired, fmt_acc, markdown_table  # noqa: E402
from counting_proxy import CallCounter, counting_proxy, normalise_request  # noqa: E402

from tests.fault_server import FaultServer  # noqa: E402


def test_markdown_table_escapes_pipes_and_newlines() -> None:
    table = markdown_table(["a", "b"], [["x|y", "1\n2"]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1 2 |"]


def test_compare_paired_counts_wins_losses_and_skips_errors() -> None:
    base = {f"e{i}": 1.0 for i in range(10)} | {f"f{i}": 0.0 for i in range(10)}
    worse = {f"e{i}": 0.0 for i in range(10)} | {f"f{i}": 0.0 for i in range(10)}
    worse["f0"] = None  # an errored rollout is left out, not counted as wrong
    result = compare_paired(base, worse)
    assert (result["n_paired"], result["wins"], result["losses"]) == (19, 0, 10)
    assert result["p_loss"] == pytest.approx(1 / 1024, abs=1e-6) and result["p_gain"] == 1.0
    assert result["p_two_sided"] == pytest.approx(2 / 1024, abs=1e-6)  # what tables report
    assert result["delta"] == pytest.approx(-10 / 19)
    assert result["regression_beyond_ci"] and not result["gain_beyond_ci"]
    same = compare_paired(base, base)
    assert same["delta"] == 0 and not same["regression_beyond_ci"] and same["p_loss"] == 1.0


def test_accuracy_reports_errors_apart() -> None:
    acc = accuracy({"a": 1.0, "b": 0.0, "c": None, "d": 1.0})
    assert fmt_acc(acc).endswith("(1 errors)")
    assert (acc["solved"], acc["n"], acc["errors"]) == (2, 3, 1)
    assert acc["hard"] == pytest.approx(2 / 3)
    assert 0 < acc["ci95"][0] < acc["hard"] < acc["ci95"][1] < 1


def test_normalise_request_copies_max_completion_tokens_only_when_needed() -> None:
    assert normalise_request({"max_completion_tokens": 9})["max_tokens"] == 9
    assert normalise_request({"max_completion_tokens": 9, "max_tokens": 4})["max_tokens"] == 4
    assert "max_tokens" not in normalise_request({"messages": []})


def test_counting_proxy_counts_per_role_at_the_endpoint() -> None:
    counter = CallCounter()
    with FaultServer() as upstream, counting_proxy(upstream.base_url, counter) as root:
        upstream.faults.extend(["ok", "ok", "ok", "500"])

        def ask(role: str, **extra: int) -> None:
            client = openai.OpenAI(base_url=f"{root}/{role}/v1", api_key="k", max_retries=0)
            messages = [{"role": "user", "content": "hi"}]
            client.chat.completions.create(model="fake-model", messages=messages, **extra)

        ask("target", max_tokens=5)
        ask("target", max_completion_tokens=7)
        ask("optimizer", max_tokens=5)
        with pytest.raises(openai.InternalServerError):
            ask("optimizer", max_tokens=5)
        served = openai.OpenAI(base_url=f"{root}/eval/v1", api_key="k").models.list()
        assert [m.id for m in served.data] == ["fake-model"]
    tally = counter.take()
    target = tally["target"]
    assert (target["sent"], target["calls"], target["errors"]) == (2, 2, 0)
    assert tally["target"]["prompt_tokens"] == 20 and tally["target"]["tokens"] == 24
    assert (tally["optimizer"]["sent"], tally["optimizer"]["calls"]) == (2, 1)
    assert tally["optimizer"]["errors"] == 1
    assert "eval" not in tally  # listing models is not a chat call
    assert upstream.requests[1]["max_tokens"] == 7  # llama.cpp ignores max_completion_tokens
    assert counter.take() == {}


def test_planned_epochs_let_the_budget_end_the_run() -> None:
    # 170 calls after the baseline pay for 12 steps of 15 train rollouts: 6 epochs, plus one
    assert bench_peers.planned_epochs(200, 30, 30, 15) == 7
    assert bench_peers.planned_epochs(20, 6, 6, 4) == 3
    assert bench_peers.planned_epochs(10, 6, 30, 4) == 2  # never fewer than one step


def _row(variant: str, delta: float, *, steps: int = 4, accepted: int = 1, **flags: Any) -> dict:
    paired = {
        "wins": flags.get("wins", 3),
        "losses": flags.get("losses", 1),
        "p_gain": flags.get("p_gain", 0.3),
        "p_loss": flags.get("p_loss", 0.9),
        "delta": delta,
        "gain_beyond_ci": flags.get("gain_ci", False),
        "regression_beyond_ci": flags.get("regression_ci", False),
    }
    acc = {"hard": 0.5, "ci95": [0.3, 0.7], "solved": 5, "n": 10, "errors": 0}
    split = {"seed": acc, "shipped": acc, "paired": paired}
    return {
        "task": "gym:chain_sum",
        "seed": 0,
        "system": "selftaught",
        "variant": variant,
        "version": "0.1.0",
        "steps": steps,
        "accepted": accepted,
        "shipped_is_seed": accepted == 0,
        "val": split,
        "test": split,
        "usage": {
            "target": {"sent": 202, "calls": 200, "tokens": 1000},
            "optimizer": {"sent": 9, "calls": 9, "tokens": 50},
        },
        "wall_s": 12.0,
    }


def test_gate_summary_and_tables() -> None:
    rows = [
        _row("margin1", -0.1, regression_ci=True, p_loss=0.01, wins=0, losses=8),
        _row("margin1", 0.2, gain_ci=True, p_gain=0.02),
        _row("p<=0.2", 0.0, accepted=0),
        {"variant": "p<=0.2", "seed": 1, "system": "selftaught", "error": "exit 1: boom"},
    ]
    summary = {g["gate"]: g for g in bench_peers.gate_summary(rows)}
    m = summary["margin1"]
    assert (m["runs"], m["steps"], m["accepted"], m["accept_rate"]) == (2, 8, 2, 0.25)
    assert (m["regressions_ci"], m["regressions_paired"], m["test_drops"]) == (1, 1, 1)
    # the gain row's 3 wins / 1 loss is p = 0.625 two-sided: not a paired gain, whatever
    # the one-sided p it carries; 0 / 8 is p = 0.008: a paired regression
    assert (m["gains_ci"], m["gains_paired"], m["mean_delta"]) == (1, 0, 0.05)
    p = summary["p<=0.2"]
    assert (p["runs"], p["failed"], p["shipped_changed"], p["accept_rate"]) == (1, 1, 0, 0.0)
    gate_md = bench_peers.gate_table(list(summary.values()))
    assert "| margin1 | 2 | 2 / 8 (25%) | 2 | 1 / 1 / 1 | 1 / 0 | +0.050 |" in gate_md
    assert "1 (+1 failed)" in gate_md
    peers_md = bench_peers.peers_table(rows)
    assert "| selftaught 0.1.0 (margin1) | 0 | test | 0.50 [0.30, 0.70] → 0.50" in peers_md
    assert "| -0.10 | 0/8 | 0.008 | 200 (+2 unanswered) | 9 | 1,050 | 12 | 1 / 4 |" in peers_md
    assert "| selftaught (p<=0.2) | 1 |  | failed: exit 1: boom |" in peers_md
    assert "p (two-sided)" in peers_md.splitlines()[0]


def test_ratio_stats_median_and_spread() -> None:
    stats = bench_overhead.ratio_stats([1.1, 2.0, 3.3], [1.0, 2.0, 3.0])
    assert stats["ratios"] == [1.1, 1.0, 1.1]
    assert (stats["median"], stats["min"], stats["max"]) == (1.1, 1.0, 1.1)
    assert stats["meets_target"] is False
    assert bench_overhead.ratio_stats([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])["meets_target"] is True


def test_peer_results_merge_runs_of_other_seeds_and_keep_their_meta(tmp_path):
    import json

    settings = {"train": 30, "val": 30, "test": 50, "budget": 200, "seeds": [0]}
    path = tmp_path / "peers_t.json"
    old = [{"system": "gepa", "seed": 0}, {"system": "selftaught", "seed": 0}]
    path.write_text(json.dumps({"meta": {"date": "d0"}, "settings": settings, "runs": old}))
    new = [{"system": "selftaught", "seed": 0, "x": 1}, {"system": "selftaught", "seed": 1}]
    runs = bench_peers.merged_runs(path, {**settings, "seeds": [0, 1]}, {"date": "d1"}, new)
    assert [(r["system"], r["seed"], r["meta"]["date"]) for r in runs] == [
        ("gepa", 0, "d0"),
        ("selftaught", 0, "d1"),
        ("selftaught", 1, "d1"),
    ]
    assert runs[1]["x"] == 1  # the rerun replaced the saved row
    other = bench_peers.merged_runs(path, {**settings, "budget": 100}, {"date": "d2"}, new)
    assert len(other) == 2 and len(list(tmp_path.glob("peers_t.*.json"))) == 1  # set aside


def test_the_peer_report_leaves_out_results_set_aside(tmp_path, monkeypatch):
    import json

    runs = [{"system": "selftaught", "seed": 0, "task": "t"}]
    for name, date in (("peers_t.json", "now"), ("peers_t.20261123-000000.json", "old")):
        saved = {"meta": {"date": date}, "settings": {}, "runs": runs}
        (tmp_path / name).write_text(json.dumps(saved))
    monkeypatch.setattr(bench_peers, "report", lambda s, meta, by_task: meta["date"])
    assert bench_peers.saved_peers_report(tmp_path) == "now"


def test_the_quick_start_benchmark_runs_the_readme_command() -> None:
    """bench_quickstart times the main command of the README and of the quick start page: the
    three must not drift apart."""
    root = Path(__file__).resolve().parents[1]
    command = bench_quickstart.COMMAND.format(test=bench_quickstart.TEST_SIZE)
    for page in (root / "README.md", root / "docs" / "quickstart.md"):
        assert command in page.read_text(), page


def test_peer_config_changes_run_as_their_own_labelled_selftaught_variant():
    s = bench_peers.parse_args(["--systems", "selftaught", "gepa", "--config", "pool=false"])
    assert s.selftaught_config == {"pool": False}
    assert bench_peers.variants(s) == [("selftaught", "pool=false"), ("gepa", "gepa")]
    assert bench_peers.variants(bench_peers.parse_args([]))[0] == ("selftaught", "selftaught")
    with pytest.raises(SystemExit, match="demos_max"):  # an unknown key lists the known ones
        bench_peers.parse_args(["--config", "demo_max=3"])
    with pytest.raises(Exception, match="screen_keep"):  # a bad value fails before any run
        bench_peers.parse_args(["--config", "screen_keep=0"])


def test_the_peer_driver_runs_selftaught_and_reads_its_typed_result(tmp_path):
    """The peer benchmark's selftaught system, end to end on a scripted endpoint (the driver
    in this interpreter: selftaught needs no peers' venv)."""
    import json
    import os
    import subprocess

    from selftaught.tasks import load_task

    root = Path(__file__).resolve().parents[1]
    spec = "gym:basic_arithmetic?max_terms=2&max_digits=1"
    task = load_task(spec, seed=0, train_size=4, val_size=4, test_size=2)
    refs = {e.input: str(e.reference) for s in ("train", "val") for e in task.examples(s)}

    def answer(messages: list[dict]) -> str:
        question = [m["content"] for m in messages if m["role"] == "user"][-1].split("\n\n")[0]
        return refs.get(question, "no edits")

    with FaultServer(answer) as up:
        job = {
            "system": "selftaught",
            "task": {"spec": spec, "seed": 0, "train_size": 4, "val_size": 4, "test_size": 2},
            "examples": {
                s: [{"id": e.id, "input": e.input, "reference": str(e.reference)}
                    for e in task.examples(s)]  # fmt: skip
                for s in ("train", "val")
            },
            "seed": 0, "seed_prompt": "You are a helpful assistant.",
            "target_url": up.base_url, "optimizer_url": up.base_url, "model_name": "fake-model",
            "budget_calls": 20, "epochs": 1, "batch_size": 2, "minibatch_size": 2,
            "max_tokens": 16, "analyst_max_tokens": 32, "concurrency": 2, "timeout_s": 30,
            "out_dir": str(tmp_path / "run"),
        }  # fmt: skip
        (tmp_path / "job.json").write_text(json.dumps(job))
        out = subprocess.run(
            [
                sys.executable,
                str(root / "benchmarks/peers/driver.py"),
                str(tmp_path / "job.json"),
                str(tmp_path / "result.json"),
            ],  # fmt: skip
            env={**os.environ, "PYTHONPATH": str(root / "src")},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["system"] == "selftaught" and result["own_val"]["seed"] == 1.0
    assert result["shipped_prompt"].startswith("You are a helpful assistant.")
    assert isinstance(result["decisions"], dict) and "parse_rate" in result["analyst"]
