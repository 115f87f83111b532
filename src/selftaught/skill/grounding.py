"""Grounded proposals (`SkillOptConfig.grounded_proposals`, issue 52): a summary of the train set,
written once per run by the analyst, grounds one extra instruction proposal per step.

MIPRO's data-aware proposer (DSPy's GroundedProposer) asks the prompt model to describe the
train set (inputs and labels, a batch at a time, then boiled down to a few sentences) and shows
that summary, with demonstrations and earlier instructions, to every instruction proposal. The
same here, with SkillOpt's own parts:

- the summary is written from a bounded, seeded sample of at most `summary_items` TRAIN items,
  their inputs and references; never an item marked `no_demo` (sleep: an end user's evidence),
  never one whose input nearly copies a val / test input, and `Summarizer.summarize` fails
  closed (naming the items) when handed one: val and test never feed what is learned;
- it is one analyst call, charged to the optimizer; a summary that came back is saved in the
  run directory (`train_summary.json`) and a resumed run reads it instead of asking again; a
  backend error leaves the step ungrounded and the next step asks again;
- each proposal then makes one more reflection call (kind "grounded", `reflect_grounded.md`):
  the summary, the rules, and the step's failed replies with the grader's feedback; its edits
  join the failure-driven patches and meet the same aggregate, budget, guard and gate."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from selftaught.demos import Demo, LeakCheck
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.skill.demo_search import no_demo
from selftaught.skill.reflect import clip, load_prompt, render
from selftaught.tasks.base import Example

SummaryStatus = Literal["ok", "empty", "backend_error"]

SUMMARY_CHARS = 1500  # the summary shown to the analyst is clipped to this
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


@dataclass
class TrainSummary:
    """The analyst's summary of the train set and the items it was written from."""

    text: str
    item_ids: list[str] = field(default_factory=list)
    status: SummaryStatus = "ok"
    error: str = ""

    @property
    def usable(self) -> bool:
        return self.status == "ok" and bool(self.text)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainSummary:
        status: SummaryStatus = "ok"
        if d.get("status") in ("empty", "backend_error"):
            status = d["status"]
        return cls(
            text=str(d.get("text") or ""),
            item_ids=[str(i) for i in d.get("item_ids") or []],
            status=status,
            error=str(d.get("error") or ""),
        )


def read_summary(text: str) -> str:
    """The text between the last <summary> and </summary>; a reply without the tags is taken
    whole; an opened tag never closed (cut off) keeps what follows it."""
    tagged = _SUMMARY.findall(text)
    if tagged:
        return str(tagged[-1]).strip()
    if "<summary>" in text:
        return text.split("<summary>")[-1].strip()
    return text.strip()


def summary_sample(train: Sequence[Example], check: LeakCheck, n: int, seed: int) -> list[Example]:
    """At most `n` train items, a seeded draw: none marked `no_demo`, none whose input nearly
    copies a val / test input."""
    pool = [ex for ex in train if not no_demo(ex) and check.find(_as_demo(ex)) is None]
    rng = random.Random(seed * 1_000_033 + 52)
    return rng.sample(pool, min(n, len(pool)))


def _as_demo(ex: Example) -> Demo:
    return Demo.of(ex.id, ex.input, "", "summary")


def _reference(ex: Example) -> str:
    ref = ex.reference
    return "" if ref is None else str(ref)


class Summarizer:
    """The analyst describing the train set from a sample of its items (one call)."""

    def __init__(
        self,
        model: ChatModel,
        *,
        max_tokens: int,
        temperature: float,
        max_input_chars: int,
        max_reply_chars: int,
        timeout_s: float,
    ):
        self.model = model
        self.prompt = load_prompt("train_summary")
        self.params = GenerationParams(max_tokens=max_tokens, temperature=temperature)
        self.max_input_chars = max_input_chars
        self.max_reply_chars = max_reply_chars
        self.timeout_s = timeout_s

    def render(self, items: Sequence[Example], instructions: str) -> str:
        blocks = []
        for i, ex in enumerate(items, 1):
            ref = _reference(ex)
            block = f"### Item {i}\nInput:\n{clip(ex.prompt_text(), self.max_input_chars)}"
            if ref:
                block += f"\nReference answer: {clip(ref, self.max_reply_chars)}"
            blocks.append(block)
        return render(
            self.prompt,
            n=len(items),
            instructions=instructions.strip() or "(none)",
            items="\n\n".join(blocks),
        )

    async def summarize(
        self, items: Sequence[Example], check: LeakCheck, instructions: str = ""
    ) -> TrainSummary:
        """The summary of `items` (train items only: one whose input nearly copies a val /
        test input fails closed, naming it)."""
        check.assert_clean(_as_demo(ex) for ex in items)
        ids = [ex.id for ex in items]
        if not items:
            return TrainSummary("", ids, "empty", "no train item to summarize")
        messages = [{"role": "user", "content": self.render(items, instructions)}]
        try:
            c = await asyncio.wait_for(self.model.achat(messages, self.params), self.timeout_s)
        except FatalBackendError:
            raise
        except (TransientBackendError, asyncio.TimeoutError) as err:
            return TrainSummary("", ids, "backend_error", str(err) or "timed out")
        text = clip(read_summary(c.text), SUMMARY_CHARS)
        if not text:
            return TrainSummary("", ids, "empty", "the analyst's reply was empty")
        return TrainSummary(text, ids)
