"""Sleep: the deployed agent learns from its own real traffic, in three parts.

- `intake/`: the task log and every way traffic gets in (`selftaught proxy`, the Python call
  `log_interaction`, `selftaught sleep import`, the agent-transcript harvesters), with
  secrets redacted before anything is stored; and probation, which watches each adopted
  version on the traffic logged since (`probation`).
- `night/`: the nightly cycle (`night.cycle.run_night`): mine the log into checked tasks
  (`mine`, `checks`), split them (`split`), consolidate a skill and a memory with the
  SkillOpt trainer, write the night's summary (`summary`); and take out what came from
  forgotten rows (`forget`).
- `adoption/`: stage a proposal, adopt or roll it back (`staging`), inject the adopted skill
  into requests (`inject`).

Beside them: a night's report as typed records (`records`, `result`), a project's kinds on
disk (`kinds_file`), one night at a time (`lock`), on a schedule (`cron`), where it all lives
(`paths`), past one machine (`store/`: the log, the adopted versions and the night's lock in
PostgreSQL when the log is a `postgresql://` URL) and moving there (`move`).

Layers, each importing only those below it (`tests/test_layout.py` holds it):

    mcp_server, move                 over everything
    night/                           reads the log, stages and adopts
    cron                             schedules nights
    intake/                          the log, the proxy (it serves what is adopted), probation
    adoption/                        staged and adopted versions, injecting them
    lock, pause, replay_mark         one night at a time, a paused project, replay's marker
    result, kinds_file               a night's report, a project's kinds: what the others read
    records                          the report's sections, typed
    paths                            where it all lives
    store/                           SQLite or PostgreSQL
"""

from selftaught.redact import Redactor, redact_for_model
from selftaught.sleep.intake.log import (
    Feedback,
    Interaction,
    LogError,
    LogFilter,
    TaskLog,
    log_interaction,
    open_log,
)
from selftaught.sleep.paths import Adopted, default_log_path, read_adopted, sleep_home

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
