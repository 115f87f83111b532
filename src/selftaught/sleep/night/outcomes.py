"""The coding agent's own outcome: what the commands it ran said, read with no model call.

A coding agent's episode holds its shell commands and their results (a harvested turn's
`tool_calls` with `meta["tool_results"]`; a proxy row's assistant `tool_calls` and `tool`
turns). `tool_steps` lists them; `read_command` recognises a test run (pytest, unittest,
npm / yarn / pnpm / bun test, jest, vitest, mocha, go test, cargo test, make test, rspec,
mvn / gradle / dotnet test, ...) or a build (cargo build / check, go build / vet, tsc, gcc /
clang, javac, make, ...) and its outcome as a `CommandOutcome`:

- the **exit status** where the result records it: Claude Code's `Exit code N` first line
  (its Bash tool marks a non-zero exit `is_error`; a harvested result that is not an error
  exited 0), Codex's `Process exited with code N` header or its legacy `exit_code` metadata.
  An exit status is the runner's only when the runner's command is the last of the line
  (`pytest | tail`, `pytest || true` exit with the other program's status);
- else the runner's **summary line** ("2 failed, 3 passed in 0.4s", "Ran 3 tests ... OK",
  "FAILED (failures=1)", "Tests: 1 failed, 4 total", "ok  pkg", "FAIL pkg", "test result:
  FAILED", "3 examples, 1 failure", "1 failing"...);
- `error` instead of `failed` when the run could not test: a compiler error (`error[E0308]`,
  `error TS2345`, `file.c:3:5: error:`, a Python `SyntaxError`), no tests collected,
  a command not found.

`read_session` judges each row of a session by its runs, in order (`SessionOutcome`):
**solved** when its last run passed after a red one (in the row, or the session's previous
row ended red), **failed** when its last run is red, else **none** (no run, or only green
ones: a passing run proves nothing about the agent's work). The night turns solved / failed
into `Signal`s of source "agent" (`agent_outcome.py`).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from selftaught.sleep.intake.log import Interaction

RunKind = Literal["test", "build"]
RunStatus = Literal["passed", "failed", "error"]
Verdict = Literal["solved", "failed", "none"]

SHELL_TOOLS = ("Bash", "bash", "shell", "exec_command", "local_shell_call", "local_shell")
SUMMARY_CHARS = 200  # of a summary line kept in an outcome
TAIL_CHARS = 8000  # of a result read for the summary (summaries come last)


@dataclass(frozen=True)
class ToolStep:
    """One shell command the agent ran and what came back."""

    index: int  # the call's position among the row's tool calls
    call_id: str
    tool: str
    command: str
    output: str
    is_error: bool | None = None  # the harness's own flag, when the row kept it
    exit_code: int | None = None  # recorded beside the output (Codex's legacy metadata)


@dataclass(frozen=True)
class CommandOutcome:
    """What one test run or build said."""

    command: str
    kind: RunKind
    runner: str  # pytest, unittest, jest, go, cargo, make, npm, ...
    status: RunStatus
    summary: str  # the runner's summary line, the first error line, or "exit N"
    exit_code: int | None = None
    step: int = 0  # `ToolStep.index`

    @property
    def red(self) -> bool:
        return self.status != "passed"


@dataclass(frozen=True)
class SessionOutcome:
    """A row's verdict from its runs (see the module docstring)."""

    verdict: Verdict
    runs: tuple[CommandOutcome, ...] = ()

    @property
    def last(self) -> CommandOutcome | None:
        return self.runs[-1] if self.runs else None

    @property
    def check(self) -> CommandOutcome | None:
        """The run that proved the work: the last one, when the row is solved."""
        return self.last if self.verdict == "solved" else None


# ---- the steps of an episode ----------------------------------------------------------------


def shell_command(name: str, arguments: Any) -> str | None:
    """The command line a shell tool call ran (Claude Code `Bash {"command"}`, Codex
    `exec_command {"cmd"}`, older Codex `shell {"command": [argv]}`), else None."""
    if name not in SHELL_TOOLS:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip() or None
    if not isinstance(arguments, dict):
        return None
    value = arguments.get("cmd", arguments.get("command"))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) == 3 and value[0] in ("bash", "sh", "zsh") and value[1] in ("-lc", "-c"):
            return value[2].strip() or None
        return shlex.join(value) or None
    return value.strip() or None if isinstance(value, str) else None


