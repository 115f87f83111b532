"""The gate's per-tag no-regression veto: pure function, then one run end to end."""

import json

import pytest

from selftaught.errors import ConfigError
from selftaught.gate import GateConfig, example_tags, gate, gate_tags, tag_regressions
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.tasks.base import Example
from tests.scripted import (
    _NEEDS,
    ScriptedModel,
    ToyTask,
    canned_analyst,
    schedule_of_rules,
    system_of,
    user_of,
)


def _scores(pattern: str, prefix: str) -> dict[str, float]:
    return {f"{prefix}{i}": float(c) for i, c in enumerate(pattern)}


# 8 items of family "a", 4 of family "b"
TAGS = {f"a{i}": ["a"] for i in range(8)} | {f"b{i}": ["b"] for i in range(4)}
BASE = _scores("00000000", "a") | _scores("1111", "b")
# +8 on a, -4 on b: the total rises by 4, family b collapses
CAND = _scores("11111111", "a") | _scores("0000", "b")


def test_a_tag_that_collapses_vetoes_a_total_gain_and_is_named():
    plain = gate(CAND, BASE, BASE, GateConfig(), tags=TAGS)
    assert plain.decision == "accept_new_best" and plain.gain_vs_best == 4  # no veto asked
    r = gate(CAND, BASE, BASE, GateConfig(tag_alpha=0.1), tags=TAGS)
    assert r.decision == "reject"
    assert "per-tag veto" in r.reason and "tag 'b' lost 4 of 4 items" in r.reason
    assert [t["tag"] for t in r.tag_losses] == ["b"] and r.tag_losses[0]["p_loss"] == 0.0625
    assert "beats best by +4" in r.reason  # the total's verdict is kept in the reason


def test_a_tag_loss_within_its_noise_is_not_vetoed():
    # b loses 2 of 4 (one-sided p = 0.25): noise at alpha 0.1, beyond a margin of 1
    cand = _scores("11111111", "a") | _scores("0011", "b")
    assert gate(cand, BASE, BASE, GateConfig(tag_alpha=0.1), tags=TAGS).decision == (
        "accept_new_best"
    )
    by_margin = gate(cand, BASE, BASE, GateConfig(tag_margin=1), tags=TAGS)
    assert by_margin.decision == "reject" and "tag 'b' lost 2 of 4" in by_margin.reason
    assert gate(cand, BASE, BASE, GateConfig(tag_margin=2), tags=TAGS).decision == (
        "accept_new_best"
    )


def test_tag_regressions_is_pure_and_compares_with_the_skill_replaced():
    losses = tag_regressions(CAND, BASE, TAGS, GateConfig(tag_alpha=0.1))
    assert [(t.tag, t.n_items, t.wins, t.losses, t.net) for t in losses] == [("b", 4, 0, 4, -4)]
    assert tag_regressions(BASE, BASE, TAGS, GateConfig(tag_alpha=0.5)) == []
    # an accepted-as-current candidate is checked against the current skill, not the best
    current = _scores("00000000", "a") | _scores("0000", "b")
    best = _scores("11111111", "a") | _scores("1111", "b")
    cand = _scores("00000000", "a") | _scores("0000", "b")
    r = gate(cand, current, best, GateConfig(tag_alpha=0.1), tags=TAGS)
    assert r.decision == "accept" and r.tag_losses == []
    # an item with several tags counts in each; unscored items are left out
    multi = {"a0": ["a", "x"], "a1": ["x"]}
    found = tag_regressions({"a0": 0.0, "a1": None}, {"a0": 1.0, "a1": 1.0}, multi,
                            GateConfig(tag_margin=0))  # fmt: skip
    assert [(t.tag, t.n_items) for t in found] == [("a", 1), ("x", 1)]


def test_tags_come_from_the_example_state_and_a_veto_without_tags_is_refused():
    exs = [Example("1", "q", state={"tags": ["x", "y"]}), Example("2", "q", state={"tags": "z"}),
           Example("3", "q")]  # fmt: skip
    assert example_tags(exs) == {"1": ("x", "y"), "2": ("z",)}
    assert gate_tags([Example("3", "q")], GateConfig()) == {}
    with pytest.raises(ConfigError, match="per-tag veto"):
        gate_tags([Example("3", "q")], GateConfig(tag_margin=0))
    with pytest.raises(ConfigError, match="tag_alpha"):
        GateConfig(tag_alpha=1.5)


class TaggedToyTask(ToyTask):
    """ToyTask whose examples carry their rule as a tag."""

    def __init__(self, **sizes):
        super().__init__(**sizes)
        for exs in self.splits.values():
            for ex in exs:
                ex.state["tags"] = [ex.state["rule"]]


def _alpha_breaks_beta(messages):
    """Right iff the skill names the question's rule, except that 'rule alpha' breaks beta."""
    m = _NEEDS.search(user_of(messages))
    rule, a, b = m.group(1), int(m.group(2)), int(m.group(3))
    system = system_of(messages)
    right = f"rule {rule}" in system and not (rule == "beta" and "rule alpha" in system)
    return f"Answer: {a + b if right else a + b + 1}"


@pytest.mark.parametrize("veto", [False, True])
def test_a_run_refuses_a_candidate_whose_total_rises_while_a_tag_collapses(tmp_path, veto):
    gate_cfg = GateConfig(tag_alpha=0.2) if veto else GateConfig()
    config = SkillOptConfig(epochs=1, batch_size=4, concurrency=4, gate=gate_cfg, demos_max=0,
                            pool=False)  # fmt: skip
    task = TaggedToyTask(val={"alpha": 5, "beta": 3}, test={"alpha": 2, "beta": 2})
    trainer = SkillTrainer(
        config,
        task,
        ScriptedModel(_alpha_breaks_beta, "target"),
        canned_analyst(failure=schedule_of_rules("rule alpha")),
        "# Skill\nrule beta\n",
        output_dir=tmp_path,
        progress=False,
    )
    summary = trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    verdict = rows[1]["gate"]
    assert verdict["gain_vs_best"] == 2  # alpha 0 -> 5, beta 3 -> 0: the total rises
    if veto:
        assert verdict["decision"] == "reject" and "tag 'beta' lost 3 of 3" in verdict["reason"]
        assert "rule alpha" not in summary.best_skill
    else:
        assert verdict["decision"] == "accept_new_best"
        assert "rule alpha" in summary.best_skill


def test_the_veto_is_a_flag_of_optimize_train_and_sleep_run(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from selftaught.cli import app

    monkeypatch.chdir(tmp_path)
    lines = [{"input": f"What is {i} + 1?", "reference": str(i + 1)} for i in range(30)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["optimize", "--task", "jsonl:t.jsonl", "--model", "cmd:echo 4", "--proposals", "0",
         "--epochs", "1", "--gate-tag-margin", "0", "--output", "run"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "needs tagged val examples" in " ".join(result.output.split())
    for command in (["train", "--method", "rest"], ["sleep", "run"]):
        text = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        assert "--gate-tag-alpha" in text and "--gate-tag-margin" in text
