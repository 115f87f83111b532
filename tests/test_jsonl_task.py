from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.models.base import Completion
from selftaught.tasks.base import SPLITS, Task, TaskError, check_disjoint
from selftaught.tasks.jsonl import JsonlTask, hash_split


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def qa_rows(n: int) -> list[dict]:
    return [
        {"id": f"q{i}", "input": f"What is {i} + 1?", "reference": str(i + 1)} for i in range(n)
    ]


def test_loads_examples_with_state_and_satisfies_protocol(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {
                "id": "a",
                "input": "Capital of France?",
                "reference": "Paris",
                "split": "train",
                "topic": "geo",
            },
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "2+2?"},
                ],
                "reference": "4",
                "split": "val",
                "scorer": "numeric",
            },
        ],
    )
    task = JsonlTask(path)
    assert isinstance(task, Task)
    assert task.name == "qa" and task.kind == "agent" and task.instructions == ""
    (train,) = task.examples("train")
    assert train.id == "a" and train.state == {"topic": "geo"} and train.reference == "Paris"
    (val,) = task.examples("val")
    assert val.id == "2"  # default id: the line number
    assert val.prompt_text() == "2+2?"
    assert task.examples("test") == []
    # the task default scorer is normalized; line 2 overrides it with numeric
    assert task.score("Answer: the paris", train).hard == 1
    assert task.score("I get 4.0", val).hard == 1
    assert task.score("Answer: four", val).hard == 0


def test_hash_splits_are_deterministic_sized_and_seeded(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(500))
    first = JsonlTask(path, seed=3)
    again = JsonlTask(path, seed=3)
    ids = {s: [e.id for e in first.examples(s)] for s in SPLITS}
    assert ids == {s: [e.id for e in again.examples(s)] for s in SPLITS}
    assert 60 <= len(ids["val"]) <= 140 and 60 <= len(ids["test"]) <= 140
    assert sum(len(v) for v in ids.values()) == 500
    check_disjoint(first)
    other = JsonlTask(path, seed=4)
    assert [e.id for e in other.examples("val")] != ids["val"]
    # adding lines does not move existing ones
    bigger = JsonlTask(write_jsonl(tmp_path / "more.jsonl", qa_rows(600)), seed=3)
    assert set(ids["val"]) <= {e.id for e in bigger.examples("val")}
    assert hash_split("q1", 3, 0.2, 0.2) in SPLITS


def test_repeated_input_follows_first_split(tmp_path):
    rows = qa_rows(40) + [
        {"id": f"dup{i}", "input": "What is 0 + 1?", "reference": "1"} for i in range(20)
    ]
    task = JsonlTask(write_jsonl(tmp_path / "d.jsonl", rows))
    check_disjoint(task)  # would raise if the repeats were spread over splits
    where = {s for s in SPLITS for e in task.examples(s) if e.prompt_text() == "What is 0 + 1?"}
    assert len(where) == 1


def test_explicit_split_conflicting_with_repeat_is_refused(tmp_path):
    rows = [
        {"id": "a", "input": "same", "reference": "x", "split": "train"},
        {"id": "b", "input": "same", "reference": "x", "split": "test"},
    ]
    with pytest.raises(TaskError, match=r"d\.jsonl:2: .*line 1 has the same input"):
        JsonlTask(write_jsonl(tmp_path / "d.jsonl", rows))


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "x", "input": "hi"', "malformed JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"id": "x", "reference": "1"}', "missing `input`"),
        ('{"id": "x", "input": "hi", "reference": "1", "split": "dev"}', "`split` must be one of"),
        ('{"id": "q0", "input": "hi", "reference": "1"}', "duplicate id 'q0'"),
        ('{"id": "x", "input": "hi"}', "missing `reference`"),
        ('{"id": "x", "input": "hi", "reference": "1", "scorer": "fuzzy"}', "unknown scorer"),
        (
            '{"id": "x", "messages": [{"role": "bot", "content": "hi"}], "reference": "1"}',
            "needs a `role`",
        ),
        ('{"id": "x", "input": "hi", "reference": "(", "scorer": "regex"}', "bad regex"),
        ('{"id": "x", "input": "hi", "reference": "1", "scorer": "llm_judge"}', "judge model"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(qa_rows(1)[0]) + "\n\n" + bad_line + "\n")
    with pytest.raises(TaskError, match=message) as info:
        JsonlTask(path)
    assert f"{path}:3" in str(info.value)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(TaskError, match="no examples"):
        JsonlTask(empty)
    with pytest.raises(TaskError, match="no such JSONL file"):
        JsonlTask(tmp_path / "absent.jsonl")


