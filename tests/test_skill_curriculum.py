"""--curriculum (issue 52): the first epoch's train batches easier first, val never touched,
refused where the task gives no difficulties; GymTask's difficulty from reasoning-gym's own
metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.errors import ConfigError
from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.curriculum import curriculum_order, epoch_order, example_difficulty
from selftaught.tasks.base import Example
from selftaught.tasks.gym import GymTask, gym_difficulty
from tests.scripted import ToyTask, canned_analyst, rule_target, schedule_of_rules

# train-000 .. train-007: two of each level, so ties show their order
LEVELS = [3, 1, 2, 0, 3, 1, 2, 0]


def graded(levels: list[float] | None = LEVELS) -> ToyTask:
    task = ToyTask()
    if levels is not None:
        for ex, level in zip(task.splits["train"], levels, strict=True):
            ex.state["difficulty"] = level
    return task


def make(tmp: Path, task: ToyTask, target=None, **cfg) -> SkillTrainer:
    defaults = {"epochs": 2, "batch_size": 4, "concurrency": 4, "gate": GateConfig()}
    config = SkillOptConfig(**{**defaults, "demos_max": 0, "pool": False, **cfg})
    analyst = canned_analyst(failure=schedule_of_rules("rule delta", "rule alpha"))
    return SkillTrainer(
        config,
        task,
        target or rule_target(),
        analyst,
        "# Skill\n",
        output_dir=tmp,
        progress=False,
    )


def batches(run: Path) -> list[list[str]]:
    steps = sorted((run / "diagnostics").glob("step_*.json"))[1:]  # 0: the baseline
    return [[r["id"] for r in json.loads(p.read_text())["batch"]] for p in steps]


def history(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]


def test_first_epoch_easier_first_later_epochs_and_val_as_without(tmp_path):
    task = graded()
    level = {ex.id: ex.state["difficulty"] for ex in task.splits["train"]}
    make(tmp_path / "plain", graded()).train()
    trainer = make(tmp_path / "cur", task, curriculum=True)
    trainer.train()
    plain, cur = batches(tmp_path / "plain"), batches(tmp_path / "cur")
    first = cur[0] + cur[1]
    assert sorted(first) == sorted(level)  # the same train items, none added or dropped
    assert [level[i] for i in first] == sorted(level[i] for i in first)
    # ties keep the plain run's seeded first-epoch order; later epochs are the plain run's
    plain_first = plain[0] + plain[1]
    for lv in set(level.values()):
        assert [i for i in first if level[i] == lv] == [i for i in plain_first if level[i] == lv]
    assert plain_first != first and cur[2:] == plain[2:]
    # val: the task's items, in the task's order; the baseline on it identical
    assert [ex.id for ex in trainer.val_set] == [ex.id for ex in task.examples("val")]
    assert history(tmp_path / "cur")[0]["val"] == history(tmp_path / "plain")[0]["val"]
    # the history and the diagnostics say which batches the curriculum ordered
    rows = history(tmp_path / "cur")[1:]
    assert [r.get("curriculum") for r in rows] == [[0, 1], [2, 3], None, None]
    assert all("curriculum" not in r for r in history(tmp_path / "plain")[1:])
    diag = json.loads((tmp_path / "cur" / "diagnostics" / "step_0001.json").read_text())
    assert diag["curriculum"] == {"difficulty": [level[i] for i in cur[0]]}


def test_a_resumed_run_recomputes_the_same_order(tmp_path):
    make(tmp_path / "ref", graded(), curriculum=True).train()
    target = rule_target()
    target.fail_after, target.interrupt = 20, RuntimeError("killed")  # inside step 1
    with pytest.raises(RuntimeError, match="killed"):
        make(tmp_path / "run", graded(), target=target, curriculum=True).train()
    make(tmp_path / "run", graded(), curriculum=True).train()

    def stable(run: Path) -> list[dict]:
        return [
            {k: v for k, v in r.items() if k not in ("time_s", "step_time_s", "usage")}
            for r in history(run)
        ]

    assert stable(tmp_path / "run") == stable(tmp_path / "ref")
    assert batches(tmp_path / "run") == batches(tmp_path / "ref")


def test_a_task_without_difficulties_refuses_before_any_call(tmp_path):
    target = rule_target()
    with pytest.raises(ConfigError, match=r"task 'toy' gives no difficulty to 8 of its 8"):
        make(tmp_path / "none", graded(None), target=target, curriculum=True).train()
    with pytest.raises(ConfigError, match="same difficulty"):
        make(tmp_path / "flat", graded([1] * 8), target=target, curriculum=True).train()
    assert target.calls == [] and not (tmp_path / "none" / "history.jsonl").exists()
    make(tmp_path / "off", graded(None), target=target).train()  # off: as before


def test_order_is_seeded_stable_and_refuses_bad_values():
    exs = [Example(f"e{i}", f"q{i}", state={"difficulty": i % 3}) for i in range(9)]
    a, b = curriculum_order(exs, 5, "t"), curriculum_order(exs, 5, "t")
    assert [e.id for e in a] == [e.id for e in b]
    assert [e.state["difficulty"] for e in a] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    ties = [e.id for e in epoch_order(exs, 5, 0) if e.state["difficulty"] == 0]
    assert [e.id for e in a[:3]] == ties
    assert example_difficulty(Example("x", "q")) is None
    with pytest.raises(Exception, match="'x'.*finite number"):
        example_difficulty(Example("x", "q", state={"difficulty": "hard"}))


def test_gym_difficulty_from_chain_sums_own_metadata():
    task = GymTask("chain_sum", seed=3, train_size=24, val_size=4, test_size=4)
    levels = []
    for ex in task.examples("train"):
        md = ex.state["entry"]["metadata"]
        assert md["difficulty"] == {"num_terms": (2, 6), "num_digits": (1, 4)}
        expected = ((md["num_terms"] - 2) / 4 + (md["num_digits"] - 1) / 3) / 2
        assert ex.state["difficulty"] == pytest.approx(expected)
        levels.append(expected)
    assert len(set(levels)) > 1
    easiest = curriculum_order(task.examples("train"), 0, task.name)[0]
    assert easiest.state["difficulty"] == min(levels)


def test_gym_difficulty_reads_only_what_the_generator_gives():
    knobs = {"a": (0, 10), "b": (2, 2)}  # b held fixed: counts for nothing
    assert gym_difficulty({"difficulty": knobs, "a": 5, "b": 2}) == 0.5
    assert gym_difficulty({"difficulty": {"b": (2, 2)}, "b": 2}) == 0.0
    assert gym_difficulty({"difficulty": knobs, "a": 5}) is None  # b's value not given
    assert gym_difficulty({"type": "syllogism"}) is None
    # word_sequence_reversal names its knob `words` but gives `num_words`: no guessing
    task = GymTask("word_sequence_reversal", train_size=3, val_size=1, test_size=1)
    assert all("difficulty" not in ex.state for ex in task.examples("train"))


def test_a_jsonl_line_carries_its_difficulty(tmp_path):
    from selftaught.tasks.jsonl import JsonlTask

    path = tmp_path / "t.jsonl"
    rows = [
        {"input": "q1", "reference": "a", "difficulty": 2, "split": "train"},
        {"input": "q2", "reference": "b", "difficulty": 0.5, "split": "train"},
        {"input": "q3", "reference": "c", "split": "val"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = JsonlTask(str(path))
    order = curriculum_order(task.examples("train"), 0, task.name)
    assert [e.input for e in order] == ["q2", "q1"]


def test_curriculum_none_orders_where_the_task_gives_difficulties_and_only_there(tmp_path):
    make(tmp_path / "on", graded(), curriculum=True).train()
    make(tmp_path / "auto", graded(), curriculum=None).train()
    assert batches(tmp_path / "auto") == batches(tmp_path / "on")
    for name, task in (("none", graded(None)), ("flat", graded([1] * 8))):
        make(tmp_path / name, task, curriculum=None).train()  # no refusal: left as without
        make(tmp_path / f"{name}-off", graded(None if name == "none" else [1] * 8)).train()
        assert batches(tmp_path / name) == batches(tmp_path / f"{name}-off")
        assert all("curriculum" not in r for r in history(tmp_path / name)[1:])
