"""Task specs a user can type, and the list of built-in tasks.

gym:NAME[?key=value&...]   a reasoning-gym generator (`selftaught tasks --gym` lists them)
humaneval                  HumanEval, executed in a bubblewrap sandbox
game:ctf                   grid capture-the-flag (a JSON-strategy game)
tool:NAME[?key=value&...]  an episode task with tools (tool:calculator, tool:kvstore)
jsonl:PATH  or  PATH.jsonl your own examples, scored by --scorer
package.module:ClassName   a Python plugin implementing the Task protocol
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selftaught.models.base import ChatModel
from selftaught.tasks.base import Task, TaskError

TASK_FORMS = (
    "gym:NAME[?key=value&...]",
    "humaneval",
    "game:ctf",
    "tool:calculator | tool:kvstore",
    "jsonl:PATH (or any PATH.jsonl)",
    "package.module:ClassName",
)

BUILTIN_TASKS: dict[str, str] = {
    "gym:basic_arithmetic": "arithmetic expressions (reasoning-gym); any gym:NAME works",
    "gym:chain_sum": "chains of additions and subtractions (reasoning-gym)",
    "gym:gsm_symbolic": "GSM8K-style word problems (reasoning-gym)",
    "humaneval": "164 Python problems, executed in a bubblewrap sandbox (no network, no files "
    "outside its folder) with time and memory limits",
    "game:ctf": "grid capture-the-flag: answer a JSON strategy, scored by a seeded simulator",
    "tool:calculator": "4-5 digit arithmetic with a calculator tool (episodes: call, read the "
    "result, answer); ?min_digits=&max_digits= set the size",
    "tool:kvstore": "goals on a hidden key-value store, reached through list_keys/get/set tool "
    "calls over several turns; scored on the final state and the answer",
    "jsonl:PATH": "your own JSONL examples; scorers exact/normalized/numeric/contains/regex/"
    "json_match/llm_judge",
}


DEFAULT_SEED = 0
"""Seeds a task's generator and its train / val / test split."""


def load_task(
    spec: str,
    *,
    seed: int = DEFAULT_SEED,
    train_size: int | None = None,
    val_size: int | None = None,
    test_size: int | None = None,
    scorer: str | None = None,
    judge_model: ChatModel | None = None,
    rubric: str | None = None,
    unsafe_exec: bool = False,
) -> Task:
    """Build a task from its spec. Split sizes left as None keep each task's defaults.
    unsafe_exec: tasks that execute model-written code may run it with resource limits only
    when bubblewrap is missing, and reasoning-gym generators whose scorer evaluates the answer
    in this process may load (otherwise both refuse to load)."""
    sizes = {
        k: v
        for k, v in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size))
        if v is not None
    }
    s = spec.strip()
    if s.startswith("gym:"):
        from selftaught.tasks.gym import GymTask, parse_gym_spec

        name, kwargs = parse_gym_spec(s)
        return GymTask(name, seed=seed, unsafe_exec=unsafe_exec, **sizes, **kwargs)
    if s == "humaneval":
        from selftaught.tasks.humaneval import HumanEvalTask

        sizes.pop("train_size", None)  # train is what val and test leave
        return HumanEvalTask(seed=seed, unsafe_exec=unsafe_exec, **sizes)
    if s in ("game:ctf", "ctf"):
        from selftaught.tasks.games.ctf import GridCTFTask

        return GridCTFTask(seed=seed, **sizes)
    if s.startswith("tool:"):
        from selftaught.tasks.tools import load_tool_task

        return load_tool_task(s, seed=seed, **sizes)
    if s.startswith("jsonl:") or s.endswith(".jsonl"):
        from selftaught.tasks.jsonl import JsonlTask

        path = Path(s.removeprefix("jsonl:"))
        if not path.exists():
            raise TaskError(f"JSONL task file {path} does not exist")
        kwargs: dict[str, Any] = {"seed": seed, "judge_model": judge_model, "rubric": rubric}
        kwargs["unsafe_exec"] = unsafe_exec  # lines with a `check` run it in the sandbox
        if scorer:
            kwargs["scorer"] = scorer
        return JsonlTask(path, **kwargs)
    if ":" in s and s.split(":")[0] not in ("game", "gym", "jsonl", "tool"):
        from selftaught.tasks.plugin import load_plugin_task

        return load_plugin_task(s, seed=seed, **sizes)
    raise TaskError(
        f"unknown task {spec!r}; valid forms: {', '.join(TASK_FORMS)}; built-in: "
        + ", ".join(BUILTIN_TASKS)
    )