def test_bad_construction_arguments(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(TaskError, match="unknown scorer 'nope'"):
        JsonlTask(path, scorer="nope")
    with pytest.raises(TaskError, match="leave room"):
        JsonlTask(path, val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(TaskError, match="unknown split"):
        JsonlTask(path).examples("dev")  # type: ignore[arg-type]


def test_llm_judge_lines_need_no_reference(tmp_path):
    class Judge:
        name = "judge"

        def chat(self, messages, params):
            return Completion(text='{"score": 9, "reason": "clear and kind"}')

        async def achat(self, messages, params):  # pragma: no cover
            return self.chat(messages, params)

    path = write_jsonl(
        tmp_path / "j.jsonl",
        [{"input": "Write a haiku", "split": "train", "rubric": "5-7-5 syllables"}],
    )
    task = JsonlTask(path, scorer="llm_judge", judge_model=Judge(), instructions="Be poetic.")
    (example,) = task.examples("train")
    score = task.score("an old silent pond", example)
    assert score.hard == 1 and score.soft == 0.9 and "clear and kind" in score.feedback
    assert task.instructions == "Be poetic."


def test_openai_chat_and_evals_formats(tmp_path):
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {  # OpenAI chat (fine-tuning) format: the final assistant turn is the reference
                "messages": [
                    {"role": "system", "content": "Answer with a number."},
                    {"role": "user", "content": "3 + 4?"},
                    {"role": "assistant", "content": "7"},
                ],
                "split": "train",
            },
            {  # OpenAI evals format: `input` is a chat list, `ideal` a string
                "input": [
                    {"role": "system", "content": "Answer with a number."},
                    {"role": "user", "content": "5 + 5?"},
                ],
                "ideal": "10",
                "split": "val",
            },
            {  # `ideal` as a list of acceptable answers
                "input": [{"role": "user", "content": "Capital of France?"}],
                "ideal": ["Paris", "paris, france"],
                "split": "test",
            },
            {  # a given reference wins over the final assistant turn, which is still dropped
                "messages": [
                    {"role": "user", "content": "2 + 2?"},
                    {"role": "assistant", "content": "5"},
                ],
                "reference": "4",
                "split": "test",
            },
        ],
    )
    task = JsonlTask(path)
    (chat,) = task.examples("train")
    assert chat.reference == "7" and [m["role"] for m in chat.input] == ["system", "user"]
    (evals,) = task.examples("val")
    assert evals.reference == "10" and evals.input[-1]["content"] == "5 + 5?"
    assert "ideal" not in evals.state
    listed, given = task.examples("test")
    assert listed.reference == ["Paris", "paris, france"]
    assert task.score("Paris", listed).hard == 1
    assert given.reference == "4" and [m["role"] for m in given.input] == ["user"]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"input": [], "ideal": "1"}', "`input` must be a non-empty list"),
        (
            '{"input": [{"role": "user", "content": 5}], "ideal": "1"}',
            "input\\[0\\] needs a string",
        ),
        ('{"input": 7, "ideal": "1"}', "`input` must be a non-empty string or a chat list"),
        ('{"messages": "hi", "reference": "1"}', "`messages` must be a non-empty list"),
        ('{"input": "hi", "ideal": "1", "reference": "1"}', "either `reference` or `ideal`"),
        ('{"messages": [{"role": "assistant", "content": "1"}]}', "no user message"),
    ],
)
def test_bad_chat_and_evals_lines_name_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(qa_rows(1)[0]) + "\n" + bad_line + "\n")
    with pytest.raises(TaskError, match=message) as info:
        JsonlTask(path)
    assert f"{path}:2" in str(info.value)
