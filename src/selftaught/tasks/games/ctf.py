"""Grid capture-the-flag as a GameTask: the policy reads a scenario (ASCII map, scouting
report, constraints) and answers one JSON strategy; the score comes from playing it.

hard = 1 iff the enemy flag was carried back to our base within the turn limit and the
scenario's constraint held. soft = 0.6 * capture progress + 0.25 * survival + 0.15 * speed
(halved when the enemy carries our flag home); 0 on invalid JSON, schema or constraint
violations. Feedback says what happened, in words a reflecting model can use.
"""

from __future__ import annotations

import random
from typing import Any

import jsonschema

from selftaught.tasks.base import SPLITS, Example, Score, Split, TaskError, TaskKind
from selftaught.tasks.extract import extract_json
from selftaught.tasks.games.ctf_map import LANES, MAX_HP, UNIT_LETTERS, generate_scenario
from selftaught.tasks.games.ctf_sim import GameResult, play

FORMATIONS = ("column", "wedge", "spread")

STRATEGY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Grid capture-the-flag strategy",
    "type": "object",
    "properties": {
        "aggression": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "0 = sneak around enemies, 1 = hunt every enemy seen and fight",
        },
        "defense": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "share of our units held back to guard our base (rounded)",
        },
        "path_bias": {
            "enum": list(LANES),
            "description": "lane the attackers go through",
        },
        "retreat_threshold": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "an attacker whose hit-point share falls below this goes home to heal",
        },
        "formation": {
            "enum": list(FORMATIONS),
            "description": "column: each at full speed; wedge: move together; "
            "spread: split over the three lanes",
        },
    },
    "required": ["aggression", "defense", "path_bias", "retreat_threshold", "formation"],
    "additionalProperties": False,
}

INSTRUCTIONS = (
    "Answer with one JSON object (no other text needed) matching the strategy schema:\n"
    '{"aggression": 0..1, "defense": 0..1, "path_bias": "left"|"center"|"right", '
    '"retreat_threshold": 0..1, "formation": "column"|"wedge"|"spread"}\n'
    "aggression: 0 sneaks around enemies, 1 hunts and fights every enemy seen. "
    "defense: share of units kept home to guard our base. "
    "path_bias: the lane the attackers use. "
    "retreat_threshold: attackers below this share of hit points go home to heal. "
    "formation: column (full speed, one by one), wedge (wait for each other, fight together), "
    "spread (one attacker per lane, starting with path_bias). "
    "All five fields are required; respect the scenario's constraint."
)

SPLIT_OFFSETS = {"train": 0, "val": 300_000, "test": 600_000}  # disjoint seed ranges
MAX_SPLIT_SIZE = 300_000

_VALIDATOR = jsonschema.Draft202012Validator(STRATEGY_SCHEMA)


def random_strategy(rng: random.Random) -> dict[str, Any]:
    """A random, schema-valid strategy: every field uniform over its range, except defense,
    drawn from 0..0.6 (holding back more leaves too few attackers to ever capture)."""
    return {
        "aggression": round(rng.random(), 2),
        "defense": round(rng.random() * 0.6, 2),
        "path_bias": rng.choice(LANES),
        "retreat_threshold": round(rng.random(), 2),
        "formation": rng.choice(FORMATIONS),
    }


def validate_strategy(strategy: Any) -> str | None:
    """None when `strategy` matches the schema, else the jsonschema message (with its path)."""
    errors = sorted(_VALIDATOR.iter_errors(strategy), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path)
    return f"{where}: {first.message}" if where else first.message


def constraint_violation(state: dict[str, Any], strategy: dict[str, Any]) -> str | None:
    """The scenario constraint a (schema-valid) strategy breaks, in words, or None."""
    rules = state["constraints"]
    n = len(state["our_units"])
    defenders = min(n, max(0, round(float(strategy["defense"]) * n)))
    attackers = n - defenders
    if rules.get("min_defense") is not None and strategy["defense"] < rules["min_defense"]:
        return (
            f"constraint violated: defense must be at least {rules['min_defense']}, "
            f"got {strategy['defense']}"
        )
    if rules.get("max_attackers") is not None and attackers > rules["max_attackers"]:
        return (
            f"constraint violated: at most {rules['max_attackers']} attackers allowed, "
            f"defense {strategy['defense']} sends {attackers} of {n}"
        )
    lane = rules.get("forbidden_lane")
    if lane is not None:
        if strategy["path_bias"] == lane:
            return f"constraint violated: the {lane} lane is forbidden, got path_bias {lane!r}"
        if strategy["formation"] == "spread":
            return f"constraint violated: the {lane} lane is forbidden and spread uses every lane"
    return None


def constraint_text(state: dict[str, Any]) -> str:
    rules = state["constraints"]
    n = len(state["our_units"])
    if rules.get("min_defense") is not None:
        return f"defense must be at least {rules['min_defense']}."
    if rules.get("max_attackers") is not None:
        k = rules["max_attackers"]
        return f"at most {k} of our {n} units may attack (the rest must defend)."
    if rules.get("forbidden_lane") is not None:
        lane = rules["forbidden_lane"]
        return f"the {lane} lane is mined: path_bias must not be {lane!r}; spread is not allowed."
    return "none."


def _guards(count: int) -> str:
    return f"{count} guards" if count == 1 else f"{count} guard"


