"""A tool episode on the embedded model, through the CLI: `selftaught eval --task
tool:calculator --model local`. The 135M model rarely solves it: this checks the mechanics
(every turn a model call, calls answered by results, the trajectory written), not accuracy."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from selftaught.cli import app

pytestmark = [pytest.mark.local, pytest.mark.slow]


def test_calculator_episodes_on_the_local_model(tmp_path):
    out = tmp_path / "calc.jsonl"
    args = ["eval", "--task", "tool:calculator", "--model", "local", "--limit", "3"]
    result = CliRunner().invoke(app, [*args, "--max-tokens", "24", "--output", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["error"] is None for r in rows)
    for r in rows:
        assert r["stop"] in ("answer", "length", "turn_cap", "token_cap")
        assert 1 <= r["turns"] <= 4  # the task's turn cap
        traj = r["trajectory"]
        assert sum(m["role"] == "assistant" for m in traj) == r["turns"]
        calls = [c for m in traj for c in m.get("tool_calls") or []]
        assert len(calls) == r["tool_calls"]
        assert [m["tool_call_id"] for m in traj if m["role"] == "tool"] == [c["id"] for c in calls]
        assert traj[-1]["role"] == "assistant" and traj[-1]["content"] == r["reply"]
        assert r["score"]["feedback"]  # scored with feedback, whatever it answered
    summary = json.loads((tmp_path / "calc.summary.json").read_text())
    # every turn of every episode was one charged model call
    assert summary["usage"]["target"]["calls"] == sum(r["turns"] for r in rows)
    assert summary["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)
