"""`tool:kvstore`: a small key-value store per episode, read and updated through tools.

Each example is a goal about a store the model cannot see ("set total to the sum of apples and
pears, then report total"): it must `get` the values, `set` the result, and answer; several
turns, each depending on what the last one returned. The score checks the store's final
state (the goal done, nothing else touched) and the reported answer; soft credit is the share
of checks passed.
"""

from __future__ import annotations

import random
import re
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

INSTRUCTIONS = (
    "Use the tools to read and update the store. When you are done, give the final answer "
    "as 'Answer: ...'."
)
KEYS = [
    "apples",
    "pears",
    "plums",
    "figs",
    "limes",
    "kiwis",
    "dates",
    "grapes",
    "melons",
    "cherries",
    "budget",
    "rent",
    "wages",
    "visits",
    "clicks",
    "orders",
    "returns",
    "stock",
    "boxes",
    "crates",
    "pallets",
    "seats",
    "tickets",
    "guests",
    "rooms",
    "floors",
    "doors",
    "lamps",
    "chairs",
    "tables",
]
GOALS = ("sum", "increase", "swap", "largest")


class KVStoreEnvironment(Environment):
    """One episode's store (a copy of the example's, so episodes never share state)."""

    def __init__(self, store: dict[str, int]):
        self.store = dict(store)
        key = {"type": "string", "description": "the key's name"}
        self.tools = (
            Tool(
                "list_keys",
                "List the keys currently in the store.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                self.list_keys,
            ),
            Tool(
                "get",
                "Return the integer value stored under a key (an error if there is none).",
                {
                    "type": "object",
                    "properties": {"key": key},
                    "required": ["key"],
                    "additionalProperties": False,
                },
                self.get,
            ),
            Tool(
                "set",
                "Store an integer value under a key (creating the key or replacing its value).",
                {
                    "type": "object",
                    "properties": {
                        "key": key,
                        "value": {"type": ["integer", "string"], "description": "an integer"},
                    },
                    "required": ["key", "value"],
                    "additionalProperties": False,
                },
                self.set,
            ),
        )

    def list_keys(self) -> list[str]:
        return sorted(self.store)

    def get(self, key: str) -> int:
        if key not in self.store:
            raise ToolError(f"no key {key!r} in the store; list_keys shows the keys")
        return self.store[key]

    def set(self, key: str, value: int | str) -> str:
        if isinstance(value, str):  # small models often quote numbers
            if not re.fullmatch(r"\s*-?\d+\s*", value):
                raise ToolError(f"value must be an integer, got {value!r}")
            value = int(value)
        if not key.strip():
            raise ToolError("key must be a non-empty string")
        self.store[key] = value
        return f"ok: {key} = {value}"


def make_goal(rng: random.Random) -> tuple[str, dict[str, int], dict[str, Any]]:
    """(question, initial store, goal) for one example."""
    names = rng.sample(KEYS, rng.randint(4, 6) + 1)
    new_key, keys = names[0], names[1:]
    store = {k: rng.randint(10, 999) for k in keys}
    kind = rng.choice(GOALS)
    a, b = keys[0], keys[1]
    if kind == "sum":
        question = f"Set the key '{new_key}' to the sum of the values of '{a}' and '{b}', then "
        question += f"report the new value of '{new_key}'."
        goal = {"kind": kind, "set": {new_key: store[a] + store[b]}, "answer": store[a] + store[b]}
    elif kind == "increase":
        n = rng.randint(2, 99)
        question = f"Increase the value of '{a}' by {n}, then report its new value."
        goal = {"kind": kind, "set": {a: store[a] + n}, "answer": store[a] + n}
    elif kind == "swap":
        question = f"Swap the values of '{a}' and '{b}', then report the new value of '{a}'."
        goal = {"kind": kind, "set": {a: store[b], b: store[a]}, "answer": store[b]}
    else:
        while len(set(store.values())) < len(store):  # one largest value only
            store = {k: rng.randint(10, 999) for k in keys}
        asked = keys[: rng.randint(3, len(keys))]
        top = max(asked, key=store.__getitem__)
        names_asked = ", ".join(f"'{k}'" for k in asked)
        question = f"Which of the keys {names_asked} holds the largest value? Report its name."
        goal = {"kind": kind, "set": {}, "answer": top, "asked": asked}
    return question, store, goal


