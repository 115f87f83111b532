"""One root for every error selftaught raises on purpose, and the exit code of each kind.

Each class carries its `exit_code`; the CLI maps any `SelftaughtError` to one sentence and that
code, in one place. The families keep the builtin base code already catches: bad input is a
`ValueError`, a failed run a `RuntimeError`.

| code | family              | meaning                                                            |
|------|---------------------|--------------------------------------------------------------------|
| 0    |                     | done (a night ran, whatever it concluded)                          |
| 1    | `BackendError`      | the model backend failed: unreachable endpoint, refused key, a     |
|      |                     | missing agent CLI; also `LogUnavailable` and a failed night        |
| 2    | `InputError`        | bad input: a setting or flag combination, a file, a task, a model  |
|      |                     | (also a missing tracking extra or bubblewrap)                      |
| 3    | `Busy`              | another night is running for this sleep home                       |
| 4    | `RunError`          | a run failed or cannot be read: run directory, a crashed scorer    |
| 5    | `BudgetTooSmall`    | the budget ran out before the baseline was scored (a budget that   |
|      |                     | runs out later, `BudgetExhausted`, ends the run cleanly: exit 0)   |
| 6    | `MissingDependency` | an optional extra, a model's files or a program is not installed    |

docs/cli-reference.md lists every class with its code (`python -m selftaught.cli.reference`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from selftaught.given_keys import scrub_secrets


class SelftaughtError(Exception):
    """The root: anything selftaught raises on purpose. Its message is one sentence a user can
    act on."""

    exit_code: int = 4


class InputError(SelftaughtError, ValueError):
    """Bad input a user can fix: a file, its contents, a value."""

    exit_code = 2


class ConfigError(InputError):
    """A setting, or a combination of settings, that cannot work; the message names it."""


class TaskError(InputError):
    """Bad task spec or task data; the message says what and where."""


class RunError(SelftaughtError, RuntimeError):
    """A run that failed, or a run directory that cannot be read or resumed."""

    exit_code = 4


class BackendError(SelftaughtError):
    """A model backend call failed (not the model's answer being wrong). A backend that
    cannot start because of what the user gave (a path, a device, a missing extra) keeps the
    exit code of that cause (`exit_code=`). Every key selftaught was given is cut from `cause`
    here (`given_keys.scrub_secrets`): a server may quote the key it was sent."""

    exit_code = 1

    def __init__(
        self, backend: str, cause: str, *, status: int | None = None, exit_code: int | None = None
    ):
        if exit_code is not None:
            self.exit_code = exit_code
        self.backend = backend
        self.cause = scrub_secrets(cause)[0]
        self.status = status
        self.retries = 0  # retries spent before giving up
        super().__init__(f"{backend}: {cause}")


class Busy(SelftaughtError, RuntimeError):
    """Something that runs one at a time is already running (a night)."""

    exit_code = 3


class BudgetExhausted(SelftaughtError):
    """The run's budget is spent: a trainer ends cleanly with what it learned so far. Never a
    backend error and never a score."""

    exit_code = 5

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"budget exhausted: {reason}")


class MissingDependency(SelftaughtError, RuntimeError):
    """An optional extra, a model's files or a program the command needs is not installed."""

    exit_code = 6


class BudgetTooSmall(RunError):
    """The budget ran out before the baseline was scored: nothing was learned."""

    exit_code = BudgetExhausted.exit_code


EXIT_CODES: dict[int, str] = {
    0: "done",
    BackendError.exit_code: "the model backend failed",
    InputError.exit_code: "bad input (settings, files, task or model spec)",
    Busy.exit_code: "another night is running",
    RunError.exit_code: "the run failed or its directory cannot be read",
    BudgetExhausted.exit_code: "a budget ran out",
    MissingDependency.exit_code: "a needed extra, model or program is missing",
}


@contextlib.contextmanager
def writing_to(path: str | Path, what: str = "file") -> Iterator[None]:
    """Writes to a path the user chose: an OS refusal (no such folder, a file where a folder
    should be, no permission) becomes an `InputError` naming the path."""
    try:
        yield
    except OSError as err:
        raise InputError(f"cannot write {what} {path}: {err.strerror or err}") from None


def read_text(path: str | Path, what: str = "file") -> str:
    """A text file's contents; a missing or unreadable file is an `InputError` naming it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a folder, not a file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path} is not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise InputError(f"cannot read {what} {path}: {err.strerror or err}") from None
