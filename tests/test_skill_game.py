"""The trainer on a game task (JSON strategies): no special code, the analyst sees the
simulator's feedback and the skill steers the strategy."""

import json
import re

import pytest

from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from tests.scripted import ScriptedModel, append, canned_analyst, edits_json, system_of

ctf = pytest.importorskip("selftaught.tasks.games.ctf")


def strategist(messages):
    """Plays the strategy the skill spells out; an invalid one when the skill says nothing."""
    m = re.search(r"aggression (\d\.\d+), defense (\d\.\d+)", system_of(messages))
    if m is None:
        return "I will attack!"
    strategy = {
        "aggression": float(m.group(1)),
        "defense": float(m.group(2)),
        "path_bias": "center",
        "retreat_threshold": 0.3,
        "formation": "wedge",
    }
    return json.dumps(strategy)


def test_game_task_runs_and_the_analyst_sees_the_feedback(tmp_path):
    task = ctf.GridCTFTask(train_size=4, val_size=6, test_size=4)
    analyst = canned_analyst(
        failure=edits_json(append("Play aggression 0.2, defense 0.2 unless told otherwise."))
    )
    result = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4, gate=GateConfig(margin=0.0, metric="soft")),
        task,
        ScriptedModel(strategist, "strategist"),
        analyst,
        "# Strategy skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    failure_prompt = next(m[0]["content"] for m in analyst.calls if "## Failed" in m[0]["content"])
    assert "no JSON strategy" in failure_prompt  # the scorer's own words reach the analyst
    row = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[1])
    assert row["edits"]["applied"] == 1
    # any valid strategy earns partial credit, so the soft gate must see a real gain
    assert row["gate"]["decision"] == "accept_new_best" and row["val"]["soft"] > 0
    assert result.test.best.soft > result.test.initial.soft == 0
