"""Grid capture-the-flag: rules, constraints, determinism, splits, schema, discrimination."""

from __future__ import annotations

import json
import math
import random
import statistics
from typing import Any

import pytest

from selftaught.tasks.base import Example, GameTask, TaskError, check_disjoint
from selftaught.tasks.games import (
    STRATEGY_SCHEMA,
    GridCTFTask,
    Simulation,
    generate_scenario,
    play,
    random_strategy,
    validate_strategy,
)
from selftaught.tasks.games.ctf_map import LANES, _lane_passable, bfs_distances

STEADY = {
    "aggression": 1.0,
    "defense": 0.0,
    "path_bias": "center",
    "retreat_threshold": 0.0,
    "formation": "column",
}


def tiny_state(**overrides: Any) -> dict[str, Any]:
    """A hand-made 5x7 scenario: a wall row with one gap at column 3 between base and flag."""
    gap = {"entry": [4, 3], "exit": [2, 3]}
    state: dict[str, Any] = {
        "seed": 7,
        "width": 5,
        "height": 7,
        "rows": [".....", ".....", ".....", "###.#", ".....", ".....", "....."],
        "lane_rows": [3, 3],
        "lanes": {"left": [0, 1], "center": [2, 2], "right": [3, 4]},
        "lane_status": {lane: "open" for lane in LANES},
        "waypoints": {lane: dict(gap) for lane in LANES},
        "flag": [1, 1],
        "base": [5, 2],
        "our_units": [[4, 0]],
        "enemy_units": [],
        "vision": 3,
        "turn_limit": 30,
        "route_lengths": {lane: 7 for lane in LANES},
        "opponent": {"style": "turtle", "lane": "center"},
        "constraints": {"min_defense": None, "max_attackers": None, "forbidden_lane": None},
    }
    state.update(overrides)
    return state


def reply(strategy: dict[str, Any]) -> str:
    return "Here is my plan:\n```json\n" + json.dumps(strategy) + "\n```"


def scenario_aware(state: dict[str, Any]) -> dict[str, Any]:
    """A hand-written policy that reads the scenario: shortest lane the enemy does not hold
    (or the raiders' own lane, to meet them), the least defense the constraint allows."""
    rules, style = state["constraints"], state["opponent"]["style"]
    enemy_lane, n = state["opponent"]["lane"], len(state["our_units"])

    def lane_cost(lane: str) -> int:
        cost = state["route_lengths"][lane]
        if style in ("lane_guard", "hunter") and lane == enemy_lane:
            cost += 12
        if style == "raider" and lane != enemy_lane:
            cost += 12
        return cost

    usable = [
        lane
        for lane in LANES
        if lane != rules["forbidden_lane"] and not state["lane_status"][lane].startswith("blocked")
    ]
    defense = rules["min_defense"] or 0.0
    if rules["max_attackers"]:
        defense = max(defense, math.ceil((n - rules["max_attackers"]) / n * 100) / 100)
    return {
        "aggression": 0.3 if style == "lane_guard" else 1.0,
        "defense": round(defense, 2),
        "path_bias": min(usable, key=lane_cost),
        "retreat_threshold": 0.0,
        "formation": "wedge" if style in ("turtle", "hunter") else "column",
    }


@pytest.fixture(scope="module")
def task() -> GridCTFTask:
    return GridCTFTask(train_size=16, val_size=32, test_size=16, seed=0)


# -- the task protocol -------------------------------------------------------------------------
def test_is_a_game_task_with_schema_and_instructions(task: GridCTFTask) -> None:
    assert isinstance(task, GameTask)
    assert (task.name, task.kind) == ("game:ctf", "game")
    assert task.schema is STRATEGY_SCHEMA
    for field_name in STRATEGY_SCHEMA["required"]:
        assert field_name in task.instructions
    example = task.examples("val")[0]
    assert isinstance(example, Example)
    text = example.prompt_text()
    assert "Turn limit:" in text and "Scouting report:" in text and "Constraint:" in text
    assert "\n  0 " in text  # the ASCII map with row numbers
    assert json.loads(json.dumps(example.state)) == example.state  # JSON-serializable


def test_ids_sizes_and_bad_arguments() -> None:
    task = GridCTFTask(train_size=3, val_size=2, test_size=1, seed=5)
    assert [e.id for e in task.examples("train")] == [
        "ctf-train-0000",
        "ctf-train-0001",
        "ctf-train-0002",
    ]
    assert len(task.examples("val")) == 2 and len(task.examples("test")) == 1
    with pytest.raises(TaskError):
        task.examples("dev")  # type: ignore[arg-type]
    with pytest.raises(TaskError):
        GridCTFTask(train_size=-1)


def test_splits_are_disjoint(task: GridCTFTask) -> None:
    check_disjoint(task)  # raises on any shared id or prompt
    seeds = {s: {e.state["seed"] for e in task.examples(s)} for s in ("train", "val", "test")}
    assert not seeds["train"] & seeds["val"]
    assert not seeds["train"] & seeds["test"]
    assert not seeds["val"] & seeds["test"]


