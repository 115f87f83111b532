from __future__ import annotations

import json

import pytest

from selftaught.errors import ConfigError, InputError
from selftaught.models.base import Completion, GenerationParams, Message
from selftaught.models.errors import BackendError
from selftaught.tasks.base import Example, TaskError
from selftaught.tasks.scorers import (
    SAMPLE_TEMPERATURE,
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

    long = "still no idea, " * 20 + "the end"
    broken = ScriptedJudge("no idea", long)
    with pytest.raises(BackendError, match="no readable score") as caught:
        LlmJudge(broken)("x", ex("x"))
    # the message shows the reply's start; the whole last reply travels with the error
    assert "the end" not in str(caught.value) and caught.value.reply == long


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


# --- judge variants (issue 52): k samples, reference-guided, pairwise -------------------------


def _score(value: float) -> str:
    return json.dumps({"score": value, "reason": f"gave {value}"})


def test_llm_judge_k_samples_take_the_median_at_a_sampling_temperature():
    judge = ScriptedJudge(_score(9), _score(2), _score(8), _score(3), _score(7))
    scorer = LlmJudge(judge, "rubric", samples=5)
    score = scorer("reply", ex("ref"))
    assert len(judge.calls) == 5 and scorer.params.temperature == SAMPLE_TEMPERATURE
    assert (score.hard, score.soft) == (1.0, 0.7)  # median of 9, 2, 8, 3, 7; a mean says 5.8
    assert score.feedback.startswith("judge scores 9, 2, 8, 3, 7 (median 7/10): gave 7")
    low = LlmJudge(ScriptedJudge(_score(9), _score(2), _score(1)), samples=3)("r", ex("ref"))
    assert low.hard == 0.0 and "median 2/10" in low.feedback  # one 9 does not carry it
    assert LlmJudge(judge).params.temperature == 0.0  # the default: one greedy call
    with pytest.raises(ConfigError, match="copies of one verdict"):
        LlmJudge(judge, samples=3, temperature=0.0)
    with pytest.raises(ConfigError, match="samples must be an integer >= 1"):
        LlmJudge(judge, samples=0)


def test_llm_judge_k_samples_one_failed_call_is_an_error_never_a_median():
    judge = ScriptedJudge(_score(9), RuntimeError("connection reset"), _score(9))
    with pytest.raises(BackendError, match="connection reset"):
        LlmJudge(judge, samples=3)("reply", ex("ref"))
    unreadable = ScriptedJudge(_score(9), "no idea", "still no idea", _score(9))
    with pytest.raises(BackendError, match="no readable score"):
        LlmJudge(unreadable, samples=3)("reply", ex("ref"))


def test_llm_judge_reference_mode_shows_the_reference_first_and_needs_one():
    judge = ScriptedJudge(_score(10))
    scorer = LlmJudge(judge, "Same place?", mode="reference")
    assert scorer("the green box", ex("green_box")).hard == 1.0
    prompt = judge.calls[0][0]["content"]
    assert prompt.index("green_box") < prompt.index("What is it?") < prompt.index("the green box")
    assert "same answer as the reference" in prompt and "{{" not in prompt
    with pytest.raises(TaskError, match="no reference; the reference-guided judge"):
        scorer("x", ex(None))
    assert len(judge.calls) == 1  # refused before any judge call


def test_a_jsonl_task_with_the_reference_judge_refuses_a_line_without_reference(tmp_path):
    from selftaught.tasks.jsonl import JsonlTask

    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "input": "Q?", "reference": "R"}\n{"id": "b", "input": "Q2?"}\n')
    judge = ScriptedJudge()
    assert JsonlTask(path, "llm_judge", judge_model=judge).scorer_name == "llm_judge"
    with pytest.raises(TaskError, match=r"t.jsonl:2: missing `reference` \(the reference-guided"):
        JsonlTask(path, "llm_judge", judge_model=judge, judge_options={"mode": "reference"})


def _position_biased(label: str):
    """A pairwise judge that always prefers the reply in position `label`."""
    return lambda n: [json.dumps({"reason": "first is better", "better": label})] * n


