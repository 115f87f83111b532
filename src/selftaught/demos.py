"""Demonstrations: worked train examples, the second trainable part of a skill.

A skill is rules (written by reflection, guarded: no example's content) plus, optionally, a
block of demonstrations: (input, reply) pairs taken from the train split only:

- ``bootstrap``: the target's own reply that passed the scorer (and was not truncated), as in
  DSPy's BootstrapFewShot: a demo shows the model a reply it can really produce;
- ``reference``: the task's reference answer, kept only when the scorer passes it;
- ``correction``: a reply the user corrected in deployment (sleep), a reference too;
- ``teacher``: a reply the optimizer model wrote for a train item the target failed, kept
  only when the task's own scorer passes it (`skill.teacher`, `--teacher-demos`).

They live in the skill file itself, after the rules, one JSON object per line, so every place
that reads a skill (eval --skill, the proxy, adopt, a night) carries them with it:

    ...rules...

    <!-- selftaught:demos placement=turns -->
    {"id": "train-17", "source": "bootstrap", "input": "What is 3 + 4?", "reply": "7"}
    <!-- /selftaught:demos -->

``placement`` says how the policy shows them: ``turns`` (prior user/assistant turns, the
chat-native few-shot form) or ``system`` (a "Worked examples" section of the system prompt).
``retrieve=K`` (optional) makes the block a pool: per example the policy shows only the K
demos most similar to it (BM25, `selftaught.retrieval`), never the example itself.

Nothing held out may feed a demo: `LeakCheck.filter` drops a candidate that is the same item
as a val or test input (`selftaught.duplicates`: a rewording or a politer copy is; another
instance of one template, with other values or another answer, is not), naming both, and
`LeakCheck.assert_clean` fails closed on a skill that carries one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypedDict

from selftaught.choices import one_of
from selftaught.duplicates import DuplicateIndex, item_key
from selftaught.runs import RunError

if TYPE_CHECKING:  # annotations only: demos sits below the models (their agents render demos)
    from selftaught.models.base import Message

DemoPlacement = Literal["turns", "system"]
PLACEMENTS: tuple[DemoPlacement, ...] = ("turns", "system")

_OPEN = "<!-- selftaught:demos"
_CLOSE = "<!-- /selftaught:demos -->"
_BLOCK = re.compile(
    r"\n*<!-- selftaught:demos(?: placement=(\w+))?(?: retrieve=(\d+))? -->\n"
    r"(.*?)<!-- /selftaught:demos -->\n*",
    re.DOTALL,
)


class DemoLeakError(RunError):
    """A demonstration duplicates a held-out (val or test) input."""


class DemoDict(TypedDict):
    """A demo as JSON holds it (`Demo.to_dict()`: a skill's demos block, a run's best demos)."""

    id: str
    source: str
    input: str | list[dict[str, str]]  # a chat input: its turns, {role, content}
    reply: str


@dataclass(frozen=True)
class Demo:
    """One worked example: a train example's input and a reply that passed its check."""

    id: str
    input: str | tuple[tuple[str, str], ...]
    reply: str
    # bootstrap, reference, correction, teacher; a leak check's probe names its own (train, ...)
    source: str = "bootstrap"

    @classmethod
    def of(cls, example_id: str, given: str | Sequence[Message], reply: str, source: str) -> Demo:
        """Chat inputs are kept as (role, content) pairs, so a demo is hashable."""
        if isinstance(given, str):
            inp: str | tuple[tuple[str, str], ...] = given
        else:
            inp = tuple((str(m.get("role", "user")), str(m.get("content", ""))) for m in given)
        return cls(example_id, inp, reply, source)

    def input_text(self) -> str:
        if isinstance(self.input, str):
            return self.input
        return "\n".join(content for role, content in self.input if role == "user")

    def input_messages(self, instructions: str = "") -> list[Message]:
        """The demo's input as chat messages (system turns of a chat input are dropped: the
        policy's own system prompt stands for them), with the task's instructions appended
        as the policy appends them to a real input."""
        if isinstance(self.input, str):
            msgs: list[Message] = [{"role": "user", "content": self.input}]
        else:
            msgs = [{"role": r, "content": c} for r, c in self.input if r != "system"]
        if instructions and msgs and msgs[-1]["role"] == "user":
            msgs[-1] = {**msgs[-1], "content": f"{msgs[-1]['content']}\n\n{instructions}"}
        return msgs

    def to_dict(self) -> DemoDict:
        given = self.input
        inp = given if isinstance(given, str) else [{"role": r, "content": c} for r, c in given]
        return {"id": self.id, "source": self.source, "input": inp, "reply": self.reply}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Demo:
        return cls.of(str(d["id"]), d["input"], str(d["reply"]), str(d.get("source", "bootstrap")))


@dataclass(frozen=True)
class SkillParts:
    """A skill file split into its rules and its demonstrations."""

    rules: str
    demos: tuple[Demo, ...] = ()
    placement: DemoPlacement = "turns"
    retrieve: int = 0  # > 0: the demos are a pool, the K most similar are shown per example

    def text(self) -> str:
        """The skill file: the rules, then the demos block (none when there are no demos)."""
        return join_skill(self.rules, self.demos, self.placement, self.retrieve)