def test_generated_scenarios_are_well_formed() -> None:
    for seed in range(0, 3_000_000, 20_000):
        state = generate_scenario(seed)
        rows = state["rows"]
        open_cells = sum(ch != "#" for line in rows for ch in line)
        assert len(bfs_distances(rows, tuple(state["base"]))) == open_cells, seed  # connected
        for lane in LANES:
            passable = _lane_passable(rows, tuple(state["lanes"][lane]), tuple(state["lane_rows"]))
            assert passable != state["lane_status"][lane].startswith("blocked"), (seed, lane)
        units = [tuple(u) for u in state["our_units"]] + [
            tuple(u["pos"]) for u in state["enemy_units"]
        ]
        assert len(set(units)) == len(units) and all(rows[r][c] == "." for r, c in units)
        assert 4 <= len(state["our_units"]) <= 6 and state["turn_limit"] > 2 * min(
            state["route_lengths"].values()
        )


# -- rules ---------------------------------------------------------------------------------------
def test_walls_block_movement() -> None:
    sim = Simulation(tiny_state(), STEADY)
    unit = sim.units[0]
    wall_above = sim.grid.index((3, 0))
    assert not sim.grid.open[wall_above]
    sim._move_toward(unit, sim.grid.index((1, 0)))  # straight up is a wall: go round
    assert sim.grid.cell(unit.pos) == (4, 1)
    result = play(tiny_state(), STEADY, record_frames=True)
    for frame in result.frames:
        for r, c in frame.values():
            assert tiny_state()["rows"][r][c] != "#"
    # the only way through the wall row is the gap at (3, 3)
    crossing = [f["a"] for f in result.frames if f["a"][0] == 3]
    assert crossing and all(cell == (3, 3) for cell in crossing)


def test_a_unit_moves_at_most_one_square_per_turn(task: GridCTFTask) -> None:
    rng = random.Random(3)
    for example in task.examples("val")[:6]:
        result = play(example.state, random_strategy(rng), record_frames=True)
        assert len(result.frames) == result.turns_used + 1
        for before, after in zip(result.frames, result.frames[1:], strict=False):
            for name, (r, c) in after.items():
                r0, c0 = before[name]
                assert abs(r - r0) + abs(c - c0) <= 1, (example.id, name)


def test_fog_hides_units_beyond_the_vision_radius() -> None:
    enemy = {"role": "guard", "pos": [0, 4], "post": [0, 4], "lane": None}
    sim = Simulation(tiny_state(our_units=[[4, 3]], enemy_units=[enemy], vision=3), STEADY)
    assert sim.grid.manhattan(sim.units[0].pos, sim.units[1].pos) == 5
    assert sim.visible_enemies("us") == [] and sim.visible_enemies("them") == []
    sim.units[1].pos = sim.grid.index((1, 3))  # 3 squares away: now inside the radius
    assert [e.name for e in sim.visible_enemies("us")] == ["E1"]
    assert [u.name for u in sim.visible_enemies("them")] == ["a"]


def test_flag_capture_requires_returning_home() -> None:
    # No enemies: the attacker walks (4,0) -> gap (3,3) -> F (1,1) in 8 turns, then 7 more
    # turns back to B at (5,2).
    full = play(tiny_state(), STEADY)
    assert full.captured and full.pickup_turn == 8 and full.capture_turn == 15
    cut = play(tiny_state(turn_limit=12), STEADY)
    assert cut.pickup_turn == 8 and not cut.captured
    assert 0.5 <= cut.progress < 1.0  # credit for the pickup and part of the way home
    task = GridCTFTask(0, 0, 0)
    example = Example(id="tiny", input="", state=tiny_state(turn_limit=12))
    score = task.score(reply(STEADY), example)
    assert score.hard == 0 and 0 < score.soft < full.soft
    assert "flag picked up at turn 8" in score.feedback
    won = task.score(reply(STEADY), Example(id="tiny", input="", state=tiny_state()))
    assert won.hard == 1 and "captured at turn 15" in won.feedback


def test_a_killed_carrier_drops_the_flag_back_on_its_stand() -> None:
    sim = Simulation(tiny_state(our_units=[[2, 3], [1, 2]]), STEADY)
    carrier, other = sim.units
    carrier.carrying = True
    sim.turn = 9
    sim._kill(carrier)
    assert not carrier.alive and not carrier.carrying
    assert sim.carrier_deaths == [(9, (2, 3))]
    assert "carrier a killed near (2,3)" in sim.events[-1]
    other.pos = sim.flag_stand  # the flag is back on F: the next attacker there picks it up
    sim._flags()
    assert other.carrying and sim.pickup_turn == 9


# -- constraints ---------------------------------------------------------------------------------
def _find(task: GridCTFTask, kind: str) -> Example:
    pool = task.examples("train") + task.examples("val") + task.examples("test")
    return next(e for e in pool if e.state["constraints"][kind] is not None)


def test_min_defense_violation_scores_zero_with_feedback(task: GridCTFTask) -> None:
    example = _find(task, "min_defense")
    floor = example.state["constraints"]["min_defense"]
    score = task.score(reply(dict(STEADY, defense=0.0)), example)
    assert (score.hard, score.soft) == (0, 0.0)
    assert "constraint violated" in score.feedback and f"at least {floor}" in score.feedback
    ok = task.score(reply(dict(STEADY, defense=floor)), example)
    assert "constraint" not in ok.feedback and ok.soft > 0


