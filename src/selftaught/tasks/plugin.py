"""Tasks written in Python by the user: "package.module:ClassName" (or "path/to/file.py:Name").

The named object is a Task class (or any factory returning a Task); it is called with the
keyword arguments it accepts, and the result is checked against the Task protocol so that a
half-written plugin fails at load time with the missing attributes named, not mid-run.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from selftaught.errors import ConfigError
from selftaught.tasks.base import Task, TaskError

_TASK_ATTRIBUTES = ("name", "kind", "instructions")
_TASK_METHODS = ("examples", "score")


def _import_module(module_ref: str, spec: str) -> ModuleType:
    if module_ref.endswith(".py"):
        path = Path(module_ref)
        if not path.is_file():
            raise TaskError(f"task plugin {spec!r}: no such file {module_ref!r}")
        module_name = f"selftaught_plugin_{path.stem}"
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if file_spec is None or file_spec.loader is None:
            raise TaskError(f"task plugin {spec!r}: cannot load {module_ref!r} as Python")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look the module up here
        try:
            file_spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop(module_name, None)
            raise TaskError(
                f"task plugin {spec!r}: importing {module_ref!r} failed: {err!r}"
            ) from err
        return module
    try:
        return importlib.import_module(module_ref)
    except ModuleNotFoundError as err:
        if err.name and (module_ref == err.name or module_ref.startswith(err.name + ".")):
            raise TaskError(
                f"task plugin {spec!r}: no module named {err.name!r} (is it installed or on "
                "PYTHONPATH?)"
            ) from err
        raise TaskError(f"task plugin {spec!r}: importing {module_ref!r} failed: {err}") from err
    except Exception as err:
        raise TaskError(f"task plugin {spec!r}: importing {module_ref!r} failed: {err!r}") from err


def _accepted_kwargs(factory: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The subset of kwargs that `factory` accepts (all of them when it takes **kwargs)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): pass everything
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in kwargs.items() if k in names}


def missing_task_attributes(obj: Any) -> list[str]:
    """The Task protocol members `obj` lacks (methods must be callable)."""
    missing = [a for a in _TASK_ATTRIBUTES if not hasattr(obj, a)]
    missing += [f"{m}()" for m in _TASK_METHODS if not callable(getattr(obj, m, None))]
    if getattr(obj, "kind", "agent") == "game" and not hasattr(obj, "schema"):
        missing.append("schema (a game task needs one)")
    return missing


def load_plugin_task(spec: str, required: Iterable[str] = (), **kwargs: Any) -> Task:
    """Import "module:Name", build the task with the kwargs it accepts, check the protocol.
    A `required` keyword the factory does not accept is refused (ConfigError), not dropped."""
    module_ref, sep, attr_path = spec.rpartition(":")
    if not sep or not module_ref or not attr_path:
        raise TaskError(f"task plugin {spec!r}: expected 'package.module:ClassName'")
    module = _import_module(module_ref, spec)
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise TaskError(f"task plugin {spec!r}: module {module_ref!r} has no {attr_path!r}")
        target = getattr(target, part)

    if inspect.isclass(target) or (callable(target) and missing_task_attributes(target)):
        accepted = _accepted_kwargs(target, kwargs)
        refused = sorted(set(required) - set(accepted))
        if refused:
            raise ConfigError(
                f"task plugin {spec!r}: {attr_path} takes no "
                + ", ".join(f"{name}=" for name in refused)
                + " (its signature does not name it), so it cannot honour it"
            )
        try:
            task = target(**accepted)
        except TaskError:
            raise
        except Exception as err:
            raise TaskError(f"task plugin {spec!r}: building {attr_path} failed: {err!r}") from err
    else:
        task = target  # already a task instance
        if required:
            raise ConfigError(
                f"task plugin {spec!r} is a task instance: it cannot honour "
                + ", ".join(f"{name}=" for name in sorted(required))
            )

    missing = missing_task_attributes(task)
    if missing:
        raise TaskError(
            f"task plugin {spec!r}: {type(task).__name__} is not a Task; missing "
            + ", ".join(missing)
        )
    if task.kind not in ("agent", "game"):
        raise TaskError(f"task plugin {spec!r}: kind must be 'agent' or 'game', got {task.kind!r}")
    return cast(Task, task)  # every attribute of the Task protocol checked just above
