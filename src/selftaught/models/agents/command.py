"""Any CLI agent as the model: `cmd:TEMPLATE`.

TEMPLATE is split into arguments once, the way a POSIX shell would split it (quotes group
words), and is never run through a shell. In each argument these placeholders are replaced
by their text (as part of that one argument, however many spaces or quotes the text holds):

  {prompt}        the prompt (the last user message); without it, the prompt goes to stdin
  {instructions}  the instruction text (skill, memory, worked examples), also in AGENTS.md
  {workspace}     the workspace's absolute path (also the working directory)

The skill is written to `AGENTS.md` in the workspace, as for Codex. The reply is what the
command prints on stdout. Exit 0 is an answer; exit 75 (EX_TEMPFAIL) asks for a retry, like
a 429 from an API; any other status stops the run with the command's stderr.

A template that could run a placeholder's text (or the prompt on stdin) as code is refused
when it is parsed, with CommandTemplateError: a placeholder inside a larger argument, inside
the script of `sh -c` / `python -c` / `perl -e`, or behind a launcher (`env`, `timeout`, `ssh`
...); see `command_guard.py`. Pass the prompt as a whole argument after the script instead:
cmd:sh -c 'my-agent --ask "$1"' sh {prompt}"""

from __future__ import annotations

import shlex
from pathlib import Path

from selftaught.models.agents.base import AgentBrief, AgentRun, CliAgent
from selftaught.models.agents.command_guard import (
    PLACEHOLDER,
    CommandTemplateError,
    check_template,
)
from selftaught.models.agents.process import ProcessResult
from selftaught.models.agents.settings import AgentSettings
from selftaught.models.errors import (
    CALL_TIMEOUT_S,
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
)

__all__ = ["CommandAgent", "CommandTemplateError", "fill", "parse_template"]
RETRY_STATUS = 75  # EX_TEMPFAIL (sysexits.h): "try again later"


def parse_template(template: str) -> list[str]:
    """The template's arguments; CommandTemplateError when it is empty, cannot be split, or
    could run a placeholder's text or the prompt as code (`command_guard.check_template`)."""
    try:
        argv = shlex.split(template)
    except ValueError as err:
        raise CommandTemplateError(
            f"cmd: template {template!r} cannot be split into arguments ({err})"
        ) from None
    if not argv:
        raise CommandTemplateError("cmd: needs a command, e.g. cmd:my-agent --ask {prompt}")
    check_template(argv)
    return argv


def fill(argv: list[str], values: dict[str, str]) -> list[str]:
    return [PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in argv]


class CommandAgent(CliAgent):
    kind = "cmd"
    instruction_file = "AGENTS.md"

    def __init__(
        self,
        template: str,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        settings: AgentSettings | None = None,
    ) -> None:
        self.argv = parse_template(template)
        super().__init__(template, timeout_s=timeout_s, retry=retry, settings=settings)
        self.name = self.backend = f"cmd:{template}"
        self.takes_prompt = any("{prompt}" in a for a in self.argv)

    def program_name(self) -> str:
        return self.argv[0]

    def not_installed(self) -> str:
        return f"the command `{self.argv[0]}` of the cmd: model spec is not on PATH"

    def command(self, brief: AgentBrief, workspace: Path) -> tuple[list[str], str | None]:
        assert self.program is not None
        values = {
            "prompt": brief.prompt,
            "instructions": brief.instructions,
            "workspace": str(workspace),
        }
        argv = fill([self.program, *self.argv[1:]], values)
        return argv, None if self.takes_prompt else brief.prompt

    def parse(self, result: ProcessResult) -> AgentRun:
        said = result.stderr_tail() or "no message on stderr"
        if result.returncode == RETRY_STATUS:
            raise TransientBackendError(self.backend, f"asked for a retry (exit 75): {said}")
        if result.returncode != 0:
            raise FatalBackendError(self.backend, f"exited with status {result.returncode}: {said}")
        text = result.stdout.strip()
        if not text:
            raise TransientBackendError(self.backend, "empty reply")
        return AgentRun(text=text)
