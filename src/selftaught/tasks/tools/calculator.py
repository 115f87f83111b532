"""`tool:calculator`: arithmetic too large to do in one's head, with a calculator tool.

Each question combines 4-5 digit numbers (products, sums of products, differences); a small
model cannot compute them unaided, so a solved episode in practice calls `calculator` and
reports its result. The tool evaluates an arithmetic expression on its parsed `ast` (numbers,
+ - * / // % **, parentheses), never with `eval`: names, attributes, calls and anything else
are refused, and so are results too large to be useful.
"""

from __future__ import annotations

import ast
import math
import operator
import random
from collections.abc import Callable
from fractions import Fraction
from functools import cached_property
from typing import Any

from selftaught.tasks.base import (
    Example,
    Score,
    Split,
    TaskError,
    TaskKind,
    distinct_splits,
    split_sizes,
)
from selftaught.tasks.episode import Environment, Episode, Tool, ToolError
from selftaught.tasks.extract import extract_answer, extract_number

MAX_EXPRESSION_CHARS = 200
MAX_ABS = 10**60  # results and intermediate values beyond this are refused
INSTRUCTIONS = (
    "Use the calculator tool for the arithmetic, then give the final answer as 'Answer: N'."
)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _check_size(value: float) -> float:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ToolError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    if abs(value) > MAX_ABS:
        raise ToolError("the result is too large (more than 60 digits)")
    return value


def _power(base: float, exp: float) -> float:
    if base == 0 and exp < 0:
        raise ToolError("division by zero")
    if base not in (0, 1, -1) and exp * math.log10(abs(base)) > 60:
        raise ToolError("the result is too large (more than 60 digits)")  # before computing it
    try:
        return _check_size(operator.pow(base, exp))
    except OverflowError:
        raise ToolError("the result is too large (more than 60 digits)") from None


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, got {node.value!r}")
        return _check_size(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large (more than 60 digits)") from None
    raise ToolError(
        f"unsupported syntax {type(node).__name__}: use numbers, + - * / // % ** and parentheses"
    )


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text (an exact integer when it is one).
    Raises ToolError for anything that is not plain arithmetic or whose value is too large."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("×", "*").replace("^", "**").replace(",", "")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.10g}"


CALCULATOR_TOOL = Tool(
    name="calculator",
    description=(
        "Evaluate an arithmetic expression exactly and return its value. Supports numbers, "
        "+ - * / // % ** and parentheses, e.g. '48213 * 7719 + 1234'."
    ),
    parameters={
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "the arithmetic expression"}
        },
        "required": ["expression"],
        "additionalProperties": False,
    },
    fn=calculate,
)


class CalculatorEnvironment(Environment):
    """Stateless: one calculator."""

    def __init__(self) -> None:
        self.tools = (CALCULATOR_TOOL,)


def _number(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(10 ** (lo - 1), 10**hi - 1)


def make_question(rng: random.Random, min_digits: int, max_digits: int) -> tuple[str, int]:
    """One question and its exact answer."""

    def n() -> int:
        return _number(rng, min_digits, max_digits)

    a, b, c, d = n(), n(), n(), n()
    form = rng.randrange(4)
    if form == 0:
        return f"What is {a} * {b}?", a * b
    if form == 1:
        return f"What is {a} * {b} + {c}?", a * b + c
    if form == 2:
        return f"What is {a} * {b} - {c} * {d}?", a * b - c * d
    return f"A warehouse holds {a} crates of {b} items each. How many items is that?", a * b


class CalculatorTask:
    """Large-number arithmetic with a calculator tool. Splits come from one seeded stream,
    de-duplicated by question (test first, then val, then train), so they never overlap."""

    kind: TaskKind = "agent"
    max_turns = 4

    def __init__(
        self,
        *,
        seed: int = 0,
        train_size: int = 64,
        val_size: int = 40,
        test_size: int = 200,
        min_digits: int = 4,
        max_digits: int = 5,
        instructions: str = INSTRUCTIONS,
    ):
        sizes = split_sizes(train_size, val_size, test_size)
        if not 1 <= min_digits <= max_digits <= 12:
            raise TaskError(
                f"tool:calculator needs 1 <= min_digits <= max_digits <= 12, got "
                f"min_digits={min_digits}, max_digits={max_digits}"
            )
        self.seed = seed
        self.sizes = sizes
        self.min_digits, self.max_digits = min_digits, max_digits
        self.instructions = instructions
        defaults = (min_digits, max_digits) == (4, 5)
        self.name = (
            "tool:calculator"
            if defaults
            else f"tool:calculator?min_digits={min_digits}&max_digits={max_digits}"
        )

    @cached_property
    def _splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"calculator:{self.seed}:{self.min_digits}:{self.max_digits}")

        def draw(suffix: str) -> Example:
            question, answer = make_question(rng, self.min_digits, self.max_digits)
            return Example(id=f"calculator-{suffix}", input=question, reference=str(answer))

        return distinct_splits(self.sizes, draw, self.name)

    def examples(self, split: Split) -> list[Example]:
        if split not in self.sizes:
            raise TaskError(f"unknown split {split!r}; valid: train, val, test")
        return list(self._splits[split])

    def environment(self, example: Example) -> CalculatorEnvironment:
        return CalculatorEnvironment()

    def score(self, output: str, example: Example) -> Score:
        """The final answer alone, checked numerically."""
        got = extract_number(extract_answer(output))
        ref = int(example.reference)
        if got is not None and _close(got, ref):
            return Score(1.0, 1.0, f"correct: {ref}")
        shown = "no number" if got is None else got
        return Score(0.0, 0.0, f"expected {ref}, got {shown}")

    def score_episode(self, episode: Episode, example: Example) -> Score:
        """The final answer, plus half credit when the calculator returned the right value
        that the answer then failed to report; the feedback says whether the tool was used."""
        score = self.score(episode.final, example)
        calls = [c for c in episode.calls() if c[0] == "calculator"]
        if score.hard:
            return score
        if not calls:
            return Score(0.0, 0.0, f"{score.feedback}; the calculator was never called")
        ref = int(example.reference)
        if any(_close(result, ref) for _, _, result in calls):
            return Score(
                0.0,
                0.5,
                f"{score.feedback}; the calculator returned {ref} but the answer did not report it",
            )
        return Score(
            0.0, 0.0, f"{score.feedback}; the calculator was called with the wrong expression"
        )


def _close(text: str, ref: int) -> bool:
    """Exactly equal as numbers ("408", "408.0" and "408,000"-free forms alike)."""
    try:
        return Fraction(str(text).strip().replace(",", "")) == ref
    except (ValueError, ZeroDivisionError):
        return False


def calculator_from_spec(options: dict[str, Any], **kwargs: Any) -> CalculatorTask:
    known = {"min_digits", "max_digits"}
    unknown = set(options) - known
    if unknown:
        raise TaskError(
            f"unknown tool:calculator option(s) {', '.join(sorted(unknown))}; valid: "
            + ", ".join(sorted(known))
        )
    return CalculatorTask(**options, **kwargs)