def check_episode(
    store: dict[str, int], final_store: dict[str, int], goal: dict[str, Any], answer_text: str
) -> list[tuple[str, bool]]:
    """(check, passed) for the goal's updates, the untouched keys, and the answer."""
    checks = []
    for key, want in goal["set"].items():
        got = final_store.get(key)
        checks.append((f"'{key}' should be {want}, is {got}", got == want))
    others = {k: v for k, v in store.items() if k not in goal["set"]}
    changed = sorted(
        k for k in set(final_store) - set(goal["set"]) if final_store[k] != others.get(k)
    )
    checks.append(
        (f"keys changed that the goal did not ask for: {', '.join(changed)}", not changed)
    )
    answer = extract_answer(answer_text)
    want = goal["answer"]
    if isinstance(want, int):
        said = extract_number(answer)
        ok = said is not None and said.lstrip("-").isdigit() and int(said) == want
    else:
        said = answer
        named = [
            k for k in goal.get("asked", [want]) if re.search(rf"\b{re.escape(k)}\b", answer, re.I)
        ]
        ok = named == [want]  # that key, and no other one hedged beside it
    checks.append((f"the answer should be {want}, got {said!r}", ok))
    return checks


def _score(checks: list[tuple[str, bool]]) -> Score:
    failed = [what for what, ok in checks if not ok]
    soft = (len(checks) - len(failed)) / len(checks)
    if not failed:
        return Score(1.0, 1.0, "correct: goal done and reported")
    return Score(0.0, soft, "; ".join(failed))


class KVStoreTask:
    """Goals on a hidden key-value store, reached through list_keys / get / set calls."""

    kind: TaskKind = "agent"
    max_turns = 10

    def __init__(
        self,
        *,
        seed: int = 0,
        train_size: int = 64,
        val_size: int = 40,
        test_size: int = 100,
        instructions: str = INSTRUCTIONS,
    ):
        sizes = split_sizes(train_size, val_size, test_size)
        self.seed = seed
        self.sizes = sizes
        self.instructions = instructions
        self.name = "tool:kvstore"

    @cached_property
    def _splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"kvstore:{self.seed}")

        def draw(suffix: str) -> Example:
            question, store, goal = make_goal(rng)
            return Example(
                id=f"kvstore-{suffix}",
                input=question,
                reference=str(goal["answer"]),
                state={"store": store, "goal": goal},
            )

        return distinct_splits(self.sizes, draw, self.name)

    def examples(self, split: Split) -> list[Example]:
        if split not in self.sizes:
            raise TaskError(f"unknown split {split!r}; valid: train, val, test")
        return list(self._splits[split])

    def environment(self, example: Example) -> KVStoreEnvironment:
        return KVStoreEnvironment(example.state["store"])

    def score(self, output: str, example: Example) -> Score:
        """A reply alone changed nothing: the store is checked as it was."""
        store = example.state["store"]
        return _score(check_episode(store, store, example.state["goal"], output))

    def score_episode(self, episode: Episode, example: Example) -> Score:
        env = episode.environment
        assert isinstance(env, KVStoreEnvironment)
        final_store = env.store
        return _score(
            check_episode(example.state["store"], final_store, example.state["goal"], episode.final)
        )


def kvstore_from_spec(options: dict[str, Any], **kwargs: Any) -> KVStoreTask:
    if options:
        raise TaskError(f"tool:kvstore takes no options, got {', '.join(sorted(options))}")
    return KVStoreTask(**kwargs)
