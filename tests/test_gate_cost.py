"""Cost as an objective (issue 65, row 47): each candidate's tokens, seconds and price per val
item are measured beside its score; with `objective=("score", "tokens")` a candidate the val
cannot tell from the best that costs less ships; summary.json, the history, the command's
output and the HTML report show score against cost for every skill."""

from __future__ import annotations

import json

from selftaught.evaluation import ScoreCache, item_costs, mean_cost
from selftaught.gate import GateConfig
from selftaught.rollout import Rollout
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.result import cost_front
from selftaught.tasks.base import Score
from tests.scripted import ToyTask, canned_analyst, edits_json, rule_target

FILLER = "Background. " + "This paragraph changes no answer at all. " * 8
START = f"rule alpha\n\n{FILLER}\n"
DROP = edits_json({"op": "delete", "target": FILLER.strip(), "rationale": "scripted"})


def _run(tmp_path, gate: GateConfig):
    config = SkillOptConfig(
        epochs=1, batch_size=8, max_steps=1, proposals=1, demos_max=0, gate=gate
    )
    trainer = SkillTrainer(
        config,
        ToyTask(),
        rule_target(),
        optimizer_model=canned_analyst(failure=DROP),
        initial_skill=START,
        output_dir=tmp_path,
        progress=False,
    )
    return trainer.train()


def test_a_cheaper_candidate_the_val_cannot_tell_from_the_best_ships_with_a_cost_objective(
    tmp_path,
):
    plain = _run(tmp_path / "score", GateConfig(confidence=0.8))
    assert plain.best_version == "v0000" and plain.decisions == {"accept": 1}
    cheap = _run(tmp_path / "tokens", GateConfig(confidence=0.8, objective=("score", "tokens")))
    assert cheap.best_version == "v0001" and FILLER.strip() not in cheap.best_skill
    rows = [json.loads(x) for x in (tmp_path / "tokens" / "history.jsonl").read_text().splitlines()]
    reason = rows[-1]["gate"]["reason"]
    assert reason.startswith("ties the best within noise (+0 items") and "less tokens" in reason
    (candidate,) = rows[-1]["candidates"]
    assert candidate["cost"]["prompt_tokens"] > 0 and candidate["cost"]["items"] == 11
    # score against cost: both skills, the cheaper one alone on the front
    front = {p.version: p for p in cheap.front}
    assert set(front) == {"v0000", "v0001"}
    assert front["v0001"].on_front and front["v0001"].shipped and not front["v0000"].on_front
    assert front["v0001"].cost.tokens < front["v0000"].cost.tokens
    saved = json.loads((tmp_path / "tokens" / "summary.json").read_text())["front"]
    assert [p["version"] for p in saved if p["on_front"]] == ["v0001"]


def test_the_command_shows_what_the_shipped_skill_costs_against_the_start(tmp_path):
    from selftaught.cli.optimize import front_lines

    result = _run(tmp_path, GateConfig(confidence=0.8, objective=("score", "tokens")))
    lines = front_lines(result.front)
    assert lines[0].startswith("score against cost per val item")
    assert any(line.startswith("  v0000: val ") and "(start)" in line for line in lines)
    assert any("(shipped) *" in line for line in lines)
    assert lines[-1].startswith("the shipped skill costs ") and "against the start" in lines[-1]
    assert "-" in lines[-1].split("tokens per val item, ")[1]  # it shrank


def test_the_html_report_shows_score_against_cost(tmp_path):
    from selftaught.report import render_report

    _run(tmp_path / "run", GateConfig(confidence=0.8, objective=("score", "tokens")))
    html = render_report(tmp_path / "run")
    assert "Score against cost" in html and 'id="front-table"' in html
    rows = html.split('id="front-table"', 1)[1].split("</table>", 1)[0]
    assert "<td>v0000</td>" in rows and "<td>v0001</td>" in rows and "shipped" in rows


def test_costs_are_measured_per_item_and_kept_beside_the_scores(tmp_path):
    ran = Rollout("a", [], "x", Score(1.0, 1.0), prompt_tokens=100, completion_tokens=10)
    ran.latency_s = 2.0
    cached = Rollout("b", [], "x", Score(1.0, 1.0), prompt_tokens=5, cached=True)
    failed = Rollout("c", [], "", None, error="boom")
    costs = item_costs([ran, cached, failed])
    assert costs == {"a": [100.0, 10.0, 2.0]}  # a cached reply or an error measures nothing
    cost = mean_cost(costs, ["a", "b"], "gpt-4o-mini")
    assert cost is not None and cost.items == 1 and cost.tokens == 110
    assert cost.usd == (100 * 0.15 + 10 * 0.60) / 1e6
    assert mean_cost(costs, ["a"], "some-unpriced-model").usd is None
    assert mean_cost(costs, ["b"], "gpt-4o-mini") is None
    cache = ScoreCache(tmp_path / "val_cache.json")
    cache.add("h", {"a": [1.0, 1.0]}, costs)
    again = ScoreCache.load(tmp_path / "val_cache.json")
    assert (
        again.cost("h", ["a"], "local:x").tokens == 110
        and again.cost("h", ["a"], "local:x").usd == 0.0
    )


def test_the_front_keeps_what_no_skill_beats_on_both_score_and_tokens():
    from selftaught.evaluation import ItemCost

    def c(tokens: float) -> ItemCost:
        return ItemCost(10, tokens, 0.0, 1.0, None)

    front = cost_front(
        [("v0", 0.5, c(100)), ("v1", 0.6, c(300)), ("v2", 0.5, c(200)), ("v3", 0.7, None)], "v1"
    )
    on = {p.version: p.on_front for p in front}
    assert on == {"v0": True, "v1": True, "v2": False, "v3": False}  # v3: cost not measured
    assert [p.version for p in front if p.shipped] == ["v1"]


def test_a_weight_run_refuses_a_cost_objective():
    import pytest

    pytest.importorskip("torch")
    from selftaught.errors import ConfigError
    from selftaught.weights.config import RestConfig
    from selftaught.weights.rest import RestTrainer

    cfg = RestConfig(gate=GateConfig(objective=("score", "tokens")))
    with pytest.raises(ConfigError, match="leave it at score"):
        RestTrainer(cfg, ToyTask(), "local")
