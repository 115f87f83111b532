"""`selftaught optimize`: against an OpenAI-compatible endpoint (scripted, fast) and, marked
slow, end to end on the embedded local model."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from tests.fault_server import FaultServer
from tests.scripted import (
    POISON,
    canned_analyst,
    prompt_kind,
    rule_answer,
    schedule_of_rules,
)

ROOT = Path(__file__).resolve().parents[1]
TOY = f"{ROOT / 'tests' / 'scripted.py'}:ToyTask"


def endpoint_answer():
    analyst = canned_analyst(failure=schedule_of_rules("rule delta", "rule alpha", POISON))

    def answer(messages):
        if prompt_kind(messages) != "other":
            return analyst.fn(messages)
        return rule_answer(messages)

    return answer


def test_optimize_against_an_openai_compatible_endpoint(tmp_path):
    with FaultServer(endpoint_answer(), models=("toy-model",)) as server:
        server.faults.extend(["503", "429"])  # transient: retried by the backend, not scored
        spec = f"{server.base_url}#toy-model"
        args = [
            "optimize",
            "--task",
            TOY,
            "--model",
            spec,
            "--optimizer-model",
            spec,
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--output",
            str(tmp_path / "run"),
            "--api-key",
            "k",
            "--concurrency",
            "2",
            "--max-tokens",
            "32",
        ]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert server.requests[0]["max_tokens"] in (32, 768)
        assert any(r["max_tokens"] == 768 for r in server.requests)  # the analyst's cap
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert [r["gate"]["decision"] for r in rows[1:]][:3] == ["accept", "accept_new_best", "reject"]
    assert "best skill (v0002)" in result.output and "test accuracy" in result.output
    assert (run / "best_skill.md").read_text() == "rule delta\nrule alpha\n"
    summary = json.loads((run / "summary.json").read_text())
    # every call counted, none lost (the final test evaluation apart, outside any budget)
    test_calls = summary["test_usage"]["target"]["calls"]
    assert summary["llm_calls"] + test_calls == len(server.requests) - 2

    # the same command (the server restarted on another port) resumes the finished run:
    # no new step, no new call; changed settings refuse to resume, naming what changed
    with FaultServer(endpoint_answer(), models=("toy-model",)) as server2:
        spec2 = f"{server2.base_url}#toy-model"
        args2 = [spec2 if a == spec else a for a in args]
        again = CliRunner().invoke(app, args2)
        assert again.exit_code == 0, again.output
        assert server2.requests == []
        changed = CliRunner().invoke(app, [*args2, "--minibatch-size", "2"])
    assert (run / "history.jsonl").read_text().count("\n") == len(rows)
    assert changed.exit_code == 2 and "minibatch_size" in changed.output


def test_optimize_fatal_backend_error_names_the_cause(tmp_path):
    with FaultServer(endpoint_answer(), models=("toy-model",), require_key="right") as server:
        spec = f"{server.base_url}#toy-model"
        result = CliRunner().invoke(
            app,
            [
                "optimize",
                "--task",
                TOY,
                "--model",
                spec,
                "--output",
                str(tmp_path),
                "--api-key",
                "wrong",
                "--batch-size",
                "4",
            ],
        )
    assert result.exit_code == 1  # the backend failed (selftaught.errors)
    assert "401" in result.output or "API key" in result.output
    assert "resumable" in result.output
    assert json.loads((tmp_path / "error.json").read_text())["stage"] == "baseline"


def test_optimize_rejects_bad_settings():
    result = CliRunner().invoke(
        app, ["optimize", "--task", TOY, "--gate-confidence", "1.5", "--output", "/tmp/x"]
    )
    assert result.exit_code != 0 and "confidence" in result.output


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_optimize_end_to_end_on_the_local_model(tmp_path):
    """The issue's command on the embedded model, with small splits so it fits a test run."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-c",
        "from selftaught.cli import app; app()",
        "optimize",
        "--task",
        "gym:basic_arithmetic",
        "--model",
        "local",
        "--optimizer-model",
        "local",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--train-size",
        "8",
        "--val-size",
        "4",
        "--test-size",
        "4",
        "--max-tokens",
        "24",
        "--analyst-max-tokens",
        "96",
        "--no-successes",
        "--output",
        str(out),
    ]
    t0 = time.time()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1700
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in (
        "config.json",
        "state.json",
        "history.jsonl",
        "best_skill.md",
        "summary.json",
        "test_results.json",
        "skills/v0000.md",
        "diagnostics/step_0001.json",
    ):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["usage"]["target"]["calls"] >= 4 + 8
    assert summary["test_usage"]["target"]["calls"] >= 4  # the final test, outside budgets
    assert summary["usage"]["optimizer"]["calls"] >= 1
    diag = json.loads((out / "diagnostics" / "step_0001.json").read_text())
    assert diag["analyst_calls"] and diag["analyst_calls"][0]["raw_reply"]
    print(f"local e2e: {time.time() - t0:.0f} s", summary["analyst"], summary["test"]["best"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_demo_search_end_to_end_on_the_local_model(tmp_path):
    """`--proposals 0` on the embedded model: the model's own passing train replies become
    demo candidates, demo sets are screened and gated on val; nothing held out is a demo."""
    from selftaught.demos import split_skill
    from selftaught.duplicates import item_key, same_item
    from selftaught.tasks.registry import load_task

    spec = "gym:basic_arithmetic?max_terms=2&max_digits=1"
    sizes = {"train_size": 16, "val_size": 12, "test_size": 12}
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["optimize", "--task", spec, "--model", "local", "--proposals", "0", "--epochs", "1"]
        + ["--batch-size", "16", "--screen-size", "6", "--max-tokens", "48", "--output", str(out)]
        + [f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["usage"].get("optimizer", {}).get("calls", 0) == 0  # no analyst asked
    pool = json.loads((out / "demo_pool.json").read_text())
    task = load_task(spec, **sizes)
    train = {e.id: e.prompt_text() for e in task.examples("train")}
    held = [e.prompt_text() for s in ("val", "test") for e in task.examples(s)]
    boot = [d for d in pool["demos"] if d["source"] == "bootstrap"]
    assert boot, "the 135M model solves some 1-digit sums: their replies are candidates"
    for d in pool["demos"]:
        assert d["id"] in train and not any(
            same_item(item_key(d["input"]), item_key(h)) for h in held
        )
    row = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()][1]
    assert row["candidates"] and {c["kind"] for c in row["candidates"]} == {"demos"}
    shipped = split_skill((out / "best_skill.md").read_text())
    assert [d.id for d in shipped.demos] == [d["id"] for d in summary["best_demos"]]
    assert summary["test"]["initial"]["n"] == 12
