"""Sleep learns from what users did: corrected replies become demonstrations, the adopted
demos reach the deployed agent (injected as the policy renders them, stripped from the log),
retrieval of the most similar demos per request, and the night's three-way demo gate."""

from __future__ import annotations

import json
import re

from selftaught.demos import split_skill
from selftaught.sleep.cycle import run_night
from selftaught.sleep.log import Feedback, Interaction
from selftaught.sleep.mine import MineConfig, mine
from tests.scripted import ScriptedModel, canned_analyst
from tests.test_sleep_cycle import config, fill_log, models

_Q = re.compile(r"What is (\d+) \+ (\d+)\?")


def few_shot(messages: list[dict]) -> str:
    """Right only when the prompt holds a worked example (a prior assistant turn)."""
    a, b = map(int, _Q.search(messages[-1]["content"]).groups())
    shots = any(m["role"] == "assistant" for m in messages[:-1])
    return f"{a + b}" if shots else f"{a + b + 1}"


def test_a_corrected_reply_is_mined_as_a_correction_demo_source():
    fixed = Interaction(
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        reply="5",
        feedback=Feedback(reference="4"),
    )
    logged = Interaction(
        messages=[{"role": "user", "content": "What is 3 + 3?"}], reply="6", reference="6"
    )
    (a, b), _ = mine([fixed, logged], MineConfig())
    assert a.state["demo_source"] == "correction"
    assert "demo_source" not in b.state  # a logged reference is not the user's correction


def test_a_night_turns_corrected_train_replies_into_demonstrations(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)  # each reply corrected by the user (feedback reference)
    (night,) = run_night(config(tmp_path), models=models(ScriptedModel(few_shot), canned_analyst()))
    assert night.status == "staged", night.report["reason"]
    parts = split_skill((night.night_dir / "proposal" / "skill.md").read_text())
    assert parts.demos and {d.source for d in parts.demos} == {"correction"}
    train = {
        r["id"]
        for r in map(json.loads, (night.night_dir / "tasks.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }
    assert {d.id for d in parts.demos} <= train  # only train tasks feed demos
    assert night.report["proposal"]["val_after"]["hard"] == 1.0
