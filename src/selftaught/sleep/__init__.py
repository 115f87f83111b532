"""Sleep: the deployed agent learns from its own real traffic.

The task log and every way traffic gets in — `selftaught proxy`, the Python call
`log_interaction`, `selftaught sleep import`, and the agent-transcript harvesters — with
secrets redacted before anything is stored. Then the nightly cycle (`sleep.cycle.run_night`):
mine the log into checked tasks (`mine`, `checks`), split them (`split`), consolidate a skill
and a memory with the SkillOpt trainer, stage a proposal and adopt or roll it back
(`staging`), one night at a time (`lock`), on a schedule (`schedule`)."""

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
