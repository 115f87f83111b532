"""What is practised: the Task protocol, scorers and the built-in task sources."""

from selftaught.tasks.base import SPLITS, Example, GameTask, Score, Task, TaskError, check_disjoint
from selftaught.tasks.options import TaskOptions
from selftaught.tasks.registry import BUILTIN_TASKS, TASK_FORMS, load_task

__all__ = [
    "BUILTIN_TASKS",
    "SPLITS",
    "TASK_FORMS",
    "Example",
    "GameTask",
    "Score",
    "Task",
    "TaskError",
    "TaskOptions",
    "check_disjoint",
    "load_task",
]
