from __future__ import annotations

import textwrap
import time

import pytest

from selftaught.tasks.base import SPLITS, Task, TaskError, check_disjoint
from selftaught.tasks.humaneval import HumanEvalTask, build_program, extract_code, load_problems
from selftaught.tasks.sandbox import run_python, summarize_traceback


@pytest.fixture(scope="module")
def task() -> HumanEvalTask:
    return HumanEvalTask(seed=0, timeout_s=3.0)


@pytest.fixture(scope="module")
def problems() -> dict:
    return load_problems()


def example(task: HumanEvalTask, task_id: str):
    return next(e for s in SPLITS for e in task.examples(s) if e.id == task_id)


def test_splits_are_disjoint_sized_and_seeded(task):
    assert isinstance(task, Task)
    sizes = {s: len(task.examples(s)) for s in SPLITS}
    assert sizes == {"train": 68, "val": 32, "test": 64}
    ids = [e.id for s in SPLITS for e in task.examples(s)]
    assert len(set(ids)) == 164
    check_disjoint(task)
    same = HumanEvalTask(seed=0)
    assert [e.id for e in same.examples("val")] == [e.id for e in task.examples("val")]
    other = HumanEvalTask(seed=1)
    assert [e.id for e in other.examples("val")] != [e.id for e in task.examples("val")]
    with pytest.raises(TaskError, match="leave training"):
        HumanEvalTask(val_size=100, test_size=64)


def test_prompt_asks_for_a_python_block(task):
    ex = example(task, "HumanEval/0")
    assert "def has_close_elements" in ex.input and "```python" in ex.input
    assert "```python" in task.instructions


@pytest.mark.parametrize(
    "task_id", ["HumanEval/0", "HumanEval/10", "HumanEval/38", "HumanEval/162"]
)
def test_canonical_solutions_pass_as_block_and_as_body(task, problems, task_id):
    problem = problems[task_id]
    ex = example(task, task_id)
    fenced = f"Here it is:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\nDone."
    score = task.score(fenced, ex)
    assert (score.hard, score.soft) == (1.0, 1.0), score.feedback
    assert task.score(problem["canonical_solution"], ex).hard == 1  # body continuing the prompt
    assert task.score(textwrap.dedent(problem["canonical_solution"]), ex).hard == 1


def test_wrong_solution_fails_with_the_failing_assertion(task):
    ex = example(task, "HumanEval/0")
    reply = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    score = task.score(reply, ex)
    assert (score.hard, score.soft) == (0.0, 0.0)
    assert "AssertionError" in score.feedback and "assert candidate(" in score.feedback


def test_exception_and_syntax_error_and_empty_reply(task):
    ex = example(task, "HumanEval/0")
    raising = task.score("```python\ndef has_close_elements(n, t):\n    return n[99]\n```", ex)
    assert raising.hard == 0 and "IndexError" in raising.feedback
    broken = task.score("```python\ndef has_close_elements(n, t)\n    return\n```", ex)
    assert broken.hard == 0 and "does not compile" in broken.feedback
    assert task.score("", ex).feedback == "no code in the reply"


def test_infinite_loop_times_out():
    fast = HumanEvalTask(timeout_s=1.0)
    ex = example(fast, "HumanEval/0")
    score = fast.score("```python\ndef has_close_elements(n, t):\n    while True: pass\n```", ex)
    assert score.hard == 0 and score.feedback == "tests failed: timed out after 1s"


def test_sandbox_memory_hog_is_stopped():
    result = run_python("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')", 5.0, 256)
    assert not result.passed and result.memory_exceeded
    assert "allocated" not in result.stdout_tail
    assert "out of memory" in result.summary()


def test_sandbox_reports_output_and_hides_environment(monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_SECRET_FOR_TEST", "hunter2")
    result = run_python("import os\nprint(os.environ.get('SELFTAUGHT_SECRET_FOR_TEST'))")
    assert result.passed and result.returncode == 0 and result.stdout_tail == "None\n"
    failing = run_python("raise SystemExit(3)")
    assert not failing.passed and failing.returncode == 3 and not failing.timed_out


def test_sandbox_kills_the_whole_process_group_on_timeout(tmp_path):
    marker = tmp_path / "grandchild-survived"
    grandchild = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w').write('alive')"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        "while 1: pass\n"
    )
    result = run_python(code, timeout_s=0.5, allow_subprocesses=True)
    assert result.timed_out and not result.passed
    time.sleep(2.0)
    assert not marker.exists()


def test_extract_code_picks_the_block_defining_the_entry_point():
    reply = (
        "```text\nnotes\n```\n```python\ndef helper():\n    pass\n```\n"
        "```python\ndef f(x):\n    return x\n```"
    )
    assert extract_code(reply, "f") == "def f(x):\n    return x"
    assert extract_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"
    assert extract_code("    return x\n", "f") == "    return x"


def test_build_program_accepts_prose_before_unfenced_code_and_drops_main_guard():
    prompt = 'def f(x):\n    """Double x."""\n'
    program = build_program(prompt, "Sure, here:\ndef f(x):\n    return 2 * x\n", "f")
    assert program is not None and program.rstrip().endswith("return 2 * x")
    guarded = "def f(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    f(1 / 0)\n"
    assert "__main__" not in build_program(prompt, guarded, "f")
    assert build_program(prompt, "return (", "f") is None


def test_summarize_traceback():
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/tmp/x/solution.py", line 9, in check\n'
        "    assert candidate(1) == 2\n"
        "           ^^^^^^^^^^^^^^^^^\n"
        "AssertionError\n"
    )
    assert summarize_traceback(stderr) == "AssertionError at `assert candidate(1) == 2`"
    assert summarize_traceback("") == ""