def test_max_attackers_violation_scores_zero_with_feedback(task: GridCTFTask) -> None:
    example = _find(task, "max_attackers")
    cap = example.state["constraints"]["max_attackers"]
    score = task.score(reply(dict(STEADY, defense=0.0)), example)
    assert (score.hard, score.soft) == (0, 0.0)
    assert f"at most {cap} attackers" in score.feedback


def test_forbidden_lane_violation_scores_zero_with_feedback(task: GridCTFTask) -> None:
    example = _find(task, "forbidden_lane")
    lane = example.state["constraints"]["forbidden_lane"]
    score = task.score(reply(dict(STEADY, path_bias=lane)), example)
    assert (score.hard, score.soft) == (
        0,
        0.0,
    ) and f"the {lane} lane is forbidden" in score.feedback
    other = next(x for x in LANES if x != lane)
    spread = task.score(reply(dict(STEADY, path_bias=other, formation="spread")), example)
    assert spread.soft == 0.0 and "spread" in spread.feedback


# -- determinism ---------------------------------------------------------------------------------
def test_same_seed_and_strategy_give_the_same_game(task: GridCTFTask) -> None:
    example = task.examples("val")[1]
    strategy = random_strategy(random.Random(11))
    first, second = play(example.state, strategy), play(example.state, strategy)
    assert first.to_dict() == second.to_dict()
    assert generate_scenario(1234) == generate_scenario(1234)
    again = GridCTFTask(train_size=16, val_size=32, test_size=16, seed=0)
    assert [e.input for e in again.examples("val")] == [e.input for e in task.examples("val")]
    # replaying a JSON round-tripped state (as stored in a run directory) changes nothing
    restored = json.loads(json.dumps(example.state))
    assert play(restored, strategy).to_dict() == first.to_dict()


def test_different_seeds_give_different_maps() -> None:
    maps = {tuple(generate_scenario(seed)["rows"]) for seed in range(20)}
    assert len(maps) >= 18
    other = GridCTFTask(train_size=0, val_size=8, test_size=0, seed=1).examples("val")
    base = GridCTFTask(train_size=0, val_size=8, test_size=0, seed=0).examples("val")
    assert [e.input for e in other] != [e.input for e in base]


# -- schema --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("I would attack on the left.", "no JSON strategy"),
        ("[0.5, 0.2]", "no JSON strategy"),
        (json.dumps(dict(STEADY, aggression=1.5)), "aggression: 1.5 is greater than the maximum"),
        (json.dumps(dict(STEADY, defense=-0.1)), "defense: -0.1 is less than the minimum"),
        (json.dumps(dict(STEADY, path_bias="up")), "path_bias: 'up' is not one of"),
        (json.dumps(dict(STEADY, formation=3)), "formation"),
        (json.dumps({k: v for k, v in STEADY.items() if k != "formation"}), "'formation' is a"),
        (json.dumps(dict(STEADY, plan="rush")), "Additional properties"),
        (json.dumps(dict(STEADY, aggression="high")), "aggression: 'high' is not of type"),
    ],
)
def test_bad_answers_score_zero_with_the_reason(task: GridCTFTask, answer: str, expected: str):
    score = task.score(answer, task.examples("val")[0])
    assert (score.hard, score.soft) == (0, 0.0)
    assert expected in score.feedback


def test_random_strategies_are_schema_valid() -> None:
    rng = random.Random(0)
    strategies = [random_strategy(rng) for _ in range(200)]
    assert all(validate_strategy(s) is None for s in strategies)
    assert len({s["path_bias"] for s in strategies}) == 3
    assert len({s["formation"] for s in strategies}) == 3


# -- the game discriminates --------------------------------------------------------------------
def _mean_scores(task: GridCTFTask, choose) -> tuple[float, float]:
    scores = [task.score(reply(choose(e.state)), e) for e in task.examples("val")]
    return statistics.mean(s.hard for s in scores), statistics.mean(s.soft for s in scores)


def test_a_strong_strategy_beats_a_bad_one_across_val(task: GridCTFTask) -> None:
    coward = {
        "aggression": 0.0,
        "defense": 0.5,
        "path_bias": "left",
        "retreat_threshold": 0.9,
        "formation": "spread",
    }
    strong_hard, strong_soft = _mean_scores(task, scenario_aware)
    bad_hard, bad_soft = _mean_scores(task, lambda state: coward)
    rng = random.Random(0)
    random_hard, random_soft = _mean_scores(task, lambda state: random_strategy(rng))
    fixed_hard, _ = _mean_scores(task, lambda state: STEADY)
    assert strong_hard >= 0.5 and bad_hard <= 0.1
    assert strong_soft > bad_soft + 0.2
    assert strong_hard > random_hard + 0.25 and strong_soft > random_soft + 0.15
    # the best play depends on the scenario: reading it beats one fixed strong strategy
    assert strong_hard > fixed_hard + 0.1
