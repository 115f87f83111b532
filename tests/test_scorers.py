from __future__ import annotations

import pytest

from selftaught.errors import ConfigError
from selftaught.models.base import Completion, GenerationParams, Message
from selftaught.models.errors import BackendError
from selftaught.tasks.base import Example, TaskError
from selftaught.tasks.scorers import (
    SCORER_NAMES,
    LlmJudge,
    contains,
    exact,
    get_scorer,
    json_match,
    normalize_text,
    normalized,
    numeric,
    parse_judge_reply,
    parse_number,
    regex,
)


def ex(reference, **state) -> Example:
    return Example(id="e1", input="What is it?", reference=reference, state=state)


def test_exact_uses_final_answer_marker_and_explains_misses():
    assert exact("Let me think... Final answer: Paris", ex("Paris")).hard == 1
    miss = exact("Final answer: paris", ex("Paris"))
    assert miss.hard == 0 and miss.soft == 0
    assert "expected 'Paris', got 'paris'" in miss.feedback


def test_normalized_ignores_case_punctuation_articles_and_gives_token_f1():
    assert normalize_text("  The  Eiffel-Tower!! ") == "eiffel tower"
    assert normalized("<answer>the Eiffel Tower.</answer>", ex("Eiffel tower")).hard == 1
    partial = normalized("Answer: Eiffel", ex("Eiffel Tower"))
    assert partial.hard == 0
    assert partial.soft == pytest.approx(2 / 3)  # precision 1, recall 1/2
    assert "expected 'Eiffel Tower'" in partial.feedback


def test_reference_list_means_any_of():
    assert normalized("Answer: NYC", ex(["New York", "NYC"])).hard == 1
    assert "one of" in exact("Answer: LA", ex(["New York", "NYC"])).feedback


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", 1234.0),
        ("3/4", 0.75),
        ("$5", 5.0),
        ("it costs -$2.50 now", -2.5),
        ("first 3 then 7", 7.0),
        ("1.5e3", 1500.0),
        (".5", 0.5),
        ("no digits", None),
        (42, 42.0),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_numeric_tolerance_and_feedback():
    assert numeric("so the total is $1,234.", ex("1234")).hard == 1
    assert numeric("Answer: 3/4", ex(0.75)).hard == 1
    assert numeric("Answer: 0.3333333334", ex("1/3")).hard == 1  # within rel 1e-6
    assert numeric("Answer: 0.3334", ex("1/3")).hard == 0
    miss = numeric("Final answer: 41", ex(42))
    assert miss.hard == 0 and miss.feedback == "expected 42, got 41"
    none = numeric("I don't know", ex(42))
    assert none.hard == 0 and "no number" in none.feedback


def test_numeric_falls_back_to_reply_when_marker_has_no_number():
    assert numeric("6 times 7 is 42. Final answer: forty-two (42)", ex(42)).hard == 1
    assert numeric("The result: 42 apples but **answer: see above**", ex(42)).hard == 1


def test_contains_requires_whole_words():
    assert contains("The capital of France is Paris, of course.", ex("paris")).hard == 1
    assert contains("Answer: 14", ex("4")).hard == 0
    # with a marker, only the marked answer counts
    assert contains("Paris? No. Final answer: Lyon", ex("Paris")).hard == 0


def test_regex_fullmatches_extracted_answer():
    assert regex("Answer: 2024-01-05.", ex(r"\d{4}-\d{2}-\d{2}")).hard == 1
    # fullmatch, not search: an answer listing extra text does not pass
    assert regex("Answer: yes or no", ex("yes")).hard == 0
    assert regex("Answer: yes or no", ex(".*yes.*")).hard == 1
    with pytest.raises(TaskError, match="bad regex"):
        regex("Answer: x", ex("(unclosed"))


def test_json_match_soft_is_share_of_matching_keys():
    ref = {"a": 1, "b": [1, 2], "c": "x"}
    assert json_match('```json\n{"a": 1, "b": [1, 2], "c": "x"}\n```', ex(ref)).hard == 1
    partial = json_match('Sure: {"a": 1, "b": [2], "d": 0}', ex(ref))
    assert partial.hard == 0
    assert partial.soft == pytest.approx(1 / 4)  # a matches; b wrong, c missing, d unexpected
    assert "wrong: b" in partial.feedback and "missing: c" in partial.feedback
    assert "unexpected: d" in partial.feedback
    bad = json_match("a: 1, b: 2", ex(ref))
    assert bad.hard == 0 and bad.soft == 0 and "invalid JSON" in bad.feedback
    # a reference given as a JSON string is parsed
    assert json_match('{"k": true}', ex('{"k": true}')).hard == 1


