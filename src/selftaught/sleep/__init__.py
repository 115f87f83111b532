"""Sleep: the deployed agent learns from its own real traffic.

Part 1 (here): the task log and every way traffic gets in — `selftaught proxy`, the Python call
`log_interaction`, `selftaught sleep import`, and the agent-transcript harvesters — with
secrets redacted before anything is stored."""

from selftaught.sleep.log import (
    Feedback,
    Interaction,
    LogError,
    LogFilter,
    TaskLog,
    log_interaction,
    open_log,
)
from selftaught.sleep.paths import Adopted, default_log_path, read_adopted, sleep_home
from selftaught.sleep.redact import Redactor, redact_for_model

__all__ = [
    "Adopted",
    "Feedback",
    "Interaction",
    "LogError",
    "LogFilter",
    "Redactor",
    "TaskLog",
    "default_log_path",
    "log_interaction",
    "open_log",
    "read_adopted",
    "redact_for_model",
    "sleep_home",
]
