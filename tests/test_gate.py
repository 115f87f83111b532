"""The gate (pure): known decisions from per-example val scores."""

import math

import pytest

from selftaught.gate import GateConfig, gate, metric_value
from selftaught.tasks.base import Score


def scores(*vals):
    return {f"v{i}": v for i, v in enumerate(vals)}


BASE = scores(1, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def test_one_item_gain_is_not_a_new_best_by_default():
    cand = scores(1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    r = gate(cand, BASE, BASE, GateConfig())
    assert r.decision == "accept" and r.gain_vs_best == 1
    assert gate(cand, BASE, BASE, GateConfig(margin=0)).decision == "accept_new_best"


def test_two_item_gain_is_a_new_best_and_a_loss_is_rejected():
    cand = scores(1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
    assert gate(cand, BASE, BASE, GateConfig()).decision == "accept_new_best"
    worse = scores(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    r = gate(worse, BASE, BASE, GateConfig())
    assert r.decision == "reject" and r.gain_vs_current == -1


def test_ties_follow_accept_ties():
    assert gate(BASE, BASE, BASE, GateConfig()).decision == "accept"
    assert gate(BASE, BASE, BASE, GateConfig(accept_ties=False)).decision == "reject"


def test_best_is_compared_separately_from_current():
    current = scores(1, 1, 0, 0, 0, 0, 0, 0, 0, 0)  # an accepted, unproven +1
    cand = scores(1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
    r = gate(cand, current, BASE, GateConfig())
    assert r.decision == "accept_new_best" and r.gain_vs_best == 2 and r.gain_vs_current == 1


def test_paired_test_blocks_a_gain_that_is_not_significant():
    cand = scores(1, 1, 1, 1, 0, 0, 0, 0, 0, 0)  # +3 wins, 0 losses: sign test p = 0.125
    r = gate(cand, BASE, BASE, GateConfig(confidence=0.9))
    assert r.decision == "accept" and r.pvalue == pytest.approx(0.125)
    big = scores(1, 1, 1, 1, 1, 1, 0, 0, 0, 0)  # +5 wins: p = 0.03125
    r = gate(big, BASE, BASE, GateConfig(confidence=0.95))
    assert r.decision == "accept_new_best" and r.pvalue == pytest.approx(0.03125)


def test_discordant_pairs_matter_not_only_the_sum():
    base = scores(1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
    cand = scores(0, 0, 0, 1, 1, 1, 1, 1, 1, 0)  # +3 net, but 6 wins and 3 losses
    r = gate(cand, base, base, GateConfig(margin=0, confidence=0.9))
    assert r.decision == "accept" and r.pvalue > 0.1


def test_backend_errors_make_the_candidate_not_evaluable():
    cand = {**scores(1, 1, 1, 1, 1, 0, 0, 0, 0, 0), "v8": None, "v9": None}
    r = gate(cand, BASE, BASE, GateConfig())
    assert r.decision == "reject" and "backend errors" in r.reason and r.n_missing == 2
    one_missing = {**scores(1, 1, 1, 1, 1, 0, 0, 0, 0, 0), "v9": None}
    r = gate(one_missing, BASE, BASE, GateConfig())
    assert r.decision == "accept_new_best" and r.n_paired == 9


def test_metrics_and_config_validation():
    s = Score(0.0, 0.5)
    assert metric_value(s, "hard") == 0 and metric_value(s, "soft") == 0.5
    assert metric_value(s, "mixed", 0.5) == 0.25
    soft_base = scores(0.2, 0.2)
    r = gate(scores(0.9, 0.9), soft_base, soft_base, GateConfig(metric="soft", margin=1.0))
    assert r.decision == "accept_new_best" and r.gain_vs_best == pytest.approx(1.4)
    for bad in ({"metric": "f1"}, {"margin": -1}, {"confidence": 1.0}, {"mixed_weight": 2}):
        with pytest.raises(ValueError):
            GateConfig(**bad)


def test_gate_off_accepts_every_candidate_and_says_so():
    worse = scores(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    off = GateConfig(accept_all=True)
    r = gate(worse, BASE, BASE, off)
    assert r.decision == "accept_new_best" and r.gain_vs_best == -1
    assert r.reason.startswith("gate off") and "-1 items" in r.reason
    assert gate(worse, BASE, BASE, GateConfig()).decision == "reject"  # the default still gates
    unscored = {k: None for k in BASE}
    assert gate(unscored, BASE, BASE, off).decision == "accept_new_best"


def test_skill_default_gate_refuses_a_two_item_gain_the_margin_alone_accepts():
    """The gain that shipped a junk skill in the peer benchmark (+2 of 30 val items) is noise
    to the default skill gate's paired test; three clean wins are not."""
    from selftaught.skill.config import SkillOptConfig

    default = SkillOptConfig().gate
    assert default.confidence == 0.8 and default.margin == 1.0
    base = {f"v{i}": 0.0 for i in range(30)}
    two = {**base, "v0": 1.0, "v1": 1.0}
    three = {**two, "v2": 1.0}
    assert gate(two, base, base, GateConfig()).decision == "accept_new_best"
    r = gate(two, base, base, default)
    assert r.decision != "accept_new_best" and r.pvalue == pytest.approx(0.25)
    assert gate(three, base, base, default).decision == "accept_new_best"  # p = 0.125
    # a night's val set is a handful of tasks: sleep keeps the margin gate (and its per-kind
    # veto, docs/sleep-mixed-traffic.md)
    from selftaught.sleep.night.cycle import night_training_defaults

    night = night_training_defaults().gate
    assert (night.metric, night.margin, night.confidence) == ("hard", 1.0, None)


def test_gate_confidence_zero_on_the_command_line_means_no_paired_test():
    from selftaught.cli.common import gate_config

    assert gate_config(None, 1.0, 0.0).confidence is None
    assert gate_config(None, 1.0, 0.8).confidence == 0.8


def _wins(n: int, w: int) -> tuple[dict[str, float], dict[str, float]]:
    """(candidate, base) on n val items where the candidate wins w of them, loses none."""
    base = {f"v{i}": 0.0 for i in range(n)}
    return {k: (1.0 if i < w else 0.0) for i, k in enumerate(base)}, base


@pytest.mark.parametrize(
    "cfg, n, expected",
    [
        (GateConfig(), 10, 2),  # margin 1: two net wins
        (GateConfig(confidence=0.8), 10, 3),  # and p = 2^-w <= 0.2: three
        (GateConfig(confidence=0.95), 10, 5),  # 2^-5 = 0.031
        (GateConfig(margin=0), 10, 1),
        (GateConfig(margin=2.5), 10, 3),
        (GateConfig(confidence=0.95), 4, None),  # five wins needed, four items: never
    ],
)
def test_smallest_accepted_gain_is_what_the_gate_accepts(cfg, n, expected):
    from selftaught.gate import smallest_accepted_gain

    got = smallest_accepted_gain(n, cfg)
    assert got.items == expected and got.n_val == n
    for w in range(n + 1):  # the gate itself agrees, item by item
        cand, base = _wins(n, w)
        accepted = gate(cand, base, base, cfg).decision == "accept_new_best"
        assert accepted == (expected is not None and w >= expected), (w, got)
    if expected is None:
        assert got.share is None and "no gain can pass on 4 val items" in got.why
    else:
        assert got.share == pytest.approx(expected / n)


def test_smallest_accepted_gain_with_the_gate_off_and_bad_input():
    from selftaught.gate import smallest_accepted_gain

    assert smallest_accepted_gain(5, GateConfig(accept_all=True)).items == 0
    with pytest.raises(ValueError, match="n_val"):
        smallest_accepted_gain(-1, GateConfig())


# ---- power said before a run (issue 65) ----------------------------------------------------


@pytest.mark.parametrize(
    "cfg, gain, expected",
    [
        (GateConfig(confidence=0.8), 0.05, 60),  # optimize's default: 3 net wins
        (GateConfig(confidence=0.8), 0.10, 30),
        (GateConfig(), 0.05, 40),  # a night's margin: 2 net wins
        (GateConfig(margin=0), 0.05, 20),  # strict >: 1 win
        (GateConfig(confidence=0.8), 1.0, 3),  # never fewer items than the wins needed
        (GateConfig(confidence=0.8), 0.07, 43),  # 3 / 0.07 = 42.9
    ],
)
def test_val_size_for_a_gain_is_the_first_size_the_gate_can_accept_it_on(cfg, gain, expected):
    from selftaught.gate import smallest_accepted_gain, val_size_for

    n = val_size_for(gain, cfg)
    assert n == expected
    at, below = smallest_accepted_gain(n, cfg), smallest_accepted_gain(n - 1, cfg)
    assert at.items is not None and at.items <= gain * n + 1e-9
    assert below.items is None or below.items > gain * (n - 1)
    cand, base = _wins(n, math.ceil(gain * n - 1e-9))  # that gain, all wins: the gate takes it
    assert gate(cand, base, base, cfg).decision == "accept_new_best"


def test_the_power_line_says_the_smallest_gain_and_the_val_size_a_gain_needs():
    from selftaught.gate import gate_power

    line = gate_power(30, GateConfig(confidence=0.8)).line()
    assert line == (
        "power: on 30 val items the gate can accept a gain of 3 net items (0.10 of val) at the "
        "least; a gain of 0.05 is out of reach: it needs at least 60 val items (more when the "
        "candidate also loses items)"
    )
    power = gate_power(8, GateConfig(min_gain=0.25))
    assert power.target_gain == 0.25 and power.needed_val == 8
    assert "a gain of 0.25 is within reach: it needs at least 8 val items" in power.line()
    tiny = gate_power(2, GateConfig(confidence=0.8), items="val tasks").line()
    assert tiny.startswith("power: on 2 val tasks the gate can accept no gain (needs 3 net wins")
    assert gate_power(5, GateConfig(accept_all=True)).line().startswith("power: the gate is off")


def test_auto_val_size_needs_a_min_gain_and_a_budget_that_can_score_it():
    from selftaught.errors import ConfigError
    from selftaught.gate import auto_val_size

    assert auto_val_size(GateConfig(confidence=0.8, min_gain=0.1)) == 30
    assert auto_val_size(GateConfig(confidence=0.8, min_gain=0.1), budget_calls=60) == 30
    with pytest.raises(ConfigError, match="needs --min-gain"):
        auto_val_size(GateConfig(confidence=0.8))
    with pytest.raises(ConfigError, match=r"--budget-calls 59 cannot .* \(60 calls\)"):
        auto_val_size(GateConfig(confidence=0.8, min_gain=0.1), budget_calls=59)
    with pytest.raises(ConfigError, match="gate on"):
        auto_val_size(GateConfig(accept_all=True, min_gain=0.1))
    with pytest.raises(ConfigError, match="min_gain"):
        GateConfig(min_gain=0.0)


# ---- cost as an objective (issue 65, row 47) -----------------------------------------------


def test_a_tie_on_score_goes_to_the_cheaper_candidate_only_with_a_cost_objective():
    best = scores(1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    tie = scores(1, 0, 1, 0, 0, 0, 0, 0, 0, 0)  # the same total, other items
    plus_one = scores(1, 1, 1, 0, 0, 0, 0, 0, 0, 0)  # +1: within the margin's noise
    cheap = GateConfig(objective=("score", "tokens"))
    assert gate(tie, best, best, GateConfig(), costs=(100.0, 200.0)).decision == "accept"
    r = gate(tie, best, best, cheap, costs=(100.0, 200.0))
    assert r.decision == "accept_new_best"
    assert r.reason == (
        "ties the best within noise (+0 items, new best needs > 1) and costs 50% less tokens "
        "per item (100 vs 200)"
    )
    assert gate(plus_one, best, best, cheap, costs=(150.0, 200.0)).decision == "accept_new_best"
    # not cheaper enough (a 5% saving at least), or not measured: the score alone decides
    assert gate(tie, best, best, cheap, costs=(195.0, 200.0)).decision == "accept"
    assert gate(tie, best, best, cheap, costs=(None, 200.0)).decision == "accept"
    # a net val loss is never a tie, however cheap: a chain of ties cannot walk the score down
    worse = scores(1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert gate(worse, worse, best, cheap, costs=(1.0, 200.0)).decision == "accept"


def test_the_objective_is_score_or_score_and_one_cost():
    from selftaught.errors import ConfigError

    assert GateConfig(objective=["score", "usd"]).cost == "usd"  # type: ignore[arg-type]
    assert GateConfig().cost is None
    for bad in (("tokens",), ("score", "tokens", "latency"), ("score", "words")):
        with pytest.raises(ConfigError, match="gate objective is score"):
            GateConfig(objective=bad)
