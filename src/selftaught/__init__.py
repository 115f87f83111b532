"""selftaught: LLM agents that improve themselves on their own tasks, safely.

The entry points (`selftaught.evaluate`, `selftaught.optimize`, `selftaught.optimize_skills`,
`selftaught.train`, `selftaught.sleep_night`) live in `selftaught.api`; they are imported on
first use so that `import selftaught` stays light."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["evaluate", "optimize", "optimize_skills", "sleep_night", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from selftaught import api

        return getattr(api, name)
    raise AttributeError(f"module 'selftaught' has no attribute {name!r}")
