from __future__ import annotations

import pytest

from selftaught.tasks.base import Example, Score, Task, TaskError
from selftaught.tasks.plugin import load_plugin_task


class SmallTask:
    """A plugin task: numbers to double."""

    kind = "agent"
    instructions = "Reply with the number only."

    def __init__(self, size: int = 3, name: str = "double"):
        self.name = name
        self._examples = [
            Example(id=str(i), input=f"Double {i}", reference=2 * i) for i in range(size)
        ]

    def examples(self, split):
        return self._examples if split == "train" else []

    def score(self, output: str, example: Example) -> Score:
        ok = output.strip() == str(example.reference)
        return Score(float(ok), float(ok), "ok" if ok else f"expected {example.reference}")


class HalfWritten:
    name = "half"

    def examples(self, split):
        return []


class Exploding:
    def __init__(self):
        raise RuntimeError("cannot open the data")


def make_task(**kwargs):
    return SmallTask(size=1)


SMALL = SmallTask(size=2, name="ready")


def test_loads_class_and_passes_only_accepted_kwargs():
    task = load_plugin_task(f"{__name__}:SmallTask", size=5, seed=7, judge_model=None)
    assert isinstance(task, Task) and task.name == "double"
    assert len(task.examples("train")) == 5
    assert task.score("4", task.examples("train")[2]).hard == 1


def test_loads_factory_function_and_ready_instance():
    assert len(load_plugin_task(f"{__name__}:make_task", seed=1).examples("train")) == 1
    assert load_plugin_task(f"{__name__}:SMALL").name == "ready"


def test_loads_from_a_file_path(tmp_path):
    plugin = tmp_path / "my_tasks.py"
    plugin.write_text(
        "class FileTask:\n"
        "    name = 'file'\n    kind = 'agent'\n    instructions = ''\n"
        "    def examples(self, split):\n        return []\n"
        "    def score(self, output, example):\n        raise NotImplementedError\n"
    )
    assert load_plugin_task(f"{plugin}:FileTask").name == "file"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "expected 'package.module:ClassName'"),
        ("selftaught_no_such_module_xyz:Task", "no module named 'selftaught_no_such_module_xyz'"),
        (f"{__name__}:Missing", "has no 'Missing'"),
        (f"{__name__}:HalfWritten", r"missing kind, instructions, score\(\)"),
        (f"{__name__}:Exploding", "cannot open the data"),
        ("/nonexistent/dir/tasks.py:Task", "no such file"),
    ],
)
def test_clear_errors(spec, message):
    with pytest.raises(TaskError, match=message):
        load_plugin_task(spec)
