"""Edit-budget schedules and selection (pure)."""

import pytest

from selftaught.skill.budget_schedule import edit_budget
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit
from selftaught.skill.select import dedupe_edits, select_edits


def test_schedules_run_from_max_to_min():
    cos = [edit_budget(s, 9, 4, 2, "cosine") for s in range(1, 10)]
    lin = [edit_budget(s, 9, 4, 2, "linear") for s in range(1, 10)]
    assert cos[0] == lin[0] == 4 and cos[-1] == lin[-1] == 2
    assert cos == sorted(cos, reverse=True) and lin == sorted(lin, reverse=True)
    # cosine stays high longer than linear
    assert edit_budget(3, 9, 4, 1, "cosine") == 4 and edit_budget(3, 9, 4, 1, "linear") == 3
    assert [edit_budget(s, 9, 4, 2, "constant") for s in (1, 9)] == [4, 4]
    assert edit_budget(1, 1, 4, 2, "cosine") == 4
    with pytest.raises(ValueError):
        edit_budget(1, 5, 1, 2, "cosine")
    with pytest.raises(ValueError):
        edit_budget(1, 5, 4, 2, "step")


def test_select_ranks_by_support_then_failures_and_respects_budget():
    edits = [
        Edit("append", content="s1", source="success"),
        Edit("append", content="f1", source="failure"),
        Edit("append", content="f2", source="failure", support=3),
        Edit("append", content="F1 ", source="failure"),  # same as f1 after normalising
    ]
    sel = select_edits(edits, budget=2)
    assert [e.content for e in sel.kept] == ["f2", "f1"]
    assert sel.kept[1].support == 2
    assert [(e.content, why) for e, why in sel.dropped] == [("s1", "over the edit budget (2)")]


def test_select_drops_previously_rejected_edits():
    sel = select_edits(
        [Edit("append", content="bad rule"), Edit("append", content="good")],
        budget=4,
        rejected=[Edit("append", content="BAD   rule")],
    )
    assert [e.content for e in sel.kept] == ["good"]
    assert sel.dropped[0][1] == "rejected by the gate before"


def test_select_keeps_only_the_allowed_operations_saying_why():
    edits = [
        Edit("replace", target="old", content="new", support=3),
        Edit("append", content="kept"),
        Edit("delete", target="old"),
    ]
    sel = select_edits(edits, budget=4, ops=("append",))
    assert [e.content for e in sel.kept] == ["kept"]
    assert sorted(why for _, why in sel.dropped) == [
        "delete is not allowed (edit_ops: append)",
        "replace is not allowed (edit_ops: append)",
    ]
    assert len(select_edits(edits, budget=4).kept) == 3  # every operation by default


def test_edit_ops_are_checked_and_an_append_only_skill_has_no_slow_update():
    assert SkillOptConfig(edit_ops=("append",)).edit_ops == ("append",)
    with pytest.raises(ValueError, match="edit_ops must be some of"):
        SkillOptConfig(edit_ops=("append", "rewrite"))
    with pytest.raises(ValueError, match="edit_ops must be some of"):
        SkillOptConfig(edit_ops=())
    with pytest.raises(ValueError, match="slow_every needs replace or delete"):
        SkillOptConfig(edit_ops=("append",), slow_every=2)


def test_dedupe_keeps_first_position():
    out = dedupe_edits(
        [Edit("append", content="a"), Edit("append", content="b"), Edit("append", content="a")]
    )
    assert [(e.content, e.support) for e in out] == [("a", 2), ("b", 1)]


def test_config_defaults_follow_skillopt_and_validate():
    c = SkillOptConfig()
    assert (c.epochs, c.batch_size, c.minibatch_size, c.merge_batch_size) == (4, 40, 8, 8)
    assert (c.edit_budget_max, c.edit_budget_min, c.edit_schedule) == (4, 2, "cosine")
    assert c.gate.metric == "hard" and c.gate.margin == 1.0
    for bad in (
        {"epochs": 0},
        {"edit_budget_min": 5},
        {"edit_schedule": "exp"},
        {"gate": {"margin": 1}},
        {"merge_batch_size": 1},
    ):
        with pytest.raises(ValueError):
            SkillOptConfig(**bad)
