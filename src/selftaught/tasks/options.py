"""How a task spec is loaded: `TaskOptions`, one config for every task source (the CLI's task
flags are generated from it). A task source takes the options it can honour; an option it
cannot honour is a `ConfigError` naming it, never silently ignored."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from selftaught.errors import ConfigError
from selftaught.models.resolve import ModelLike
from selftaught.tasks.scorers import JUDGE_MODES, JudgeMode

DEFAULT_SEED = 0
"""Seeds a task's generator and its train / val / test split."""


class SizeKeywords(TypedDict, total=False):
    """The split sizes a task constructor takes as keywords (those set)."""

    train_size: int
    val_size: int
    test_size: int


@dataclass(frozen=True)
class TaskOptions:
    """Seed, split sizes and fractions, scorer and judge of a task spec
    (`load_task(spec, TaskOptions(...))`). Unset (None) leaves the task's own choice."""

    seed: int = DEFAULT_SEED
    """Seed for task splits and sampling."""
    train_size: int | None = None
    """Train split size (unset: the task's own). A JSONL file's first N train lines."""
    val_size: int | None = None
    """Val split size (unset: the task's own). A JSONL file's first N val lines."""
    test_size: int | None = None
    """Test split size (unset: the task's own). A JSONL file's first N test lines."""
    val_fraction: float | None = None
    """JSONL tasks: the share of lines without a `split` that go to val (unset: the task's
    own)."""
    test_fraction: float | None = None
    """JSONL tasks: the share of lines without a `split` that go to test (unset: the task's
    own)."""
    scorer: str | None = None
    """Scorer for JSONL tasks: exact | normalized | numeric | quantity | contains | regex |
    json_match | llm_judge (unset: normalized)."""
    judge_model: ModelLike | None = None
    """Judge model spec for the llm_judge scorer (its calls are charged to the role `judge`)."""
    rubric: Path | None = None
    """Rubric file for the llm_judge scorer."""
    # judge variants (issue 52): each off unless set, for a dev-seed comparison
    judge_samples: int | None = None
    """llm_judge: judge calls per reply, the verdict their median (unset: 1; more than 1 runs
    at the judge's sampling temperature, 0.7)."""
    judge_mode: JudgeMode | None = None
    """llm_judge: absolute (a 0-10 score against the rubric) | reference (the reference shown
    first: does the reply give its answer? every line needs a reference) | pairwise (which of
    the reply and a baseline reply better meets the rubric; needs --judge-baselines)
    (unset: absolute)."""
    judge_baselines: Path | None = None
    """llm_judge pairwise: a JSONL file of {"id", "reply"} lines, each example's baseline
    reply."""
    unsafe_exec: bool = False
    """Where bubblewrap is missing, run model-written code with resource limits only (it can
    read your files and use the network); and allow the reasoning-gym tasks whose own scorers
    evaluate the answer as Python inside this selftaught process, unsandboxed even when
    bubblewrap is installed. Without this such tasks refuse."""

    def __post_init__(self) -> None:
        if self.judge_mode is not None and self.judge_mode not in JUDGE_MODES:
            raise ConfigError(
                f"judge_mode must be one of {', '.join(JUDGE_MODES)}, got {self.judge_mode!r}"
            )
        samples = self.judge_samples
        if samples is not None and (
            isinstance(samples, bool) or not isinstance(samples, int) or samples < 1
        ):
            raise ConfigError(f"judge_samples must be an integer >= 1, got {samples!r}")
        for name in ("train_size", "val_size", "test_size"):
            size = getattr(self, name)
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
                raise ConfigError(f"{name} must be an integer >= 0, got {size!r}")
            if size is not None and size < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {size!r}")

    @classmethod
    def of(
        cls, options: TaskOptions | Mapping[str, Any] | None = None, **fields: Any
    ) -> TaskOptions:
        """Options from an instance, a dict of fields or None, with `fields` on top."""
        base = options if isinstance(options, TaskOptions) else cls(**dict(options or {}))
        try:
            return dataclasses.replace(base, **fields)
        except TypeError as err:  # an unknown keyword
            known = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ConfigError(f"unknown task option ({err}); task options are: {known}") from None

    def given(self) -> list[str]:
        """The options set to something other than their default, by name."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default and getattr(self, f.name) is not None
        ]

    def judge_options(self) -> dict[str, Any]:
        """The llm_judge keywords these options set (`LlmJudge(samples=, mode=, baseline=)`)."""
        from selftaught.tasks.scorers import read_baselines

        options: dict[str, Any] = {}
        if self.judge_samples is not None:
            options["samples"] = self.judge_samples
        if self.judge_mode is not None:
            options["mode"] = self.judge_mode
        if self.judge_baselines is not None:
            options["baseline"] = read_baselines(self.judge_baselines)
            options["seed"] = self.seed  # the A / B order is drawn with the task's seed
        return options

    def sizes(self) -> SizeKeywords:
        """The split sizes that were set, as constructor keywords."""
        sizes: SizeKeywords = {}
        if self.train_size is not None:
            sizes["train_size"] = self.train_size
        if self.val_size is not None:
            sizes["val_size"] = self.val_size
        if self.test_size is not None:
            sizes["test_size"] = self.test_size
        return sizes

    def refuse(self, source: str, honoured: set[str], why: str = "") -> None:
        """ConfigError naming the options `source` cannot honour (never ignore one)."""
        bad = [name for name in self.given() if name not in honoured]
        if bad:
            flags = ", ".join("--" + n.replace("_", "-") for n in bad)
            raise ConfigError(
                f"{source} cannot honour {flags}"
                + (f" ({why})" if why else "")
                + f"; it takes {', '.join('--' + n.replace('_', '-') for n in sorted(honoured))}"
            )
