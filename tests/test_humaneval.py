from __future__ import annotations

import json
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.tasks import load_task
from selftaught.tasks.base import SPLITS, Task, TaskError, check_disjoint
from selftaught.tasks.humaneval import (
    MAX_FEEDBACK_CHARS,
    HumanEvalTask,
    build_program,
    extract_code,
    load_problems,
)
from selftaught.tasks.sandbox import (
    BWRAP_ENV,
    Sandbox,
    SandboxError,
    find_bwrap,
    run_python,
    summarize_traceback,
)
from tests.fault_server import FaultServer

# The scoring logic is tested in whatever mode this machine has (the code run here is ours);
# tests/test_sandbox.py tests the isolation itself.
UNSAFE_IF_NO_BWRAP = find_bwrap() is None


@pytest.fixture(scope="module")
def task() -> HumanEvalTask:
    return HumanEvalTask(seed=0, timeout_s=3.0, unsafe_exec=UNSAFE_IF_NO_BWRAP)


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
    same = HumanEvalTask(seed=0, unsafe_exec=UNSAFE_IF_NO_BWRAP)
    assert [e.id for e in same.examples("val")] == [e.id for e in task.examples("val")]
    other = HumanEvalTask(seed=1, unsafe_exec=UNSAFE_IF_NO_BWRAP)
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


# Replies that make the interpreter exit with status 0 before HumanEval's tests finish: each
# scored 1.0 when a pass was read off the exit status.
REWARD_HACKS = {
    "system_exit_in_the_tested_function": (
        "def has_close_elements(numbers, threshold):\n    raise SystemExit(0)\n",
        "SystemExit(0)",
    ),
    "sys_exit_during_check": (
        "import sys\ndef has_close_elements(numbers, threshold):\n    sys.exit()\n",
        "SystemExit()",
    ),
    "os_exit_at_module_level": (
        "import os\ndef has_close_elements(numbers, threshold):\n    return False\nos._exit(0)\n",
        "exited with status 0 before the program ran to its end",
    ),
    "atexit_hook_after_a_failed_assert": (
        "import atexit, os\natexit.register(os._exit, 0)\n"
        "def has_close_elements(numbers, threshold):\n    return False\n",
        "AssertionError",
    ),
    "an_equality_that_exits": (
        "class Exit:\n    def __eq__(self, other):\n        raise SystemExit(0)\n"
        "def has_close_elements(numbers, threshold):\n    return Exit()\n",
        "SystemExit(0)",
    ),
    "guessing_the_protocol_without_the_nonce": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'SP' + b'0' * 32)\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
        "exited with status 0",
    ),
}


@pytest.mark.parametrize("hack", sorted(REWARD_HACKS))
def test_an_early_exit_is_a_failure_with_a_reason(task, hack):
    code, reason = REWARD_HACKS[hack]
    score = task.score(f"```python\n{code}```", example(task, "HumanEval/0"))
    assert (score.hard, score.soft) == (0.0, 0.0), score.feedback
    assert reason in score.feedback, score.feedback


def test_feedback_is_redacted_and_bounded(task):
    key = "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7" * 2
    leaking = (
        "```python\ndef has_close_elements(numbers, threshold):\n"
        f"    raise ValueError('the key is {key} ' + 'x' * 250)\n```"
    )
    score = task.score(leaking, example(task, "HumanEval/0"))
    assert score.hard == 0 and "ValueError: the key is" in score.feedback, score.feedback
    assert key not in score.feedback and "[REDACTED:openai_key]" in score.feedback
    long_line = "y" * 3000
    long_source = (
        "```python\ndef has_close_elements(numbers, threshold):\n"
        f"    raise ValueError('{long_line}'[:5])\n```"
    )
    score = task.score(long_source, example(task, "HumanEval/0"))
    assert "ValueError: yyyyy" in score.feedback and len(score.feedback) <= MAX_FEEDBACK_CHARS


def test_infinite_loop_times_out():
    fast = HumanEvalTask(timeout_s=1.0, unsafe_exec=UNSAFE_IF_NO_BWRAP)
    ex = example(fast, "HumanEval/0")
    score = fast.score("```python\ndef has_close_elements(n, t):\n    while True: pass\n```", ex)
    assert score.hard == 0 and score.feedback == "tests failed: timed out after 1s"


def test_sandbox_memory_hog_is_stopped():
    code = "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')"
    result = run_python(code, 5.0, 256, unsafe_exec=UNSAFE_IF_NO_BWRAP)
    assert not result.passed and result.memory_exceeded
    assert "allocated" not in result.stdout_tail
    assert "out of memory" in result.summary()