def _call_parts(call: Any) -> tuple[str, str, Any] | None:
    if not isinstance(call, dict):
        return None
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else call
    name = fn.get("name")
    if not isinstance(name, str):
        return None
    return str(call.get("id") or ""), name, fn.get("arguments", fn.get("input"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def tool_steps(it: Interaction) -> list[ToolStep]:
    """The shell commands of `it`'s episode with their results, in order: a harvested turn's
    calls and `meta["tool_results"]`, else the tool turns of its messages (a proxy row)."""
    calls: list[tuple[str, str, Any]] = []
    results: dict[str, dict[str, Any]] = {}
    logged = it.meta.get("tool_results") if isinstance(it.meta, dict) else None
    if isinstance(logged, list):
        calls = [p for p in map(_call_parts, it.tool_calls or []) if p is not None]
        results = {str(r.get("tool_call_id")): r for r in logged if isinstance(r, dict)}
    else:
        for msg in it.messages:
            if not isinstance(msg, dict):
                continue
            calls += [p for p in map(_call_parts, msg.get("tool_calls") or []) if p is not None]
            if msg.get("role") == "tool" and msg.get("tool_call_id"):
                results[str(msg["tool_call_id"])] = {"content": msg.get("content")}
    steps = []
    for index, (call_id, name, arguments) in enumerate(calls):
        command = shell_command(name, arguments)
        result = results.get(call_id)
        if command is None or result is None:
            continue
        code = result.get("exit_code")
        flag = result.get("is_error")
        steps.append(
            ToolStep(
                index=index,
                call_id=call_id,
                tool=name,
                command=command,
                output=_text(result.get("content")),
                is_error=flag if isinstance(flag, bool) else None,
                exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            )
        )
    return steps


# ---- one command ----------------------------------------------------------------------------

_SEPARATOR = re.compile(r"\s*(\|\||&&|;|\||\n)\s*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
# wrappers that run the next word as the command
_WRAPPERS = {
    ("uv", "run"), ("poetry", "run"), ("pipenv", "run"), ("hatch", "run"), ("pdm", "run"),
    ("rye", "run"), ("bundle", "exec"), ("pnpm", "exec"), ("npm", "exec"), ("yarn", "exec"),
}  # fmt: skip
_PREFIXES = ("npx", "bunx", "env", "time", "nice", "command", "exec")

_TEST_RUNNERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rx))
    for name, rx in (
        ("pytest", r"^(?:py\.test|pytest)\b|^python[\d.]*\s+-m\s+pytest\b"),
        (
            "unittest",
            r"^python[\d.]*\s+-m\s+unittest\b|^(?:python[\d.]*\s+)?(?:\./)?manage\.py\s+test\b",
        ),
        ("tox", r"^(?:tox|nox)\b"),
        ("npm", r"^(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?(?:test|t)\b(?!:?build)"),
        ("js", r"^(?:(?:yarn|pnpm)\s+)?(?:jest|vitest|mocha|ava)\b"),
        ("go", r"^go\s+test\b"),
        ("cargo", r"^cargo\s+(?:test|nextest)\b"),
        ("make", r"^make\b(?:\s+\S+)*?\s+(?:test|tests|check)\b"),
        ("rspec", r"^(?:rspec|rake\s+(?:test|spec))\b"),
        ("jvm", r"^(?:mvn|mvnw|gradle|gradlew)\b.*\b(?:test|check|verify)\b"),
        ("dotnet", r"^dotnet\s+test\b"),
        ("other", r"^(?:phpunit|ctest|deno\s+test|mix\s+test|swift\s+test|bun\s+test)\b"),
    )
)
_BUILDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rx))
    for name, rx in (
        ("cargo", r"^cargo\s+(?:build|check|clippy)\b"),
        ("go", r"^go\s+(?:build|vet)\b"),
        ("tsc", r"^tsc\b"),
        ("cc", r"^(?:gcc|g\+\+|clang|clang\+\+|cc|c\+\+)\b"),
        ("javac", r"^javac\b"),
        ("make", r"^make\b|^cmake\s+--build\b"),
        ("npm", r"^(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?build\b"),
        ("jvm", r"^(?:mvn|mvnw|gradle|gradlew)\b.*\b(?:compile|package|build|assemble)\b"),
        ("dotnet", r"^dotnet\s+build\b"),
        ("python", r"^python[\d.]*\s+-m\s+(?:py_compile|compileall)\b"),
    )
)

