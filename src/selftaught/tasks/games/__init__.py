"""Games: tasks whose answer is a JSON strategy, scored by playing a seeded simulator."""

from selftaught.tasks.games.ctf import (
    STRATEGY_SCHEMA,
    GridCTFTask,
    constraint_violation,
    describe,
    random_strategy,
    score_strategy,
    validate_strategy,
)
from selftaught.tasks.games.ctf_map import generate_scenario
from selftaught.tasks.games.ctf_sim import GameResult, Simulation, play

__all__ = [
    "STRATEGY_SCHEMA",
    "GameResult",
    "GridCTFTask",
    "Simulation",
    "constraint_violation",
    "describe",
    "generate_scenario",
    "play",
    "random_strategy",
    "score_strategy",
    "validate_strategy",
]
