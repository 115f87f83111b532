"""Answer extraction. Free text is scored as free text: we look for an explicit final-answer
marker, then fall back to the whole reply. JSON is parsed only where JSON is expected."""

from __future__ import annotations

import json
import re
from typing import Any

from selftaught.errors import InputError

_ANSWER_MARKERS = [
    re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I),
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]\s*(.+)", re.I),
    re.compile(r"(?:final answer|answer) is\s+(.+)", re.I),
]
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str:
    """The final answer in a free-text reply: the last explicit marker, else the reply itself."""
    for pattern in _ANSWER_MARKERS:
        hits = pattern.findall(text)
        if hits:
            ans = hits[-1].strip().splitlines()[0] if hits[-1].strip() else ""
            return ans.strip().rstrip(".").strip("*` ").strip()
    return text.strip()


def extract_number(text: str) -> str | None:
    """The last number in `text` (commas dropped), or None."""
    hits: list[str] = _NUMBER.findall(text)  # the pattern has no groups: whole matches
    if not hits:
        return None
    return hits[-1].replace(",", "")


def extract_json(text: str) -> Any:
    """The first JSON value in a reply (fenced ```json blocks first, then the first balanced
    object or array). Raises ValueError naming why when there is none."""
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", text, re.S)
    for block in fenced:
        try:
            return json.loads(block)
        except json.JSONDecodeError:
            continue
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                value, _ = decoder.raw_decode(text[i:])
                return value
            except json.JSONDecodeError:
                continue
    raise InputError("no JSON object found in the reply")