def test_missing_reference_is_a_task_error_not_a_zero():
    with pytest.raises(TaskError, match="no reference"):
        exact("Answer: x", ex(None))


def test_get_scorer_names_and_errors():
    assert get_scorer("numeric") is numeric
    with pytest.raises(ValueError, match="valid scorers: .*normalized.*llm_judge"):
        get_scorer("fuzzy")
    with pytest.raises(ValueError, match="judge model"):
        get_scorer("llm_judge")
    assert set(SCORER_NAMES) >= {"exact", "normalized", "numeric", "contains", "regex"}


class ScriptedJudge:
    """A judge model that replies from a script and records what it was asked."""

    name = "scripted-judge"

    def __init__(self, *replies: str | Exception):
        self.replies = list(replies)
        self.calls: list[list[Message]] = []

    async def achat(self, messages, params):  # pragma: no cover - protocol completeness
        return self.chat(messages, params)

    def chat(self, messages: list[Message], params: GenerationParams) -> Completion:
        self.calls.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return Completion(text=reply)


def test_parse_judge_reply_variants():
    assert parse_judge_reply('{"score": 8, "reason": "good"}') == (8.0, "good")
    assert parse_judge_reply('```json\n{"score": "7", "reason": "ok"}\n```') == (7.0, "ok")
    assert parse_judge_reply('{"score": 9, "reason": "fine",}') == (9.0, "fine")  # bad JSON
    assert parse_judge_reply('{"score": 11}') is None
    assert parse_judge_reply("I think it is decent.") is None


def test_llm_judge_scores_and_sends_rubric_question_reference():
    judge = ScriptedJudge('{"score": 8, "reason": "correct but terse"}')
    scorer = get_scorer("llm_judge", judge_model=judge, rubric="Must name the city.")
    score = scorer("It's Paris.", ex("Paris"))
    assert (score.hard, score.soft) == (1.0, 0.8)
    assert "correct but terse" in score.feedback
    prompt = judge.calls[0][0]["content"]
    assert "Must name the city." in prompt and "What is it?" in prompt
    assert "It's Paris." in prompt and "Paris" in prompt and "{{" not in prompt


def test_llm_judge_takes_its_own_prompt_template(tmp_path):
    judge = ScriptedJudge('{"reason": "same city", "score": 10}')
    template = tmp_path / "short.md"
    template.write_text("Reference: {{reference}}\nReply: {{reply}}\n{{rubric}}\nJSON please.")
    score = LlmJudge(judge, "Same city?", template=template)("Paris!", ex("Paris"))
    assert score.hard == 1.0
    sent = judge.calls[0][0]["content"]
    assert sent == "Reference: Paris\nReply: Paris!\nSame city?\nJSON please."
    with pytest.raises(ConfigError, match="must hold"):
        LlmJudge(judge, template="Grade the answer to {{question}}.")


def test_llm_judge_threshold_and_per_example_rubric():
    judge = ScriptedJudge('{"score": 6, "reason": "partly"}')
    scorer = LlmJudge(judge, "default rubric")
    score = scorer("meh", ex(None, rubric="Special rubric"))
    assert (score.hard, score.soft) == (0.0, 0.6)
    assert "Special rubric" in judge.calls[0][0]["content"]


def test_llm_judge_repairs_once_then_raises_backend_error():
    judge = ScriptedJudge("Looks fine to me!", '{"score": 10, "reason": "perfect"}')
    assert LlmJudge(judge)("x", ex("x")).hard == 1
    assert len(judge.calls) == 2 and judge.calls[1][-2]["content"] == "Looks fine to me!"

    broken = ScriptedJudge("no idea", "still no idea")
    with pytest.raises(BackendError, match="no readable score"):
        LlmJudge(broken)("x", ex("x"))


def test_llm_judge_backend_failure_is_raised_never_scored_zero():
    judge = ScriptedJudge(RuntimeError("connection reset"))
    with pytest.raises(BackendError, match="connection reset"):
        LlmJudge(judge)("x", ex("x"))


def test_quantity_is_a_scorer_and_a_reference_picks_its_own():
    from selftaught.errors import ConfigError
    from selftaught.tasks.scorers import get_scorer, reference_scorer, score_reference

    ex = Example("q", "How far?", reference="7 km")
    assert get_scorer("quantity")("It is 7 km", ex).hard == 1.0
    assert get_scorer("quantity")("It is 7", ex).soft == 0.5
    assert [reference_scorer(r) for r in ("42", "7 km", "Paris")] == [
        "numeric",
        "quantity",
        "normalized",
    ]
    assert score_reference("Answer: 8 km", ex, "quantity").hard == 0.0
    with pytest.raises(ConfigError, match="unknown reference scorer 'exact'"):
        score_reference("x", ex, "exact")