_M = re.MULTILINE
_EXIT_CLAUDE = re.compile(r"\A\s*(?:Error: )?Exit code (\d+)\b")
_EXIT_CODEX = re.compile(r"^Process exited with code (-?\d+)$", _M)
_PYTEST = re.compile(
    r"^=*\s*((?:\d+ (?:failed|passed|errors?|skipped|xfailed|xpassed|deselected|warnings?|"
    r"rerun)(?:, )?)+)\s+in [\d.]+\s*s\b.*$|^=*\s*no tests ran\b.*$",
    _M,
)
_UNITTEST_END = re.compile(r"^(OK(?: \([^)\n]*\))?|FAILED \([^)\n]*\))\s*$", _M)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", _M)
_JEST = re.compile(r"^\s*Tests:\s+(.*\d+ total)\s*$", _M)
_JEST_SUITES = re.compile(r"^\s*Test Suites:\s+(.*\d+ total)\s*$", _M)
_VITEST = re.compile(r"^\s*Tests\s+((?:\d+ \w+(?: \| )?)+)\s*\(\d+\)\s*$", _M)
_MOCHA = re.compile(r"^\s*(\d+) (passing|failing)\b", _M)
_GO = re.compile(r"^(ok|FAIL|PASS|---[ \t]+FAIL:)(?:[ \t]+\S.*)?$", _M)
_GO_BUILD = re.compile(r"^.*\[(?:build|setup) failed\].*$", _M)
_CARGO = re.compile(r"^test result: (ok|FAILED)\. (\d+) passed; (\d+) failed.*$", _M)
_RSPEC = re.compile(r"^(\d+) examples?, (\d+) failures?.*$", _M)
_MAKE_FAIL = re.compile(r"^make(?:\[\d+\])?: \*\*\* .*Error \d+.*$", _M)
_NPM_FAIL = re.compile(r"^npm (?:ERR!|error) (?:Test failed|code ELIFECYCLE|.*failed).*$", _M)
_COMPILE = re.compile(
    r"^error(?:\[E\d{4}\])?: .*$|^error: could not compile .*$|^.*\berror TS\d+: .*$"
    r"|^\S+\.(?:c|cc|cpp|cxx|h|hpp|go|java|kt|swift|m|rs):\d+(?::\d+)?: (?:fatal )?error:? .*$"
    r"|^\S+\.cs\(\d+,\d+\): error CS\d+: .*$|^\s*(?:SyntaxError|IndentationError): .*$"
    r"|^.*undefined reference to .*$|^\S+\.go:\d+:\d+: .*$",
    _M,
)
_NOT_FOUND = re.compile(r"command not found|No such file or directory|not recognized as", re.I)


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return segment.split()


def _head(segment: str) -> str:
    """The segment as the runner sees it: env assignments, wrappers and the path of the
    program left out (`PYTHONPATH=. .venv/bin/python -m pytest` → `python -m pytest`)."""
    words = _words(segment)
    while words:
        pair = (words[0], words[1]) if len(words) > 1 else None
        if _ASSIGNMENT.match(words[0]) or words[0] in _PREFIXES:
            words = words[1:]
        elif pair is not None and (pair in _WRAPPERS or pair[0] == "timeout"):
            words = words[2:]
        else:
            break
    if not words:
        return ""
    words[0] = words[0].rsplit("/", 1)[-1]
    return " ".join(words)


def split_command(command: str) -> list[tuple[str, str]]:
    """(segment, the separator after it) of a shell line: `a && b | c` → [(a, &&), (b, |),
    (c, "")]. A plain split (quotes holding a separator are rare in test commands)."""
    parts = _SEPARATOR.split(command.strip())
    segments, seps = parts[0::2], parts[1::2] + [""]
    return [(s, sep) for s, sep in zip(segments, seps, strict=True) if s.strip()]


def find_runner(command: str) -> tuple[RunKind, str, int] | None:
    """(kind, runner, index of the segment) of the first test run in `command`, else its
    first build, else None."""
    segments = [_head(s) for s, _ in split_command(command)]
    tables: tuple[tuple[RunKind, tuple[tuple[str, re.Pattern[str]], ...]], ...] = (
        ("test", _TEST_RUNNERS),
        ("build", _BUILDS),
    )
    for kind, table in tables:
        for i, head in enumerate(segments):
            for name, pattern in table:
                if pattern.search(head):
                    return kind, name, i
    return None


def _exit_code(
    step_output: str, exit_code: int | None, is_error: bool | None, tool: str
) -> int | None:
    if exit_code is not None:
        return exit_code
    m = _EXIT_CLAUDE.match(step_output) or _EXIT_CODEX.search(step_output[:600])
    if m is not None:
        return int(m.group(1))
    if is_error is False and tool == "Bash":  # Claude Code flags every non-zero exit
        return 0
    return None


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"