def split_skill(text: str) -> SkillParts:
    """Parse a skill file. A text without a demos block is all rules (as before demos)."""
    m = _BLOCK.search(text)
    if m is None:
        return SkillParts(text)
    placement = one_of(m.group(1) or "turns", PLACEMENTS)
    if placement is None:
        raise RunError(f"demos block: unknown placement {m.group(1)!r}; valid: turns, system")
    demos = []
    for n, line in enumerate(m.group(3).splitlines(), 1):
        if not line.strip():
            continue
        try:
            demos.append(Demo.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise RunError(f"demos block, line {n}: not a demo ({err})") from err
    rules = (text[: m.start()] + "\n\n" + text[m.end() :]).strip()
    retrieve = int(m.group(2) or 0)
    return SkillParts(rules, tuple(demos), placement, retrieve)


def join_skill(
    rules: str, demos: Iterable[Demo], placement: str = "turns", retrieve: int = 0
) -> str:
    demos = list(demos)
    if not demos:
        return rules
    lines = "\n".join(json.dumps(d.to_dict(), ensure_ascii=False) for d in demos)
    pool = f" retrieve={retrieve}" if retrieve > 0 else ""
    block = f"{_OPEN} placement={placement}{pool} -->\n{lines}\n{_CLOSE}\n"
    return f"{rules.rstrip()}\n\n{block}" if rules.strip() else block


def demo_turns(demos: Sequence[Demo], instructions: str = "") -> list[Message]:
    """Demos as prior user/assistant turns."""
    turns: list[Message] = []
    for d in demos:
        turns += d.input_messages(instructions)
        turns.append({"role": "assistant", "content": d.reply})
    return turns


def demo_section(demos: Sequence[Demo]) -> str:
    """Demos as a "Worked examples" section of the system prompt."""
    if not demos:
        return ""
    body = "\n\n".join(
        f"Example {i}:\nInput: {d.input_text().strip()}\nReply: {d.reply.strip()}"
        for i, d in enumerate(demos, 1)
    )
    return f"## Worked examples\n{body}"


# ---- leakage ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leak:
    demo_id: str
    held_out_id: str
    split: str

    def why(self) -> str:
        return f"demo {self.demo_id} duplicates {self.split} item {self.held_out_id}"


class HeldOutItem(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def reference(self) -> Any: ...

    def prompt_text(self) -> str: ...


class HeldOutSource(Protocol):
    """What the leak check reads of a task: its examples (a `Task` has them; declared here
    because demos sits below tasks and models)."""

    def examples(self, split: Literal["train", "val", "test"]) -> Sequence[HeldOutItem]: ...


class HeldOut(NamedTuple):
    """One held-out input the leak check guards: its split, id, text and reference."""

    split: str
    id: str
    text: str
    reference: Any = None


class LeakCheck:
    """Held-out inputs, indexed for the one notion of a duplicate (`selftaught.duplicates`):
    a candidate is a leak when it is the same item as a held-out one."""

    def __init__(
        self,
        held_out: Iterable[tuple[str, str, str] | HeldOut],
        references: Mapping[str, Any] | None = None,
    ):
        """`held_out`: (split, id, input text[, reference]) of every val and test example;
        `references`: the candidates' references by their ids (train items), where known."""
        self.items = [HeldOut(*item) for item in held_out]
        self.references = dict(references or {})
        self._index: DuplicateIndex[HeldOut] = DuplicateIndex()
        for item in self.items:
            self._index.add(item_key(item.text, item.reference), item)

    @classmethod
    def of_task(cls, task: HeldOutSource, also: Iterable[HeldOut] = ()) -> LeakCheck:
        """The check against every val and test input of `task` (and `also`), knowing the
        references of its train items."""
        held = [
            HeldOut(split, ex.id, ex.prompt_text(), ex.reference)
            for split in ("val", "test")
            for ex in task.examples(split)
        ]
        train = {ex.id: ex.reference for ex in task.examples("train")}
        return cls([*held, *also], train)

    def find(self, demo: Demo) -> Leak | None:
        key = item_key(demo.input_text(), self.references.get(demo.id))
        hit = self._index.find(key)
        return None if hit is None else Leak(demo.id, hit.id, hit.split)

    def filter(self, demos: Iterable[Demo]) -> tuple[list[Demo], list[Leak]]:
        """(clean demos, leaks dropped)."""
        kept, leaks = [], []
        for d in demos:
            leak = self.find(d)
            if leak is None:
                kept.append(d)
            else:
                leaks.append(leak)
        return kept, leaks

    def assert_clean(self, demos: Iterable[Demo]) -> None:
        """Fail closed, naming the items, when any demo duplicates a held-out input."""
        leaks = [leak for d in demos if (leak := self.find(d)) is not None]
        if leaks:
            raise DemoLeakError(
                "a demonstration duplicates held-out data (val/test never feed what is "
                "learned): " + "; ".join(leak.why() for leak in leaks[:5])
            )
