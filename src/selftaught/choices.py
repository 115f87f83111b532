"""A string read from outside (a file, a flag, JSON) checked against a closed set of choices
and typed as one of them (a `Literal`): a checked string meets a `Literal` field without a
cast or an ignore comment."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def one_of(value: object, choices: tuple[T, ...]) -> T | None:
    """The member of `choices` equal to `value` (typed as the choices are), None when none is."""
    for choice in choices:
        if choice == value:
            return choice
    return None
