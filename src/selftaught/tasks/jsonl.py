"""A task from the user's own JSONL file: one example per line.

Each line is a JSON object with
  - `input` (a string, or a chat list as in OpenAI evals) or `messages` (a chat list of
    {"role", "content"}), required; a chat list that ends with an assistant turn (OpenAI's
    chat fine-tuning format) has that turn taken off the prompt: it is the reference unless
    the line gives one;
  - `id` (optional; default: the line number), unique in the file;
  - `reference`, or `ideal` as in OpenAI evals (a string or a list of acceptable answers;
    required, except for lines scored by `llm_judge` other than its reference mode);
  - `split` (optional): "train", "val" or "test";
  - `scorer` (optional): overrides the task's scorer for this line;
  - `workspace` (optional): a folder (relative to the JSONL file) copied afresh for each
    rollout; a coding agent works in the copy;
  - `check` (optional): a command (a string split as a shell would, or a list of arguments)
    run in the sandbox on the files the agent left in its workspace (a copy of `workspace`,
    or an empty folder): exit 0 is solved, its output the feedback (see
    `selftaught.tasks.check`). A line with a check is scored by it alone: `reference` is then
    optional (kept for worked examples) and `scorer` is refused. A chat model changes no
    files, so the check runs on the untouched copy. `check_timeout` (seconds) overrides the
    task's limit for this line;
  - anything else is kept in `Example.state` (e.g. `rubric` for llm_judge).

Lines without `split` are assigned by a seeded hash of their id, so a line keeps its split
across runs and when other lines are added. A line whose input repeats an earlier line's
input follows that line's split (an input seen in training never lands in val or test).
The whole file is parsed and validated before the task exists: nothing is half-loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError
from selftaught.models.base import ChatModel
from selftaught.runs import iter_jsonl
from selftaught.tasks.base import SPLITS, Example, Score, Split, TaskError, TaskKind
from selftaught.tasks.check import (
    DEFAULT_CHECK_MEMORY_MB,
    DEFAULT_CHECK_TIMEOUT_S,
    MAX_WORKSPACE_BYTES,
    Check,
    parse_check,
    run_check,
)
from selftaught.tasks.sandbox import Sandbox, open_sandbox
from selftaught.tasks.scorers import JUDGE_SCORER, Scorer, compile_pattern, get_scorer
from selftaught.workspace import Workspace, WorkspaceSpec, folder_bytes

_RESERVED_KEYS = {
    "id", "input", "messages", "reference", "ideal", "split", "scorer",
    "workspace", "check", "check_timeout",
}  # fmt: skip
_ROLES = {"system", "user", "assistant"}


def hash_split(example_id: str, seed: int, val_fraction: float, test_fraction: float) -> Split:
    """A stable split for an id: a seeded hash mapped to [0, 1)."""
    digest = hashlib.sha256(f"{seed}\x00{example_id}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    if unit < test_fraction:
        return "test"
    if unit < test_fraction + val_fraction:
        return "val"
    return "train"


class JsonlTask:
    """An agent task read from a JSONL file (see the module docstring for the line format)."""

    kind: TaskKind = "agent"

    def __init__(
        self,
        path: str | Path,
        scorer: str | Scorer = "normalized",
        *,
        judge_model: ChatModel | None = None,
        rubric: str | Path | None = None,
        judge_options: Mapping[str, Any] | None = None,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        name: str | None = None,
        instructions: str = "",
        unsafe_exec: bool = False,
        check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
        check_memory_mb: int = DEFAULT_CHECK_MEMORY_MB,
        train_size: int | None = None,
        val_size: int | None = None,
        test_size: int | None = None,
    ):
        self.path = Path(path)
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1):
            raise TaskError(
                f"val_fraction and test_fraction must be in [0, 1), got "
                f"{val_fraction} and {test_fraction}"
            )
        if val_fraction + test_fraction >= 1:
            raise TaskError(
                f"val_fraction + test_fraction must leave room for training, got "
                f"{val_fraction} + {test_fraction}"
            )
        self.name = name or self.path.stem
        self.instructions = instructions
        self.seed = seed
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self._judge_model = judge_model
        self._rubric = rubric
        self._judge_options = dict(judge_options or {})
        self._scorers: dict[str, Scorer] = {}
        if isinstance(scorer, str):
            self.scorer_name = scorer
            self.default_scorer = self._scorer(scorer, where=str(self.path))
        else:
            self.scorer_name = getattr(scorer, "name", getattr(scorer, "__name__", "custom"))
            self.default_scorer = scorer
        self._scorer_by_id: dict[str, Scorer] = {}
        self._splits: dict[str, list[Example]] = {s: [] for s in SPLITS}
        self.check_timeout_s = check_timeout_s
        self.check_memory_mb = check_memory_mb
        self._workspaces: dict[str, Path] = {}  # id -> the folder copied for each rollout
        self._checks: dict[str, Check] = {}
        self._load()
        self.sandbox: Sandbox | None = None
        if self._checks:  # decided once: a sandbox that breaks mid-run is an error
            self.sandbox = open_sandbox(unsafe_exec=unsafe_exec)
            if not self.sandbox.isolated:
                self.name = f"{self.name}[unsafe-exec]"
        self._take({"train": train_size, "val": val_size, "test": test_size})

    # --- loading ---------------------------------------------------------------------------

    def _scorer(self, name: str, *, where: str) -> Scorer:
        if name not in self._scorers:
            try:
                judge_options = self._judge_options if name == JUDGE_SCORER else {}
                self._scorers[name] = get_scorer(
                    name, self._judge_model, self._rubric, **judge_options
                )
            except ValueError as err:
                raise TaskError(f"{where}: {err}") from err
        return self._scorers[name]

    def _load(self) -> None:
        if not self.path.is_file():
            raise TaskError(f"{self.path}: no such JSONL file")
        splits: dict[str, list[Example]] = {s: [] for s in SPLITS}
        scorer_by_id: dict[str, Scorer] = {}
        line_of_id: dict[str, int] = {}
        split_of_prompt: dict[str, tuple[str, int, bool]] = {}  # prompt -> split, line, explicit
        for lineno, row in iter_jsonl(self.path, TaskError):
            where = f"{self.path}:{lineno}"
            example, explicit_split, scorer_name = self._parse_row(row, lineno, where)
            if example.id in line_of_id:
                raise TaskError(
                    f"{where}: duplicate id {example.id!r} "
                    f"(first used on line {line_of_id[example.id]})"
                )
            line_of_id[example.id] = lineno

            scorer = self.default_scorer
            if scorer_name is not None:
                scorer = self._scorer(scorer_name, where=where)
            if not self._parse_workspace(row, example.id, where):
                self._check_reference(example, scorer_name or self.scorer_name, scorer, where)

            prompt = example.prompt_text().strip()
            split = explicit_split
            if prompt in split_of_prompt:
                first_split, first_line, first_explicit = split_of_prompt[prompt]
                if split is None:
                    split = first_split
                elif split != first_split:
                    how = "given" if first_explicit else "assigned by hash"
                    raise TaskError(
                        f"{where}: split {split!r}, but line {first_line} has the same input "
                        f"in split {first_split!r} ({how}); validation that overlaps "
                        "training is refused"
                    )
            if split is None:
                split = hash_split(example.id, self.seed, self.val_fraction, self.test_fraction)
            split_of_prompt.setdefault(prompt, (split, lineno, explicit_split is not None))
            splits[split].append(example)
            scorer_by_id[example.id] = scorer
        if not line_of_id:
            raise TaskError(f"{self.path}: the file holds no examples (empty JSONL file)")
        self._splits = splits
        self._scorer_by_id = scorer_by_id

    def _parse_row(
        self, row: dict[str, Any], lineno: int, where: str
    ) -> tuple[Example, str | None, str | None]:
        raw_id = row.get("id", lineno)
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or str(raw_id) == "":
            raise TaskError(
                f"{where}: `id` must be a non-empty string or an integer, got {raw_id!r}"
            )
        example_id = str(raw_id)

        has_input, has_messages = "input" in row, "messages" in row
        if has_input and has_messages:
            raise TaskError(f"{where}: give either `input` or `messages`, not both")
        if not has_input and not has_messages:
            raise TaskError(f"{where}: missing `input` (a string) or `messages` (a chat list)")
        if "reference" in row and "ideal" in row:
            raise TaskError(f"{where}: give either `reference` or `ideal`, not both")
        reference = row.get("reference", row.get("ideal"))
        given: str | list[dict[str, Any]]
        given = row["input"] if has_input else row["messages"]
        if isinstance(given, list):
            field = "input" if has_input else "messages"
            self._check_messages(given, where, field)
            if given[-1]["role"] == "assistant":  # the answer, not part of the prompt
                if reference is None:
                    reference = given[-1]["content"]
                given = given[:-1]
        elif not has_input:
            raise TaskError(f"{where}: `messages` must be a non-empty list of chat messages")
        elif not isinstance(given, str) or not given.strip():
            raise TaskError(f"{where}: `input` must be a non-empty string or a chat list")

        split = row.get("split")
        if split is not None and split not in SPLITS:
            raise TaskError(f"{where}: `split` must be one of {', '.join(SPLITS)}, got {split!r}")
        scorer_name = row.get("scorer")
        if scorer_name is not None and not isinstance(scorer_name, str):
            raise TaskError(f"{where}: `scorer` must be a scorer name, got {scorer_name!r}")

        state = {k: v for k, v in row.items() if k not in _RESERVED_KEYS}
        example = Example(id=example_id, input=given, reference=reference, state=state)
        return example, split, scorer_name

    def _parse_workspace(self, row: dict[str, Any], example_id: str, where: str) -> bool:
        """Record the line's `workspace` and `check`; True when a check scores it."""
        if "workspace" in row:
            given = row["workspace"]
            if not isinstance(given, str) or not given.strip():
                raise TaskError(f"{where}: `workspace` must be a folder path")
            folder = (self.path.parent / given).resolve()
            if not folder.is_dir():
                raise TaskError(f"{where}: workspace {given!r} is not a folder ({folder})")
            self._workspaces[example_id] = folder
        if "check" not in row:
            if "check_timeout" in row:
                raise TaskError(f"{where}: `check_timeout` without a `check`")
            return False
        if "scorer" in row:
            raise TaskError(f"{where}: a line with a `check` is scored by it; drop `scorer`")
        timeout = row.get("check_timeout", self.check_timeout_s)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise TaskError(f"{where}: `check_timeout` must be a number of seconds > 0")
        workspace = self._workspaces.get(example_id)
        if workspace is not None and folder_bytes(workspace) > MAX_WORKSPACE_BYTES:
            raise TaskError(
                f"{where}: workspace {workspace} is larger than the "
                f"{MAX_WORKSPACE_BYTES // 2**20} MiB a check can take"
            )
        argv = parse_check(row["check"], where)
        self._checks[example_id] = Check(argv, float(timeout), self.check_memory_mb)
        return True

    @staticmethod
    def _check_messages(messages: Any, where: str, field: str = "messages") -> None:
        if not isinstance(messages, list) or not messages:
            raise TaskError(f"{where}: `{field}` must be a non-empty list of chat messages")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
                raise TaskError(
                    f"{where}: {field}[{i}] needs a `role` in {sorted(_ROLES)}, got {msg!r:.80}"
                )
            if not isinstance(msg.get("content"), str):
                raise TaskError(f"{where}: {field}[{i}] needs a string `content`")
        if not any(m["role"] == "user" for m in messages):
            raise TaskError(f"{where}: `{field}` has no user message")

    @staticmethod
    def _check_reference(example: Example, scorer_name: str, scorer: Scorer, where: str) -> None:
        ref = example.reference
        missing = ref is None or (isinstance(ref, list) and not ref)
        if scorer_name == JUDGE_SCORER:
            if missing and getattr(scorer, "needs_reference", False):  # the reference judge
                raise TaskError(
                    f"{where}: missing `reference` (the reference-guided judge needs one)"
                )
            return
        if missing:
            raise TaskError(f"{where}: missing `reference` (scorer {scorer_name!r} needs one)")
        if scorer_name == "json_match" and isinstance(ref, str):
            try:
                json.loads(ref)
            except json.JSONDecodeError as err:
                raise TaskError(f"{where}: `reference` is not valid JSON ({err.msg})") from err
        if scorer_name == "regex":
            for pattern in ref if isinstance(ref, list) else [ref]:
                try:
                    compile_pattern(str(pattern))
                except TaskError as err:
                    raise TaskError(f"{where}: {err}") from err

    def _take(self, sizes: dict[str, int | None]) -> None:
        """Each split's first N lines, in file order (a split asked for more lines than it
        holds is refused: a size is never silently not met)."""
        for split, size in sizes.items():
            if size is None:
                continue
            have = len(self._splits[split])
            if size > have:
                raise ConfigError(
                    f"{self.path}: {split}_size {size} asked, but the {split} split holds "
                    f"{have} lines (seeded hash split, val_fraction {self.val_fraction}, "
                    f"test_fraction {self.test_fraction}, or the lines' own `split`)"
                )
            self._splits[split] = self._splits[split][:size]

    # --- Task protocol ---------------------------------------------------------------------

    def examples(self, split: Split) -> list[Example]:
        if split not in self._splits:
            raise TaskError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
        return list(self._splits[split])

    def score(self, output: str, example: Example) -> Score:
        """The reply's score; a line with a check runs it on an untouched copy of its
        workspace (the reply alone changes no files)."""
        if example.id in self._checks:
            workspace = Workspace.create(self._workspaces.get(example.id))
            try:
                return self.score_workspace(output, example, workspace.path)
            finally:
                workspace.remove()
        scorer = self._scorer_by_id.get(example.id, self.default_scorer)
        return scorer(output, example)

    def workspace_for(self, example: Example) -> WorkspaceSpec | None:
        """The folder a rollout on `example` works in (None: the line needs none)."""
        if example.id not in self._checks and example.id not in self._workspaces:
            return None
        return WorkspaceSpec(self._workspaces.get(example.id))

    def score_workspace(self, output: str, example: Example, workspace: Path) -> Score:
        """The score of a rollout that worked in `workspace`: the line's check on its files,
        or, without a check, the reply's score."""
        check = self._checks.get(example.id)
        if check is None:
            return self.score(output, example)
        assert self.sandbox is not None
        return run_check(self.sandbox, check, workspace)

    def __len__(self) -> int:
        return sum(len(v) for v in self._splits.values())

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(self._splits[s])}" for s in SPLITS)
        return f"JsonlTask({str(self.path)!r}, scorer={self.scorer_name!r}, {sizes})"
