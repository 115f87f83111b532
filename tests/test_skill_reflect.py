"""Reflection and aggregation with a scripted analyst: parsing, the one repair call, bounded
context, backend errors, hierarchical merging."""

import asyncio
import json

import pytest

from selftaught.models.errors import FatalBackendError
from selftaught.rollout import Rollout
from selftaught.skill.aggregate import aggregate
from selftaught.skill.document import Edit
from selftaught.skill.guard import EditGuard
from selftaught.skill.reflect import Analyst, EditParseError, clip, parse_edits
from selftaught.tasks.base import Score
from tests.scripted import ScriptedModel, append, canned_analyst, edits_json, fatal, transient


def rollout(i: int, reply: str = "Answer: 3", feedback: str = "expected 4") -> Rollout:
    return Rollout(
        example_id=f"e{i}",
        messages=[{"role": "user", "content": f"question {i}"}],
        reply=reply,
        score=Score(0.0, 0.0, feedback),
    )


def test_parse_edits_shapes_and_invalid_items():
    edits, invalid = parse_edits(
        'Sure!\n```json\n{"edits": [{"op": "append", "content": "a"}, {"op": "zap"}]}\n```',
        source="failure",
    )
    assert [(e.op, e.content, e.source) for e in edits] == [("append", "a", "failure")]
    assert "unknown op" in invalid[0]["reason"]
    assert len(parse_edits('[{"op": "delete", "target": "x"}]')[0]) == 1
    assert len(parse_edits('{"op": "add", "text": "y"}')[0]) == 1
    assert parse_edits('{"edits": []}') == ([], [])
    # a weak analyst echoing the prompt's example is not an edit
    edits, invalid = parse_edits(
        '{"edits": [{"op": "append", "content": "New rule"}, '
        '{"op": "replace", "target": "text copied from the skill", "content": "x"}]}'
    )
    assert edits == [] and all("placeholder" in i["reason"] for i in invalid)
    for bad in ("no json here", '{"rules": ["x"]}', '"just a string"'):
        with pytest.raises(EditParseError):
            parse_edits(bad)


def run(coro):
    return asyncio.run(coro)


def test_invalid_json_gets_exactly_one_repair():
    model = canned_analyst(
        failure="I think you should add a rule about carrying.",
        repair=edits_json(append("- Carry the tens.")),
    )
    call = run(Analyst(model).reflect("failure", "# Skill", [rollout(1)], [], 4))
    assert call.status == "repaired" and [e.content for e in call.edits] == ["- Carry the tens."]
    assert len(model.calls) == 2 and call.raw_reply.startswith("I think")

    model = canned_analyst(failure="nope", repair="still nope")
    call = run(Analyst(model).reflect("failure", "# Skill", [rollout(1)], [], 4))
    assert call.status == "invalid_json" and call.edits == [] and len(model.calls) == 2
    assert "after repair" in call.error

    model = canned_analyst(failure="nope")
    call = run(Analyst(model, repair=False).reflect("failure", "", [rollout(1)], [], 4))
    assert call.status == "invalid_json" and len(model.calls) == 1


def test_backend_errors_transient_recorded_fatal_raised():
    model = canned_analyst(failure=edits_json(append("x")))
    model.fail_at[0] = transient()
    call = run(Analyst(model).reflect("failure", "", [rollout(1)], [], 4))
    assert call.status == "backend_error" and "503" in call.error
    model.fail_at[1] = fatal()
    with pytest.raises(FatalBackendError):
        run(Analyst(model).reflect("failure", "", [rollout(1)], [], 4))


def test_reflection_context_is_bounded():
    seen: list[str] = []

    def answer(messages):
        seen.append(messages[0]["content"])
        return '{"edits": []}'

    huge = [rollout(i, reply="9" * 50_000, feedback="f" * 10_000) for i in range(8)]
    for r in huge:
        r.messages = [{"role": "user", "content": "q" * 50_000}]
    analyst = Analyst(
        ScriptedModel(answer), max_input_chars=500, max_reply_chars=300, max_feedback_chars=100
    )
    call = run(analyst.reflect("failure", "# Skill", huge, [Edit("append", content="r" * 5000)], 4))
    assert call.status == "ok" and call.example_ids == [f"e{i}" for i in range(8)]
    assert len(seen[0]) < 8 * (500 + 300 + 100 + 200) + 4000
    assert "chars cut" in seen[0] and "Edits already tried" in seen[0]
    assert clip("abcdefghij", 5).startswith("abc") and clip("short", 10) == "short"


def test_success_prompt_differs_and_rejected_buffer_is_shown():
    prompts: list[str] = []
    model = ScriptedModel(lambda m: prompts.append(m[0]["content"]) or '{"edits": []}')
    run(Analyst(model).reflect("success", "# S", [rollout(1)], [Edit("append", content="BAD")], 2))
    assert "## Solved attempts" in prompts[0] and "BAD" in prompts[0]
    assert "at most\n2 edits" in prompts[0] or "at most 2" in prompts[0]


def test_hierarchical_merge_counts_calls_and_falls_back():
    merges: list[str] = []

    def merge(messages):
        merges.append(messages[0]["content"])
        props = messages[0]["content"].count("### Proposal")
        return edits_json(append(f"merged from {props}"))

    model = canned_analyst(merge=merge)
    patches = [[Edit("append", content=f"f{i}", source="failure")] for i in range(5)]
    agg = run(aggregate(Analyst(model), "", patches, [], merge_batch_size=2, max_edits=4))
    # level 1: (2, 2, 1) -> 2 calls; level 2: 3 patches -> (2, 1) -> 1 call; level 3: 1 call
    assert len(merges) == 4 and [e.content for e in agg.edits] == ["merged from 2"]

    succ = [[Edit("append", content="s1", source="success")]]
    agg = run(
        aggregate(
            Analyst(canned_analyst(merge="garbage", repair="garbage")),
            "",
            [[Edit("append", content="f1")], [Edit("append", content="f1")]],
            succ,
            merge_batch_size=8,
            max_edits=4,
        )
    )
    # failure merge falls back (dedupe: f1 with support 2), final merge falls back too
    assert agg.fallbacks == 2 and [e.content for e in agg.edits] == ["f1", "s1"]
    assert agg.edits[0].support == 2 and all(c.status == "invalid_json" for c in agg.calls)


