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
from selftaught.tasks.options import TaskOptions

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


SIZES = {"train_size", "val_size", "test_size"}
# a permission, not a setting: a task that runs no model-written code has nothing to refuse
PERMISSIONS = {"unsafe_exec"}


def load_task(
    spec: str,
    options: TaskOptions | dict[str, Any] | None = None,
    *,
    judge: ChatModel | None = None,
    **fields: Any,
) -> Task:
    """Build a task from its spec and its `TaskOptions` (or their fields as keywords, e.g.
    `load_task("gym:chain_sum", seed=1, test_size=50)`). A task source that cannot honour an
    option set raises ConfigError. `judge`: the judge model object for the llm_judge scorer
    (else `options.judge_model` is resolved here)."""
    opts = TaskOptions.of(options, **fields)
    s = spec.strip()
    if s.startswith("gym:"):
        from selftaught.tasks.gym import GymTask, parse_gym_spec

        opts.refuse(f"task {s}", {"seed", *SIZES, *PERMISSIONS})
        name, kwargs = parse_gym_spec(s)
        return GymTask(name, seed=opts.seed, unsafe_exec=opts.unsafe_exec, **opts.sizes(), **kwargs)
    if s == "humaneval":
        from selftaught.tasks.humaneval import HumanEvalTask

        opts.refuse("task humaneval", {"seed", *SIZES, *PERMISSIONS})
        return HumanEvalTask(seed=opts.seed, unsafe_exec=opts.unsafe_exec, **opts.sizes())
    if s in ("game:ctf", "ctf"):
        from selftaught.tasks.games.ctf import GridCTFTask

        opts.refuse("task game:ctf", {"seed", *SIZES, *PERMISSIONS})
        return GridCTFTask(seed=opts.seed, **opts.sizes())
    if s.startswith("tool:"):
        from selftaught.tasks.tools import load_tool_task

        opts.refuse(f"task {s}", {"seed", *SIZES, *PERMISSIONS})
        return load_tool_task(s, seed=opts.seed, **opts.sizes())
    if _is_jsonl(s):
        return _jsonl_task(Path(s.removeprefix("jsonl:")), opts, judge)
    if _is_plugin(s):
        return _plugin_task(s, opts, judge)
    raise TaskError(
        f"unknown task {spec!r}; valid forms: {', '.join(TASK_FORMS)}; built-in: "
        + ", ".join(BUILTIN_TASKS)
    )


def _is_jsonl(spec: str) -> bool:
    return spec.startswith("jsonl:") or spec.endswith(".jsonl")


def _is_plugin(spec: str) -> bool:
    return ":" in spec and spec.split(":")[0] not in ("game", "gym", "jsonl", "tool")


def takes_judge(spec: str) -> bool:
    """Whether the task spec's source can use a judge model (`--judge-model`): JSONL files
    (lines scored by llm_judge) and plugins; the built-in tasks score by rule."""
    s = spec.strip()
    return _is_jsonl(s) or _is_plugin(s)


def _judge(opts: TaskOptions, judge: ChatModel | None) -> ChatModel | None:
    if judge is not None or opts.judge_model is None:
        return judge
    from selftaught.models.resolve import resolve_model

    return resolve_model(opts.judge_model)


def _jsonl_task(path: Path, opts: TaskOptions, judge: ChatModel | None) -> Task:
    from selftaught.tasks.jsonl import JsonlTask

    if not path.exists():
        raise TaskError(f"JSONL task file {path} does not exist")
    kwargs: dict[str, Any] = {"seed": opts.seed, "judge_model": _judge(opts, judge)}
    kwargs["rubric"] = opts.rubric
    kwargs["judge_options"] = opts.judge_options()
    kwargs["unsafe_exec"] = opts.unsafe_exec  # lines with a `check` run it in the sandbox
    for name in ("scorer", "val_fraction", "test_fraction"):
        if getattr(opts, name) is not None:
            kwargs[name] = getattr(opts, name)
    return JsonlTask(path, **kwargs, **opts.sizes())


def _plugin_task(spec: str, opts: TaskOptions, judge: ChatModel | None) -> Task:
    """A plugin gets the options its factory names; one set that it does not name is
    refused."""
    from selftaught.tasks.plugin import load_plugin_task

    kwargs: dict[str, Any] = {"seed": opts.seed, **opts.sizes()}
    for name in opts.given():
        kwargs[name] = getattr(opts, name)
    if opts.judge_model is not None or judge is not None:
        kwargs["judge_model"] = _judge(opts, judge)
    required = [n for n in opts.given() if n not in PERMISSIONS]
    return load_plugin_task(spec, required=required, **kwargs)