def _scouting_report(state: dict[str, Any]) -> str:
    style, lane = state["opponent"]["style"], state["opponent"]["lane"]
    roles = [u["role"] for u in state["enemy_units"]]
    total = len(roles)
    holders = sum(1 for u in state["enemy_units"] if u["role"] == "guard" and u["lane"])
    if style == "turtle":
        return f"the enemy turtles: all {total} of its units stay within two squares of its flag."
    if style == "lane_guard":
        return (
            f"the enemy holds the top of the {lane} lane with {holders} units; "
            f"{_guards(total - holders)} its flag."
        )
    if style == "raider":
        raiders = roles.count("raider")
        return (
            f"the enemy sends {raiders} raiders after our flag through the {lane} lane; "
            f"{_guards(total - raiders)} its flag."
        )
    hunters = roles.count("hunter")
    return (
        f"the enemy hunts: {hunters} units wait at the top of the lanes and chase any unit they "
        f"see; {total - hunters} guards its flag."
    )


def render_map(state: dict[str, Any]) -> str:
    """The map as ASCII with row and column numbers; enemy units are hidden (fog of war)."""
    grid = [list(line) for line in state["rows"]]
    fr, fc = state["flag"]
    br, bc = state["base"]
    grid[fr][fc], grid[br][bc] = "F", "B"
    for letter, (r, c) in zip(UNIT_LETTERS, state["our_units"], strict=False):
        grid[r][c] = letter
    width = state["width"]
    header = "    " + "".join(str(c % 10) for c in range(width))
    lines = [header] + [f"{r:>3} " + "".join(row) for r, row in enumerate(grid)]
    return "\n".join(lines)


def describe(state: dict[str, Any]) -> str:
    """The scenario as the policy reads it."""
    top, bottom = state["lane_rows"]
    n_ours, n_theirs = len(state["our_units"]), len(state["enemy_units"])
    lane_lines = []
    for lane in LANES:
        c0, c1 = state["lanes"][lane]
        status = state["lane_status"][lane]
        steps = state["route_lengths"][lane]
        lane_lines.append(
            f"- {lane}: columns {c0}-{c1}, {status}; base to flag through it: {steps} steps"
        )
    return "\n".join(
        [
            "Grid capture-the-flag. Choose the strategy for our team.",
            "",
            f"Map ({state['width']} wide x {state['height']} high; row 0 is the enemy's edge at "
            "the top; '#' wall, '.' open, F the enemy flag, B our base and our flag, "
            f"{UNIT_LETTERS[0]}-{UNIT_LETTERS[n_ours - 1]} our units; enemy units are hidden):",
            render_map(state),
            "",
            f"Lanes (walled corridors between rows {top} and {bottom}):",
            *lane_lines,
            "",
            "Rules: each turn every unit moves at most one square (up, down, left, right); walls "
            f"block. A side sees enemies within {state['vision']} squares (Manhattan) of any of "
            "its units. Units next to an enemy fight; the hit chance grows with allies within 2 "
            f"squares and near one's own flag; a unit has {MAX_HP} hit points and heals next to "
            "its own flag. Step on F to pick up the enemy flag; it counts only once carried back "
            "to B. A killed carrier drops the flag, which returns to its stand. If the enemy "
            "carries our flag to its stand, we lose.",
            f"Forces: we have {n_ours} units, the enemy has {n_theirs}.",
            f"Scouting report: {_scouting_report(state)}",
            f"Turn limit: {state['turn_limit']}.",
            f"Constraint: {constraint_text(state)}",
        ]
    )


def score_strategy(state: dict[str, Any], strategy: Any) -> tuple[Score, GameResult | None]:
    """Validate, check the constraint, play. Returns the score and the game (None if unplayed)."""
    problem = validate_strategy(strategy)
    if problem is not None:
        return Score(0, 0.0, f"strategy does not match the schema: {problem}"), None
    violation = constraint_violation(state, strategy)
    if violation is not None:
        return Score(0, 0.0, violation), None
    result = play(state, strategy)
    return Score(1 if result.captured else 0, result.soft, result.summary), result


class GridCTFTask:
    """Grid capture-the-flag: one seeded scenario per example, splits from disjoint seeds."""

    name = "game:ctf"
    kind: TaskKind = "game"
    schema = STRATEGY_SCHEMA
    instructions = INSTRUCTIONS

    def __init__(
        self, train_size: int = 64, val_size: int = 32, test_size: int = 64, seed: int = 0
    ):
        sizes = {"train": train_size, "val": val_size, "test": test_size}
        for split, size in sizes.items():
            if not 0 <= size <= MAX_SPLIT_SIZE:
                raise TaskError(
                    f"game:ctf: {split}_size must be in 0..{MAX_SPLIT_SIZE}, got {size}"
                )
        if seed < 0:
            raise TaskError(f"game:ctf: seed must be >= 0, got {seed}")
        self.sizes = sizes
        self.seed = seed
        self._cache: dict[str, list[Example]] = {}

    def scenario_seed(self, split: str, index: int) -> int:
        return self.seed * 1_000_000 + SPLIT_OFFSETS[split] + index

    def examples(self, split: Split) -> list[Example]:
        if split not in SPLITS:
            raise TaskError(f"game:ctf: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if split not in self._cache:
            self._cache[split] = [self._example(split, i) for i in range(self.sizes[split])]
        return list(self._cache[split])

    def _example(self, split: str, index: int) -> Example:
        state = generate_scenario(self.scenario_seed(split, index))
        return Example(id=f"ctf-{split}-{index:04d}", input=describe(state), state=state)

    def score(self, output: str, example: Example) -> Score:
        try:
            strategy = extract_json(output)
        except ValueError as err:
            return Score(0, 0.0, f"no JSON strategy: {err}")
        if not isinstance(strategy, dict):
            kind = type(strategy).__name__
            return Score(0, 0.0, f"no JSON strategy: expected one object, got a JSON {kind}")
        score, _ = score_strategy(example.state, strategy)
        return score
