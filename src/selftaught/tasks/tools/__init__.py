"""Bundled tool tasks (episodes with tools, see `selftaught.tasks.episode`), offline and seeded.

tool:calculator[?min_digits=4&max_digits=5]   large-number arithmetic with a calculator tool
tool:kvstore                                  goals on a hidden key-value store (get/set/list)
"""

from __future__ import annotations

from typing import Any

from selftaught.tasks.base import Task, TaskError

TOOL_TASKS = ("calculator", "kvstore")


def load_tool_task(spec: str, **kwargs: Any) -> Task:
    """`tool:NAME[?key=value&...]` → the task (kwargs: seed and split sizes)."""
    from selftaught.tasks.gym import parse_gym_spec

    body = spec.strip().removeprefix("tool:")
    name, options = parse_gym_spec(body)
    if name == "calculator":
        from selftaught.tasks.tools.calculator import calculator_from_spec

        return calculator_from_spec(options, **kwargs)
    if name == "kvstore":
        from selftaught.tasks.tools.kvstore import kvstore_from_spec

        return kvstore_from_spec(options, **kwargs)
    raise TaskError(
        f"unknown tool task {spec!r}; valid: " + ", ".join(f"tool:{t}" for t in TOOL_TASKS)
    )