def test_deterministic_merge_makes_no_call():
    patches = [[Edit("append", content="a")], [Edit("append", content="b")]]
    agg = run(aggregate(None, "", patches, [[Edit("append", content="a")]], merge_batch_size=2))
    assert agg.calls == [] and [e.content for e in agg.edits] == ["a", "b"]
    assert json.dumps(agg.edits[0].to_dict())


def test_the_guard_refuses_copied_questions_in_reflection():
    question = "Calculate ( -38 * -13 - 69 ) + ( -1 * 6 ) + -1."
    r = Rollout(
        example_id="e1",
        messages=[{"role": "user", "content": f"{question}\n\nGive the final answer only."}],
        reply="-100",
        score=Score(0.0, 0.0, "expected 419"),
    )
    model = canned_analyst(
        failure=edits_json(
            append("Calculate ( -38 * -13 - 69 ) + ( -1 * 6 ) + -1"),
            append("- Multiply before adding; then add the terms left to right."),
        )
    )
    analyst = Analyst(model)
    analyst.guard = EditGuard(analyst.templates(), [question])
    call = run(analyst.reflect("failure", "", [r], [], 4))
    assert [e.content for e in call.edits] == [
        "- Multiply before adding; then add the terms left to right."
    ]
    assert "an example's numbers" in call.refused[0]["reason"]


# What a run on the peer set-up shipped (issue: skill quality), and legitimate rules.
TEMPLATES = Analyst(canned_analyst()).templates()
INPUTS = [
    "Calculate ( | -38 * -13 - 69 | ) + 12.",
    "What is 4523 - 17?",
    "Tom has 3 apples and buys 5 more bags with 12 apples each. How many apples does he have?",
]


@pytest.mark.parametrize(
    "content",
    [
        "Calculate ( | -38 * -13 - 69 | )",  # a mangled train question (signs lost)
        "Calculate ( 38 * 13 - 69 )",
        "To improve the SKILL: the instructions an AI assistant reads before it solves tasks "
        "of one kind.",  # the analyst's own prompt echoed back
        "Find the general mistakes behind these failures and propose edits",
        "Reply with JSON only, in this form",
        "Tom has apples and buys more bags with apples each; how many apples does he have",
        "Remember that 4523 - 17 = 4506.",
    ],
)
def test_guard_refuses_echoes_and_example_content(content):
    guard = EditGuard(TEMPLATES, INPUTS)
    assert guard.check(Edit("append", content=content)) is not None


@pytest.mark.parametrize(
    "content",
    [
        "Multiply and divide before you add and subtract.",
        "Give the final answer as a single integer on the last line: 'Answer: N'.",
        "Compute inside absolute-value bars first, then drop the sign.",
        "Check the sign of each product: two negatives make a positive.",
        "Round to 2 decimal places only when the question asks for it.",
        "For word problems, list each quantity before combining them.",
        "Example: 2 + 3 * 4 = 14, because multiplication comes first.",
    ],
)
def test_guard_keeps_general_rules(content):
    guard = EditGuard(TEMPLATES, INPUTS)
    assert guard.check(Edit("append", content=content)) is None


def test_refused_edits_reach_the_report_and_the_rejected_buffer(tmp_path):
    from selftaught.skill import SkillOptConfig, SkillTrainer
    from tests.scripted import ToyTask, rule_target

    task = ToyTask()
    copied = task.examples("val")[0].prompt_text().split("\n")[0]
    analyst = canned_analyst(failure=edits_json(append(copied), append("rule alpha")))
    trainer = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8),
        task,
        rule_target(),
        analyst,
        output_dir=tmp_path,
        progress=False,
    )
    trainer.train()
    row = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[1])
    assert row["edits"]["refused"] == 1 and row["edits"]["applied"] == 1
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    refused = diag["analyst_calls"][0]["refused_edits"]
    assert refused[0]["edit"]["content"] == copied and "example" in refused[0]["reason"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["rejected"][0]["rationale"].startswith("refused: ")
    assert copied not in (tmp_path / "best_skill.md").read_text()


def test_preferences_reach_every_reflection_and_merge_prompt():
    prompts: list[str] = []
    model = ScriptedModel(lambda m: prompts.append(m[0]["content"]) or '{"edits": []}')
    rules = "Answers end with the unit."
    analyst = Analyst(model, preferences=rules, document="memory")
    run(analyst.reflect("failure", "# M", [rollout(1)], [], 2))
    run(analyst.reflect("success", "# M", [rollout(2)], [], 2))
    run(analyst.reflect_contrast("# M", [(rollout(3), rollout(4))], [], 2))
    run(analyst.merge("# M", [[Edit("append", content="a")], [Edit("append", content="b")]], 2))
    assert len(prompts) == 4
    for prompt in prompts:
        assert "## The user's house rules" in prompt and rules in prompt
        assert "the memory must never contradict them" in prompt and "{{" not in prompt
    plain: list[str] = []
    bare = Analyst(ScriptedModel(lambda m: plain.append(m[0]["content"]) or '{"edits": []}'))
    run(bare.reflect("failure", "# S", [rollout(1)], [], 2))
    assert "house rules" not in plain[0] and "{{" not in plain[0]