def test_llm_judge_pairwise_draws_the_order_and_a_position_bias_cancels():
    examples = [Example(id=f"e{i}", input="Q?", reference="R") for i in range(40)]
    baseline = {e.id: "BASE" for e in examples}
    judge = ScriptedJudge(*_position_biased("A")(40))
    scorer = LlmJudge(judge, mode="pairwise", baseline=baseline, seed=3)
    firsts = [scorer.reply_first(e, 0) for e in examples]
    assert 10 < sum(firsts) < 30  # both orders drawn
    assert firsts == [LlmJudge(judge, mode="pairwise", baseline=baseline, seed=3)
                      .reply_first(e, 0) for e in examples]  # fmt: skip  # seeded
    assert firsts != [LlmJudge(judge, mode="pairwise", baseline=baseline, seed=4)
                      .reply_first(e, 0) for e in examples]  # fmt: skip
    wins = [scorer("MINE", e).hard for e in examples]
    for e, first, sent in zip(examples, firsts, judge.calls, strict=True):
        text = sent[0]["content"]
        reply_at, base_at = text.index("MINE"), text.index("BASE")
        assert (reply_at < base_at) == first, e.id  # A is the reply exactly when drawn first
    assert wins == [1.0 if f else 0.0 for f in firsts]  # an A-sayer wins only where A is it
    # the pair judged both ways round (x against y, then y against x) sees both orders, so a
    # position-biased judge crowns both or neither: it never decides the pair for one side
    flipped = LlmJudge(ScriptedJudge(*_position_biased("A")(40)), mode="pairwise",
                       baseline={e.id: "MINE" for e in examples}, seed=3)  # fmt: skip
    base_wins = [flipped("BASE", e).hard for e in examples]
    assert base_wins == wins


def test_llm_judge_pairwise_verdicts_ties_and_k_samples():
    e = Example(id="e1", input="Q?", reference="R")
    scorer = LlmJudge(ScriptedJudge(), mode="pairwise", baseline=lambda _id: "BASE")
    mine = "A" if scorer.reply_first(e, 0) else "B"
    other = "B" if mine == "A" else "A"
    verdict = json.dumps({"reason": "r", "better": mine})
    scorer.judge_model = ScriptedJudge(verdict)
    win = scorer("MINE", e)
    assert (win.hard, win.soft) == (1.0, 1.0) and "win (median 10/10: a win)" in win.feedback
    scorer.judge_model = ScriptedJudge('{"better": "tie", "reason": "same"}')
    assert (scorer("MINE", e).hard, scorer.judge_model.calls != []) == (0.0, True)
    scorer.judge_model = ScriptedJudge(f'{{"reason": "r", "better": "{other}"}}')
    assert scorer("MINE", e).soft == 0.0
    three = LlmJudge(ScriptedJudge(), mode="pairwise", baseline={"e1": "BASE"}, samples=3)
    labels = ["A" if three.reply_first(e, i) else "B" for i in range(3)]
    three.judge_model = ScriptedJudge(
        *(json.dumps({"reason": "r", "better": lab}) for lab in labels[:2]), '{"better": "tie"}'
    )
    score = three("MINE", e)  # win, win, tie: the median a win
    assert score.hard == 1.0 and "win, win, tie" in score.feedback


def test_llm_judge_pairwise_without_a_baseline_is_refused():
    with pytest.raises(ConfigError, match="pairwise' needs a baseline reply"):
        LlmJudge(ScriptedJudge(), mode="pairwise")
    with pytest.raises(ConfigError, match="unknown llm_judge mode"):
        LlmJudge(ScriptedJudge(), mode="ranked")
    scorer = LlmJudge(ScriptedJudge(), mode="pairwise", baseline={"other": "BASE"})
    with pytest.raises(TaskError, match="'e1' has no baseline reply"):
        scorer("MINE", ex("R"))
    with pytest.raises(ConfigError, match="must hold \\{\\{reply_a\\}\\} and \\{\\{reply_b\\}\\}"):
        LlmJudge(ScriptedJudge(), mode="pairwise", baseline={}, template="{{reply}}")


def test_judge_variants_are_task_options(tmp_path):
    from selftaught.tasks import load_task

    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "input": "Q?", "reference": "R", "split": "val"}\n')
    baselines = tmp_path / "base.jsonl"
    baselines.write_text('{"id": "a", "reply": "BASE"}\n')
    judge = ScriptedJudge()
    task = load_task(str(path), scorer="llm_judge", judge_samples=3, judge_mode="pairwise",
                     judge_baselines=baselines, seed=5, judge=judge)  # fmt: skip
    scorer = task.default_scorer
    assert (scorer.samples, scorer.mode, scorer.seed) == (3, "pairwise", 5)
    assert scorer.baseline == {"a": "BASE"}
    with pytest.raises(ConfigError, match="judge_mode must be one of"):
        load_task(str(path), scorer="llm_judge", judge_mode="ranked", judge=judge)
    with pytest.raises(InputError, match="pairwise' needs a baseline"):
        load_task(str(path), scorer="llm_judge", judge_mode="pairwise", judge=judge)
    with pytest.raises(ConfigError, match="cannot honour --judge-samples"):
        load_task("gym:basic_arithmetic", judge_samples=3)
