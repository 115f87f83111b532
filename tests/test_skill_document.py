"""Edits and their application: every op, target matching, fallbacks, protected regions."""

import pytest

from selftaught.skill.document import (
    PROTECT_CLOSE,
    PROTECT_OPEN,
    Edit,
    EditError,
    SkillDocument,
    apply_edits,
    protected_spans,
)

DOC = "# Skill\n- Add carefully.\n- Check the sign.\n"


def test_append_insert_replace_delete():
    text, reps = apply_edits(
        DOC,
        [
            Edit("append", content="- Give the number only."),
            Edit("insert_after", target="- Add carefully.", content="- Carry the tens."),
            Edit("replace", target="Check the sign.", content="Check the sign twice."),
            Edit("delete", target="- Add carefully."),
        ],
    )
    assert [r.status for r in reps] == ["applied"] * 4
    assert text == "# Skill\n- Carry the tens.\n- Check the sign twice.\n- Give the number only.\n"


def test_target_matching_ignores_whitespace_case_and_bullets():
    text, reps = apply_edits(DOC, [Edit("replace", target="check   THE sign", content="X")])
    assert reps[0].status == "applied"
    assert "- X.\n" in text
    text, reps = apply_edits(DOC, [Edit("delete", target="Add carefully")])
    assert reps[0].status == "applied" and text == "# Skill\n- Check the sign.\n"


def test_missing_target_fallback_append_and_not_found():
    text, reps = apply_edits(
        DOC,
        [
            Edit("insert_after", target="no such line", content="- New rule."),
            Edit("replace", target="no such line", content="y"),
            Edit("delete", target="also missing"),
        ],
    )
    assert [r.status for r in reps] == ["fallback_append", "target_not_found", "target_not_found"]
    assert text == DOC + "- New rule.\n"
    text, reps = apply_edits(
        DOC, [Edit("insert_after", target="nope", content="z")], fallback_append=False
    )
    assert reps[0].status == "target_not_found" and text == DOC


def test_duplicate_noop_and_length_cap():
    text, reps = apply_edits(
        DOC,
        [
            Edit("append", content="- add CAREFULLY."),
            Edit("replace", target="- Add carefully.", content="- Add carefully."),
            Edit("append", content="x" * 500),
        ],
        max_chars=len(DOC) + 100,
    )
    assert [r.status for r in reps] == ["duplicate", "noop", "over_length"]
    assert text == DOC


def test_protected_regions_are_never_edited():
    doc = f"# Skill\n{PROTECT_OPEN}\n- Never reveal secrets.\n{PROTECT_CLOSE}\n- Be brief.\n"
    text, reps = apply_edits(
        doc,
        [
            Edit("delete", target="- Never reveal secrets."),
            Edit("replace", target="Never reveal", content="Always reveal"),
            Edit("insert_after", target="- Never reveal secrets.", content="- inside"),
            Edit("replace", target="- Be brief.", content="- Be very brief."),
            Edit("insert_after", target=PROTECT_CLOSE, content="- after the region"),
            Edit("append", content="- last"),
        ],
    )
    assert [r.status for r in reps] == [
        "protected",
        "protected",
        "protected",
        "applied",
        "applied",
        "applied",
    ]
    start, end = protected_spans(text)[0]
    assert text[start:end] == f"{PROTECT_OPEN}\n- Never reveal secrets.\n{PROTECT_CLOSE}"
    assert text.endswith("- after the region\n- Be very brief.\n- last\n")


def test_unclosed_protected_region_protects_to_the_end():
    doc = f"# Skill\n{PROTECT_OPEN}\n- rule\n"
    text, reps = apply_edits(
        doc, [Edit("append", content="- more"), Edit("insert_after", target="x", content="y")]
    )
    assert [r.status for r in reps] == ["protected", "protected"] and text == doc


def test_edit_from_dict_aliases_and_validation():
    e = Edit.from_dict({"type": "Insert", "anchor": "a", "text": "b", "reason": "r"}, source="f")
    assert (e.op, e.target, e.content, e.rationale, e.source) == (
        "insert_after",
        "a",
        "b",
        "r",
        "f",
    )
    assert Edit.from_dict({"op": "remove", "target": "a"}).op == "delete"
    for bad, why in [
        ({"op": "explode", "content": "x"}, "unknown op"),
        ({"op": "replace", "content": "x"}, "target"),
        ({"op": "append"}, "content"),
        ({"content": "x"}, "no 'op'"),
        ("append x", "JSON object"),
        ({"op": "append", "content": PROTECT_OPEN}, "protection markers"),
        ({"op": "append", "content": "x" * 50}, "cap"),
    ]:
        with pytest.raises(EditError, match=why):
            Edit.from_dict(bad, max_chars=40)


def test_skill_document_is_immutable_and_hashes():
    d = SkillDocument(DOC)
    d2, reps = d.apply([Edit("append", content="- more")])
    assert d.text == DOC and d2.text.endswith("- more\n") and reps[0].changed
    assert d.hash() != d2.hash() and d.hash() == SkillDocument(DOC).hash()
