"""reasoning-gym generators whose own scorer evaluates the model's answer as Python in this
process are refused unless the user opts in; the list is re-derived here by experiment."""

from __future__ import annotations

import contextlib

import pytest

from selftaught.tasks import TaskError, load_task
from selftaught.tasks.gym import EVALUATES_ANSWERS, gym_generators


def test_a_generator_that_evaluates_answers_is_refused_without_opt_in():
    with pytest.raises(TaskError, match="runs the model's answer as Python.*--unsafe-exec"):
        load_task("gym:spiral_matrix")
    task = load_task("gym:spiral_matrix", unsafe_exec=True, train_size=1, val_size=1, test_size=1)
    assert task.examples("test")
    load_task("gym:basic_arithmetic")  # the others load as before


def _writes_a_file(name: str, marker) -> bool:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name, size=1, seed=0)
    entry = ds[0]
    call = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    for reply in (call, f"[{call}]", f"<answer>{call}</answer>"):
        with contextlib.suppress(Exception):  # only the side effect matters here
            ds.score_answer(reply, entry)
        if marker.exists():
            return True
    return False


def test_the_list_matches_what_the_generators_really_do(tmp_path):
    """Score a reply that writes a file with every generator: exactly the listed ones run it."""
    found = set()
    for name in gym_generators():
        marker = tmp_path / name
        try:
            if _writes_a_file(name, marker):
                found.add(name)
        except Exception:  # noqa: BLE001 - a generator that cannot build one item is skipped
            continue
    assert found == set(EVALUATES_ANSWERS)


def test_unsafe_exec_says_that_these_scorers_run_in_this_process(tmp_path):
    """With --unsafe-exec a listed generator's scorer runs the answer here, bubblewrap or not:
    the flag's help and its warning say exactly that."""
    from typer.testing import CliRunner

    from selftaught.cli import app
    from selftaught.tasks.sandbox import UNSAFE_EXEC_WARNING

    task = load_task("gym:spiral_matrix", unsafe_exec=True, train_size=1, val_size=1, test_size=1)
    marker = tmp_path / "pid"
    reply = (
        f"__import__('pathlib').Path({str(marker)!r}).write_text(str(__import__('os').getpid()))"
    )
    with contextlib.suppress(Exception):
        task.score(reply, task.examples("test")[0])
    assert marker.read_text() == str(__import__("os").getpid())  # this very process
    for text in (UNSAFE_EXEC_WARNING, CliRunner().invoke(app, ["eval", "--help"]).output):
        flat = " ".join(text.replace("│", " ").split())
        assert "reasoning-gym" in flat and "inside this selftaught process" in flat, flat
    assert "even when bubblewrap is installed" in UNSAFE_EXEC_WARNING
