"""The report shows whole episodes where rows carry trajectories: each tool call with its
arguments and result, then the final answer, every model-written or tool-written text
escaped (optimize's failed examples, ReST's unsolved sampled episodes)."""

from __future__ import annotations

import json
import shutil

import pytest

from selftaught.gate import GateConfig
from selftaught.models.base import Completion, Message
from selftaught.policy import Policy
from selftaught.report import render_report
from selftaught.report.readers import SkillRun, load_run
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.tasks.base import Example
from tests.scripted import ScriptedModel, calls_tools, canned_analyst, tool_call, tool_results
from tests.test_episodes import LookupTask

EVIL_KEY = '<script>alert("key")</script>'
EVIL_ANSWER = "<img src=x onerror=alert(1)>"


class SplitLookup(LookupTask):
    name = "lookup-splits"

    def examples(self, split: str) -> list[Example]:
        return [Example(f"{split}-{i}", f"look up x ({split} {i})", "value-x") for i in range(3)]


def evil_agent(messages: list[Message]) -> str | Completion:
    """Looks up a key that is HTML, then answers with HTML: never solved."""
    if tool_results(messages):
        return EVIL_ANSWER
    return calls_tools(tool_call("lookup", {"key": EVIL_KEY}))


def test_optimize_failures_show_escaped_trajectories(tmp_path) -> None:
    config = SkillOptConfig(
        epochs=1, batch_size=3, concurrency=2, gate=GateConfig(), demos_max=0, pool=False
    )
    SkillTrainer(
        config,
        SplitLookup(),
        ScriptedModel(evil_agent),
        canned_analyst(),
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    run = load_run(tmp_path)
    assert isinstance(run, SkillRun) and run.failures
    f = run.failures[0]
    assert f.trajectory[0].startswith('call lookup({"key": "<script>alert(\\"key\\")</script>"})')
    assert f.trajectory[-1] == f"answer: {EVIL_ANSWER}"
    page = render_report(tmp_path)
    assert "<script" not in page and "<img" not in page
    failures = page.split('id="failures"', 1)[1]
    assert '<ol class="traj">' in failures and "trajectory" in failures
    assert "call lookup({&quot;key&quot;: &quot;&lt;script&gt;" in failures
    assert "-&gt; value-&lt;script&gt;" in failures  # the tool's result, escaped
    assert "answer: &lt;img src=x onerror=alert(1)&gt;" in failures


def test_rest_page_shows_the_last_rounds_unsolved_episodes(tmp_path, tmp_path_factory) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from selftaught.weights.sampling import samples_from_rollouts
    from tests.report_fixtures import shared_rest_run

    root = tmp_path / "rest"
    shutil.copytree(shared_rest_run(tmp_path_factory), root)
    assert "Unsolved episodes" not in render_report(root)  # one-step samples: no section
    task = SplitLookup()
    examples = task.examples("train")
    rollouts = run_rollouts(
        ScriptedModel(evil_agent), Policy(), task, examples, RolloutConfig(progress=False)
    )
    samples = samples_from_rollouts(task, examples, rollouts, Policy())
    last = max(int(p.name) for p in (root / "rounds").iterdir())
    (root / "rounds" / str(last) / "samples.jsonl").write_text(
        "".join(json.dumps(s.to_dict()) + "\n" for s in samples)
    )
    page = render_report(root)
    assert "<script" not in page and "<img" not in page
    section = page.split('id="failures"', 1)[1].split("</section>", 1)[0]
    assert f"samples · round {last} — 3 failed" in section
    assert section.count('<ol class="traj">') == 3
    assert "call lookup({&quot;key&quot;: &quot;&lt;script&gt;" in section
    assert "answer: &lt;img src=x onerror=alert(1)&gt;" in section
