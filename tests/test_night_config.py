"""One name, one place (issue 64, item 4): every setting of `NightConfig` lives in exactly one
place. Walking its tree of configs, no leaf name appears twice: a setting two configs shared
(the seed, the stops, the tracker) is read from one of them, and two settings of one name
(the skill's epochs and the adapter's) were renamed to say whose they are."""

from __future__ import annotations

import dataclasses
import typing
from collections import defaultdict
from collections.abc import Iterator

import pytest

from selftaught.errors import ConfigError
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.night.config import NightConfig
from selftaught.stops import Stops

# Leaves that are not settings of a night: SkillOptConfig's own stops and tracker under
# `training`, which a night refuses set (the night's `stops` and `report_to` are those
# settings; `test_the_nights_own_settings_are_refused_under_training`). Nothing else.
NOT_SETTINGS = {"training.stops.max_minutes", "training.stops.patience", "training.report_to"}


def _config_type(hint: object) -> type | None:
    """The dataclass a field holds (itself, or inside `X | None`), else None."""
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def leaves(cls: type, at: str = "") -> Iterator[str]:
    """The dotted path of every leaf field under `cls`, nested configs walked."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        nested = _config_type(hints[f.name])
        if nested is None:
            yield at + f.name
        else:
            yield from leaves(nested, f"{at}{f.name}.")


def repeated(paths: Iterator[str]) -> dict[str, list[str]]:
    """Leaf name -> its paths, for each name more than one path ends in."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        by_name[path.rsplit(".", 1)[-1]].append(path)
    return {name: found for name, found in by_name.items() if len(found) > 1}


def test_every_leaf_of_a_night_config_has_a_name_of_its_own():
    settings = (p for p in leaves(NightConfig) if p not in NOT_SETTINGS)
    assert repeated(settings) == {}


def test_the_walk_reaches_every_nested_config_and_the_allow_list_is_real():
    paths = set(leaves(NightConfig))
    for path in (
        "training.gate.margin",
        "training.budget.calls",
        "stops.patience",
        "weight_training.adapter_max_steps",
        "miner.check_max_tokens",
        "kinds.grouping_seed",
        "dream.synthetic_share",
    ):
        assert path in paths
    assert paths >= NOT_SETTINGS  # an entry naming no leaf would hide nothing and rot


@dataclasses.dataclass
class _Inner:
    seed: int = 0


@dataclasses.dataclass
class _Outer:
    seed: int = 0
    inner: _Inner | None = None


def test_a_leaf_name_that_appears_twice_is_found():
    assert repeated(leaves(_Outer)) == {"seed": ["seed", "inner.seed"]}


@pytest.mark.parametrize(
    ("training", "says"),
    [
        (SkillOptConfig(stops=Stops(max_minutes=5)), "NightConfig.stops"),
        (SkillOptConfig(stops=Stops(patience=2)), "--max-minutes, --patience"),
        (SkillOptConfig(report_to="mlflow"), "NightConfig.report_to"),
    ],
)
def test_the_nights_own_settings_are_refused_under_training(training, says):
    with pytest.raises(ConfigError, match=says):
        NightConfig(training=training)
    assert NightConfig(stops=Stops(max_minutes=5), report_to="mlflow").training.stops == Stops()


def test_the_night_has_one_seed():
    seeds = [p for p in leaves(NightConfig) if p.rsplit(".", 1)[-1].endswith("seed")]
    assert seeds == ["training.seed", "kinds.grouping_seed"]  # --seed; the kinds' k-means
