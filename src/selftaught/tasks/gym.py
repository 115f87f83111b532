"""reasoning-gym tasks: any of its seeded generators, scored by the generator's own
`score_answer`, with disjoint train / val / test splits of chosen sizes."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from selftaught.tasks.base import DIFFICULTY, Example, Score, Split, TaskError, TaskKind
from selftaught.tasks.extract import extract_answer, extract_number

DEFAULT_INSTRUCTIONS = "Give the final answer only."
_NUMERIC = re.compile(r"^-?\d+(?:\.\d+)?(?:/\d+)?$")


def gym_generators() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _parse_value(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def parse_gym_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`gym:NAME?key=value&key=value` → (NAME, generator kwargs)."""
    body = spec.removeprefix("gym:")
    name, _, query = body.partition("?")
    kwargs: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq:
            raise TaskError(f"gym option {part!r} in {spec!r} must look like key=value")
        kwargs[key] = _parse_value(value)
    return name, kwargs


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def gym_difficulty(metadata: Mapping[str, Any]) -> float | None:
    """An entry's difficulty in [0, 1], from the generator's own metadata: reasoning-gym names
    its difficulty knobs and their configured (min, max) in `metadata["difficulty"]`, and most
    generators give the entry's value of each knob under the same name (chain_sum: num_terms
    (2, 6), num_digits (1, 4)). The mean of each varying knob's position in its range; knobs
    held fixed count for nothing, and where every knob is fixed every entry is 0. None where the
    generator names no knobs, or does not give the entry's value of every one of them
    (word_sequence_reversal names `words`, gives `num_words`): a partial reading is no order."""
    knobs = metadata.get("difficulty")
    if not isinstance(knobs, Mapping) or not knobs:
        return None
    positions: list[float] = []
    for name, bounds in knobs.items():
        value = _number(metadata.get(name))
        if value is None:
            return None
        if not isinstance(bounds, list | tuple) or len(bounds) != 2:
            continue  # a knob given as one value: fixed
        lo, hi = _number(bounds[0]), _number(bounds[1])
        if lo is None or hi is None or hi <= lo:
            continue
        positions.append(min(1.0, max(0.0, (value - lo) / (hi - lo))))
    return sum(positions) / len(positions) if positions else 0.0


# Generators whose own `score_answer` runs the model's answer as Python in this process
# (`eval`, or sympy's `parse_expr`, which evaluates too): found by scoring a reply that
# writes a file, for every generator of reasoning-gym 0.1.25 (tests/test_gym_safety.py
# re-checks the list). They load only with `unsafe_exec=True` (--unsafe-exec).
EVALUATES_ANSWERS = frozenset(
    {"binary_matrix", "countdown", "intermediate_integration", "n_queens"}
    | {"polynomial_multiplication", "puzzle24", "simple_integration", "spiral_matrix"}
    | {"string_insertion"}
)


class GymTask:
    """One reasoning-gym generator as a Task. Splits come from distinct seeds and are
    de-duplicated by question text (test first, then val, then train), so they never overlap."""

    kind: TaskKind = "agent"

    def __init__(
        self,
        generator: str,
        *,
        seed: int = 0,
        train_size: int = 64,  # small enough for one CPU; raise it with --train-size
        val_size: int = 40,
        test_size: int = 200,
        instructions: str = DEFAULT_INSTRUCTIONS,
        unsafe_exec: bool = False,
        **generator_kwargs: Any,
    ):
        valid = gym_generators()
        if generator not in valid:
            close = [g for g in valid if generator in g or g in generator][:8]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise TaskError(
                f"unknown reasoning-gym generator {generator!r}{hint}; "
                f"valid generators: {', '.join(valid)}"
            )
        if generator in EVALUATES_ANSWERS and not unsafe_exec:
            raise TaskError(
                f"gym:{generator}'s own scorer runs the model's answer as Python in this "
                "process (no sandbox), so a reply could read or write your files; refused: "
                "pass --unsafe-exec (unsafe_exec=True) to accept that risk"
            )
        for split, size in (("train", train_size), ("val", val_size), ("test", test_size)):
            if size < 0:
                raise TaskError(f"{split}_size must be >= 0, got {size}")
        self.generator = generator
        self.generator_kwargs = generator_kwargs
        self.seed = seed
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.instructions = instructions
        suffix = (
            "?" + "&".join(f"{k}={v}" for k, v in generator_kwargs.items())
            if generator_kwargs
            else ""
        )
        self.name = f"gym:{generator}{suffix}"

    def _dataset(self, seed: int, size: int) -> Any:
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(
                self.generator, seed=seed, size=size, **self.generator_kwargs
            )
        except (TypeError, ValueError, AssertionError) as err:
            raise TaskError(f"{self.name}: bad generator options: {err}") from err

    @cached_property
    def _splits(self) -> dict[str, list[Example]]:
        seen: set[str] = set()
        out: dict[str, list[Example]] = {}
        for offset, split in ((3, "test"), (2, "val"), (1, "train")):
            want = self.sizes[split]
            examples: list[Example] = []
            attempt = 0
            while len(examples) < want and attempt < 8:
                # oversample: small generators repeat questions across seeds
                ds = self._dataset(self.seed * 1000 + offset + 100 * attempt, 2 * want + 8)
                for i, entry in enumerate(ds):
                    q = entry["question"].strip()
                    if q in seen:
                        continue
                    seen.add(q)
                    state = {"entry": entry, "dataset_seed": ds.seed, "index": i}
                    level = gym_difficulty(entry.get("metadata") or {})
                    if level is not None:  # what --curriculum orders train by
                        state[DIFFICULTY] = level
                    examples.append(
                        Example(
                            id=f"{self.generator}-{split}-{len(examples):05d}",
                            input=entry["question"],
                            reference=entry["answer"],
                            state=state,
                        )
                    )
                    if len(examples) == want:
                        break
                attempt += 1
            if len(examples) < want:
                raise TaskError(
                    f"{self.name}: only {len(examples)} distinct {split} questions could be "
                    f"generated (asked for {want}); lower the split sizes"
                )
            out[split] = examples
        return out

    @cached_property
    def _scorer_dataset(self) -> Any:
        return self._dataset(self.seed, 1)

    def examples(self, split: Split) -> list[Example]:
        if split not in self.sizes:
            raise TaskError(f"unknown split {split!r}; valid: train, val, test")
        return list(self._splits[split])

    def extract(self, output: str, example: Example) -> str:
        answer = extract_answer(output)
        ref = str(example.reference).strip()
        if _NUMERIC.match(ref) and not _NUMERIC.match(answer.replace(",", "")):
            number = extract_number(answer)
            if number is not None:
                return number
        return answer

    def score(self, output: str, example: Example) -> Score:
        answer = self.extract(output, example)
        value = float(self._scorer_dataset.score_answer(answer, example.state["entry"]) or 0.0)
        value = min(1.0, max(0.0, value))
        hard = 1.0 if value >= 1.0 else 0.0
        if hard:
            feedback = f"correct: {example.reference}"
        else:
            shown = answer if len(answer) <= 80 else answer[:77] + "..."
            feedback = f"expected {example.reference!s}, got {shown!r}"
        return Score(hard=hard, soft=value, feedback=feedback)
