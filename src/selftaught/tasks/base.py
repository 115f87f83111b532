"""The Task protocol: a family of problems with train / val / test splits and a scorer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from selftaught.errors import TaskError as TaskError
from selftaught.models.base import Message

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
TaskKind = Literal["agent", "game"]
DIFFICULTY = "difficulty"
"""`Example.state` key of an example's difficulty, where its task gives one (a real number,
higher is harder): what the skill trainer's curriculum orders the first epoch by."""


@dataclass
class Example:
    """One problem. `input` is text or chat messages; `state` is whatever the scorer needs
    (and, where the task has them, its `tags` and its `difficulty`)."""

    id: str
    input: str | list[Message]
    reference: Any = None
    state: dict[str, Any] = field(default_factory=dict)

    def prompt_text(self) -> str:
        if isinstance(self.input, str):
            return self.input
        return "\n".join(str(m.get("content", "")) for m in self.input if m.get("role") == "user")


@dataclass
class Score:
    """hard: 0/1 solved; soft: 0..1 partial credit; feedback: why, in the scorer's words."""

    hard: float
    soft: float
    feedback: str = ""

    def __post_init__(self) -> None:
        if self.hard not in (0, 1, 0.0, 1.0):
            raise TaskError(f"hard score must be 0 or 1, got {self.hard!r}")
        if not 0.0 <= self.soft <= 1.0:
            raise TaskError(f"soft score must be in [0, 1], got {self.soft!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"hard": self.hard, "soft": self.soft, "feedback": self.feedback}


@runtime_checkable
class Task(Protocol):
    """What is practised. `kind == "game"` means the answer is a JSON strategy
    (see `GameTask`); `"agent"` means free text, scored as free text."""

    name: str
    kind: TaskKind
    instructions: str  # appended to each user prompt: how to present the answer

    def examples(self, split: Split) -> list[Example]: ...

    def score(self, output: str, example: Example) -> Score: ...


@runtime_checkable
class GameTask(Task, Protocol):
    """A game: the policy answers with a JSON strategy validated against `schema`;
    the score comes from playing a seeded simulator."""

    schema: dict[str, Any]


def distinct_splits(
    sizes: dict[str, int], draw: Callable[[str], Example], name: str
) -> dict[str, list[Example]]:
    """Splits drawn from one seeded stream (`draw(id)` makes the next example), de-duplicated
    by input, test first, then val, then train, so they never overlap; a stream that cannot
    fill a split fails with a clear error instead of looping."""
    seen: set[str] = set()
    out: dict[str, list[Example]] = {}
    for split in ("test", "val", "train"):
        examples: list[Example] = []
        tries = 0
        while len(examples) < sizes[split]:
            tries += 1
            if tries > 50 * (sizes[split] + 10):
                raise TaskError(
                    f"{name}: cannot generate {sizes[split]} distinct {split} examples; "
                    "lower the split sizes"
                )
            example = draw(f"{split}-{len(examples):05d}")
            key = example.prompt_text()
            if key in seen:
                continue
            seen.add(key)
            examples.append(example)
        out[split] = examples
    return out


def split_sizes(train_size: int, val_size: int, test_size: int) -> dict[str, int]:
    """The three split sizes by name, each checked to be an integer >= 0."""
    sizes = {"train": train_size, "val": val_size, "test": test_size}
    for split, size in sizes.items():
        if not isinstance(size, int) or size < 0:
            raise TaskError(f"{split}_size must be an integer >= 0, got {size!r}")
    return sizes


def check_disjoint(task: Task) -> None:
    """Fail closed when val or test overlap train (by id or by prompt text)."""
    seen: dict[str, str] = {}
    for split in SPLITS:
        for ex in task.examples(split):
            key = ex.prompt_text().strip()
            if key in seen and seen[key] != split:
                raise TaskError(
                    f"task {task.name!r}: example {ex.id!r} in split {split!r} also appears in "
                    f"split {seen[key]!r}; validation that overlaps training is refused"
                )
            seen.setdefault(key, split)