def read_summary(output: str) -> tuple[RunStatus, str] | None:
    """(status, the summary line) from a runner's own summary, else None."""
    text = output[-TAIL_CHARS:]
    compile_error = _COMPILE.search(text)
    m = _last(_PYTEST, text)
    if m is not None:
        line = m.group(0).strip("= ")
        counts = dict((w, int(n)) for n, w in re.findall(r"(\d+) (\w+)", line))
        if line.startswith("no tests ran"):
            return "error", _clip(line)
        if counts.get("failed"):
            return "failed", _clip(line)
        if counts.get("error") or counts.get("errors"):
            return "error", _clip(line)
        return ("passed", _clip(line)) if counts.get("passed") else ("error", _clip(line))
    m = _last(_UNITTEST_END, text)
    if m is not None and _UNITTEST_RAN.search(text):
        ran = _last(_UNITTEST_RAN, text)
        n = ran.group(1) if ran else "?"
        line = f"Ran {n} test{'' if n == '1' else 's'}: {m.group(1)}"
        if ran is not None and ran.group(1) == "0":
            return "error", _clip(line)
        return ("passed" if m.group(1).startswith("OK") else "failed"), _clip(line)
    m = _last(_JEST, text) or _last(_VITEST, text)
    if m is not None:
        line = m.group(0).strip()
        return ("failed" if re.search(r"\b[1-9]\d* failed", line) else "passed"), _clip(line)
    m = _last(_JEST_SUITES, text)
    if m is not None and re.search(r"\b[1-9]\d* failed", m.group(1)):
        return "error", _clip(m.group(0))
    m = _last(_CARGO, text)
    if m is not None:
        return ("passed" if m.group(1) == "ok" else "failed"), _clip(m.group(0))
    m = _last(_RSPEC, text)
    if m is not None:
        return ("failed" if int(m.group(2)) else "passed"), _clip(m.group(0))
    mocha = dict((w, int(n)) for n, w in _MOCHA.findall(text))
    if mocha:
        line = ", ".join(f"{n} {w}" for w, n in mocha.items())
        return ("failed" if mocha.get("failing") else "passed"), _clip(line)
    m = _GO_BUILD.search(text)
    if m is not None:
        return "error", _clip((compile_error or m).group(0))
    go = [g.group(0) for g in _GO.finditer(text)]
    if go:
        failed = [g for g in go if g.startswith(("FAIL", "---"))]
        return ("failed", _clip(failed[-1])) if failed else ("passed", _clip(go[-1]))
    if compile_error is not None:
        return "error", _clip(compile_error.group(0))
    m = _last(_MAKE_FAIL, text) or _last(_NPM_FAIL, text)
    if m is not None:
        return "failed", _clip(m.group(0))
    return None


def reliable_exit(command: str, at: int) -> bool:
    """The line's exit status is the runner's: no command after it but through `&&`."""
    segments = split_command(command)
    return all(sep == "&&" for _, sep in segments[at:-1]) and segments[at][1] in ("", "&&")


def read_command(
    command: str,
    output: str,
    *,
    exit_code: int | None = None,
    is_error: bool | None = None,
    tool: str = "",
    step: int = 0,
) -> CommandOutcome | None:
    """The outcome of one shell command when it ran tests or a build, else None."""
    found = find_runner(command)
    if found is None:
        return None
    kind, runner, at = found
    code = _exit_code(output, exit_code, is_error, tool)
    if code is not None and not reliable_exit(command, at):
        code = None
    summary = read_summary(output)
    status: RunStatus
    if code is not None:
        said = summary[1] if summary else f"exit {code}"
        could_not_test = (
            (summary is not None and summary[0] == "error")
            or code in (126, 127)
            or (runner == "pytest" and code in (4, 5))
            or kind == "build"
            or _COMPILE.search(output[-TAIL_CHARS:]) is not None
        )
        status = "passed" if code == 0 else "error" if could_not_test else "failed"
    elif summary is not None:
        status, said = summary
    elif _NOT_FOUND.search(output[:400]) and kind == "test":
        status, said = "error", _clip(output.strip().splitlines()[0])
    else:
        return None
    return CommandOutcome(command, kind, runner, status, said, code, step)


def read_steps(steps: Iterable[ToolStep]) -> list[CommandOutcome]:
    out = []
    for s in steps:
        outcome = read_command(
            s.command,
            s.output,
            exit_code=s.exit_code,
            is_error=s.is_error,
            tool=s.tool,
            step=s.index,
        )
        if outcome is not None:
            out.append(outcome)
    return out


def judge(runs: list[CommandOutcome], red_before: bool = False) -> Verdict:
    """solved / failed / none for a row's runs (`red_before`: the session's previous row
    ended red)."""
    if not runs:
        return "none"
    if runs[-1].red:
        return "failed"
    return "solved" if red_before or any(r.red for r in runs[:-1]) else "none"


def read_session(rows: Iterable[Interaction]) -> dict[str, SessionOutcome]:
    """Each row's outcome (by row id), the rows of one session read oldest first so a row
    that fixes what the previous one left red is solved."""
    by_session: dict[tuple[str, str], list[Interaction]] = {}
    out: dict[str, SessionOutcome] = {}
    for it in rows:
        key = (it.project, it.session_id or f"row:{it.id}")
        by_session.setdefault(key, []).append(it)
    for members in by_session.values():
        red = False
        for it in sorted(members, key=lambda r: (r.created_at, r.id)):
            runs = read_steps(tool_steps(it))
            out[it.id] = SessionOutcome(judge(runs, red), tuple(runs))
            if runs:
                red = runs[-1].red
    return out