def test_sandbox_reports_output_and_hides_environment(monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_SECRET_FOR_TEST", "hunter2")
    code = "import os\nprint(os.environ.get('SELFTAUGHT_SECRET_FOR_TEST'))"
    result = run_python(code, unsafe_exec=UNSAFE_IF_NO_BWRAP)
    assert result.passed and result.returncode == 0 and result.stdout_tail == "None\n"
    failing = run_python("raise SystemExit(3)", unsafe_exec=UNSAFE_IF_NO_BWRAP)
    assert not failing.passed and failing.returncode == 3 and not failing.timed_out


def test_unsafe_mode_still_kills_the_whole_process_group_on_timeout(tmp_path):
    marker = tmp_path / "grandchild-survived"
    grandchild = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w').write('alive')"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        "while 1: pass\n"
    )
    result = Sandbox(None).run(code, timeout_s=0.5, allow_subprocesses=True)
    assert result.timed_out and not result.passed and not result.isolated
    time.sleep(2.0)
    assert not marker.exists()


def test_all_164_canonical_solutions_pass_in_the_sandbox(task, problems):
    by_id = {e.id: e for s in SPLITS for e in task.examples(s)}
    replies = {
        pid: f"```python\n{p['prompt']}{p['canonical_solution']}```" for pid, p in problems.items()
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {
            pid: pool.submit(task.score, reply, by_id[pid]) for pid, reply in replies.items()
        }
    scores = {pid: f.result() for pid, f in futures.items()}
    failed = {pid: s.feedback for pid, s in scores.items() if s.hard != 1.0}
    assert len(scores) == 164 and not failed
    assert task.sandbox.isolated != UNSAFE_IF_NO_BWRAP


def test_without_bwrap_humaneval_refuses_unless_unsafe_exec(tmp_path, monkeypatch, problems):
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        load_task("humaneval")
    unsafe = load_task("humaneval", unsafe_exec=True)
    assert unsafe.name == "humaneval[unsafe-exec]" and not unsafe.sandbox.isolated
    ex = example(unsafe, "HumanEval/0")
    solution = problems["HumanEval/0"]["prompt"] + problems["HumanEval/0"]["canonical_solution"]
    assert unsafe.score(solution, ex).hard == 1.0


def test_a_sandbox_failing_mid_run_raises_instead_of_scoring(task, tmp_path, monkeypatch):
    broken = tmp_path / "bwrap"
    broken.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    monkeypatch.setattr(task, "sandbox", Sandbox(str(broken)))
    with pytest.raises(SandboxError, match="No permissions to create new namespace"):
        task.score(
            "def has_close_elements(n, t):\n    return False\n", example(task, "HumanEval/0")
        )


def _canonical_answerer(problems):
    by_prompt = {p["prompt"].rstrip(): p for p in problems.values()}

    def answer(messages):
        text = messages[-1]["content"]
        prompt = next(k for k in by_prompt if k in text)
        return f"```python\n{prompt}\n{by_prompt[prompt]['canonical_solution']}```"

    return answer


def test_cli_eval_refuses_without_bwrap_and_warns_with_unsafe_exec(tmp_path, monkeypatch, problems):
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    with FaultServer(_canonical_answerer(problems)) as server:
        args = ["eval", "--task", "humaneval", "--model", f"{server.base_url}#fake-model"]
        args += ["--limit", "3", "--output", str(tmp_path / "out.jsonl")]
        refused = CliRunner().invoke(app, args)
        assert refused.exit_code == 2 and "apt-get install bubblewrap" in refused.output
        assert server.chat_requests() == 0
        ran = CliRunner().invoke(app, [*args, "--unsafe-exec"])
    assert ran.exit_code == 0, ran.output
    assert "warning:" in ran.output and "resource limits only" in ran.output
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["task"] == "humaneval[unsafe-exec]" and summary["hard"] == 1.0


@pytest.mark.skipif(UNSAFE_IF_NO_BWRAP, reason="bubblewrap is not installed")
def test_cli_eval_runs_humaneval_sandboxed(tmp_path, problems):
    with FaultServer(_canonical_answerer(problems)) as server:
        args = ["eval", "--task", "humaneval", "--model", f"{server.base_url}#fake-model"]
        ran = CliRunner().invoke(
            app, [*args, "--limit", "3", "--output", str(tmp_path / "o.jsonl")]
        )
    assert ran.exit_code == 0 and "warning" not in ran.output, ran.output
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["task"] == "humaneval" and summary["hard"] == 1.0 and summary["n"] == 3


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
