"""Dreams: synthetic variants of the night's train tasks, for training only.

With `--dream N` a night makes up to N variants of each checked train task that allows one,
after the split (a variant is only ever made of a train task):

- **renumbered**: a task whose reference is a number (or a number with a unit) that a simple
  relation of its request's numbers gives (their sum, difference, product, or the quotient
  of two), the one relation that fits, with a word or sign in the request that names it
  ("+", "plus", "total", "minus", "left", "times", "each", "divided"...), gets new numbers
  of the same size and places and its reference recomputed. Numbers inside a rule the user
  stated ("in under 20 words") are kept; a request of more than one user turn, a negative
  number or a thousands separator is not renumbered;
- **paraphrase**: otherwise (a reference or rule check, no tools) the analyst rewrites the
  request (`skill/prompts/dream_paraphrase.md`) and the check is kept; a paraphrase that
  changes a number or a named value (`duplicates.same_values`: "after Wednesday" asked
  "after Thursday" is another question), drops a stated rule, gives the answer away, holds a
  block marker or says nothing new is refused (counted by why).

Every variant is marked `state["synthetic"] = {"from": task id, "how": ...}`, its label the
model's (`trust.py`: below every user's), goes to train only (`split.train_only`: never val or
test, never counted toward the night's minimums), is not kept (a duplicate, counted) when it is
the same item (`selftaught.duplicates`) as a train task of the night or another variant, other
than its own source's (its made-up label never stands beside one a user gave), is left out
(counted) when it is the same item as a val or test task, is never written to the recall pool,
and variants are at most `--dream-share` of the night's checked train tasks.
A variant of a task that may not be a demonstration (`no_demo`: checked by an end user's
correction, or a weak label on an end user's request) is `no_demo` too: an end user's
evidence never becomes a demonstration through a dream. Weak tasks are not dreamed from
(a weak label is not a check to recompute).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from selftaught.duplicates import DuplicateIndex, item_key, same_values
from selftaught.errors import BudgetExhausted, ConfigError
from selftaught.models.base import ChatModel, GenerationParams, Message
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.reflect import load_prompt, render
from selftaught.sleep.night.checks import find_rules
from selftaught.sleep.night.mine import MinedTask, normalized_prompt, task_key
from selftaught.sleep.night.split import add_train_only, train_only, use_lines
from selftaught.sleep.night.trust import Trust
from selftaught.sleep.records import (
    DreamRecord,
    DreamTaskRow,
    SyntheticOrigin,
    TrainOnlyUse,
    given,
)
from selftaught.tasks.scorers import normalize_text, reference_scorer

RENUMBERED = "renumbered"
PARAPHRASE = "paraphrase"
KEPT_STATE = ("rules", "tags", "no_demo")  # what a variant keeps of its source's state


@dataclass
class DreamConfig:
    n: int = 0
    """Synthetic variants of each checked train task that allows one, for training only (0:
    off): new numbers with the answer recomputed where the reference is arithmetic on the
    request's numbers, else a paraphrase by the analyst with the check kept."""
    synthetic_share: float = 0.5
    """Synthetic tasks at most this share of the night's checked train tasks."""
    paraphrase: bool = True
    """Ask the analyst for paraphrases of the train tasks that cannot be renumbered."""
    max_tries: int = 20
    """New numbers drawn per renumbered variant before giving up (a difference keeps its
    sign, a variant differs from its source)."""

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ConfigError(f"dream must be >= 0, got {self.n}")
        if self.synthetic_share < 0:
            raise ConfigError(f"dream share must be >= 0, got {self.synthetic_share}")
        if self.max_tries < 1:
            raise ConfigError(f"max_tries must be >= 1, got {self.max_tries}")


# ---- renumbering ----------------------------------------------------------------------------

_OPERAND = re.compile(r"(?<![\w.,])\d+(?:\.\d+)?(?!\w|[.,]\d)")
_UNARY_MINUS = re.compile(r"(?:^|[\s(=:,])[-−]\d")
_REFERENCE = re.compile(r"\s*(\$?)(\d+(?:\.\d+)?)(\s*)([^\d,]*?)\s*")
_CUES = {
    "sum": re.compile(
        r"\+|\b(?:plus|sum|total|add|adds|added|adding|altogether|combined|in all)\b", re.I
    ),
    "difference": re.compile(
        r"\d\s*[-−]\s*\d|\b(?:minus|difference|subtract\w*|left|remain\w*|fewer|less|lost|"
        r"spent|gave away|ate|sold)\b",
        re.I,
    ),
    "product": re.compile(r"[*×]|\b(?:times|product|multipl\w*|each|per|every)\b", re.I),
    "quotient": re.compile(r"[/÷]|\b(?:divided|divide\w*|split|shared?|equally|per|each)\b", re.I),
}
_OPS: dict[str, Callable[[list[Decimal]], Decimal | None]] = {
    "sum": lambda xs: sum(xs, Decimal(0)),
    "difference": lambda xs: xs[0] - sum(xs[1:], Decimal(0)),
    "product": lambda xs: math.prod(xs, start=Decimal(1)),
    "quotient": lambda xs: xs[0] / xs[1] if len(xs) == 2 and xs[1] != 0 else None,
}


@dataclass(frozen=True)
class Relation:
    """How a task's reference follows from its request's numbers."""

    op: str
    spans: tuple[tuple[int, int], ...]  # of the operands in the request
    operands: tuple[Decimal, ...]
    value: Decimal  # the reference's number
    form: tuple[str, str, str]  # the reference's prefix ("$"), space and unit around it


def _user_text(task: MinedTask) -> str | None:
    """The request of a task with one user turn (and at most a system prompt before it)."""
    roles = [m.get("role") for m in task.messages]
    if roles.count("user") != 1 or roles[-1] != "user":
        return None
    if any(r not in ("system", "developer", "user") for r in roles):
        return None
    return str(task.messages[-1]["content"])


def find_relation(task: MinedTask) -> Relation | None:
    """The one simple relation between the request's numbers and the reference (module doc),
    or None."""
    if task.state.scorer not in ("numeric", "quantity") or train_only(task):
        return None
    text = _user_text(task)
    ref = _REFERENCE.fullmatch(str(task.reference)) if task.reference is not None else None
    if text is None or ref is None or _UNARY_MINUS.search(text):
        return None
    stated = [(i, i + len(r.said)) for r in find_rules(text) if (i := text.find(r.said)) >= 0]
    found = [m for m in _OPERAND.finditer(text) if not any(a <= m.start() < b for a, b in stated)]
    if not 2 <= len(found) <= 4:
        return None
    xs = [Decimal(m.group()) for m in found]
    value = Decimal(ref.group(2))
    hits = [op for op, f in _OPS.items() if f(xs) == value]
    if len(hits) != 1 or not _CUES[hits[0]].search(text):
        return None
    return Relation(
        hits[0],
        tuple(m.span() for m in found),
        tuple(xs),
        value,
        (ref.group(1), ref.group(3), ref.group(4)),
    )


def _places(x: Decimal) -> int:
    exponent = x.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _draw(x: Decimal, rng: random.Random) -> Decimal:
    """A new number of the same size as `x`: as many integer digits, as many places."""
    places = _places(x)
    digits = len(str(int(x)))
    lo, hi = (10 ** (digits - 1) if digits > 1 else 1), 10**digits - 1
    scale = 10**places
    return Decimal(rng.randint(lo * scale, (hi + 1) * scale - 1)).scaleb(-places)


def _text(x: Decimal) -> str:
    if x == x.to_integral_value():
        return str(int(x))
    return format(x.normalize(), "f")


def _operands(rel: Relation, rng: random.Random) -> list[Decimal] | None:
    new = [_draw(x, rng) for x in rel.operands]
    if rel.op != "quotient":
        return new
    if any(_places(x) for x in rel.operands) or rel.value != rel.value.to_integral_value():
        return None  # an exact quotient is drawn from whole numbers only
    return [new[1] * _draw(rel.value, rng), new[1]]


def renumber(
    task: MinedTask, rel: Relation, rng: random.Random, tries: int
) -> tuple[list[Message], str] | None:
    """The task's messages with new numbers and the recomputed reference, or None."""
    text = str(task.messages[-1]["content"])
    for _ in range(tries):
        new = _operands(rel, rng)
        if new is None:
            return None
        value = _OPS[rel.op](new)
        if new == list(rel.operands) or value is None or (value < 0) != (rel.value < 0):
            continue
        out = text
        for (a, b), x in sorted(zip(rel.spans, new, strict=True), reverse=True):
            out = out[:a] + _text(x) + out[b:]
        prefix, space, unit = rel.form
        messages = [*task.messages[:-1], {"role": "user", "content": out}]
        return messages, f"{prefix}{_text(value)}{space}{unit}"
    return None


# ---- paraphrase -----------------------------------------------------------------------------

_REQUEST = re.compile(r"<request>\s*(.*?)\s*</request>", re.S | re.I)


def paraphrasable(task: MinedTask) -> bool:
    """A checked request with no tools whose check a paraphrase keeps: a reference or rules."""
    if train_only(task) or task.check not in ("reference", "rule"):
        return False
    if task.check == "rule" and not task.state.rules:
        return False
    return all(m.get("role") in ("system", "developer", "user", "assistant") for m in task.messages)


def refused(original: str, new: str, reference: Any) -> str | None:
    """Why a paraphrase of `original` is refused (None: it is kept)."""
    if not new.strip():
        return "empty"
    if normalized_prompt(new) == normalized_prompt(original):
        return "unchanged"
    if len(new) > 2 * len(original) + 200:
        return "too long"
    if "<!--" in new or "selftaught:" in new:
        return "holds a block marker"
    was, now = item_key(original), item_key(new)
    if was.digits != now.digits:
        return "changed the numbers"
    if {r.kind for r in find_rules(original)} - {r.kind for r in find_rules(new)}:
        return "dropped a stated rule"
    refs = reference if isinstance(reference, list) else [reference]
    for ref in refs:
        said = normalize_text(str(ref)) if ref is not None else ""
        if (
            said
            and f" {said} " in f" {normalize_text(new)} "
            and (f" {said} " not in f" {normalize_text(original)} ")
        ):
            return "gives the answer away"
    if not same_values(was, now):  # "after Wednesday" → "after Thursday": another question
        return "changed a named value"
    return None


def paraphrase(
    task: MinedTask, analyst: ChatModel, training: SkillOptConfig
) -> tuple[list[Message] | None, str]:
    """(messages with the last request rewritten by the analyst, "") or (None, why not)."""
    original = str(task.messages[-1]["content"])
    prompt = render(load_prompt("dream_paraphrase"), request=original)
    params = GenerationParams(
        max_tokens=training.analyst_max_tokens, temperature=training.rollout_temperature
    )
    reply = analyst.chat([{"role": "user", "content": prompt}], params).text
    tagged = _REQUEST.findall(reply)
    new = tagged[-1] if tagged else reply.strip()
    why = refused(original, new, task.reference)
    if why is not None:
        return None, why
    return [*task.messages[:-1], {"role": "user", "content": new.strip()}], ""


# ---- the night ------------------------------------------------------------------------------


def variant(source: MinedTask, messages: list[Message], reference: Any, how: str) -> MinedTask:
    """A synthetic task made of `source`: its sources and clients (provenance), the checks
    `KEPT_STATE` names, `reference` scored as a reference would be; train only."""
    key = "\n".join(normalized_prompt(str(m["content"])) for m in messages if m["role"] == "user")
    state = source.state.keep(*KEPT_STATE)
    if reference is not None:
        state = state.but(scorer=reference_scorer(reference))
    state = state.but(
        synthetic=SyntheticOrigin(from_task=source.id, how=how), trust=Trust.MODEL.label
    )
    return MinedTask(
        id="d-" + hashlib.sha256(key.encode()).hexdigest()[:12],
        messages=messages,
        reference=reference,
        state=state,
        sources=list(source.sources),
        origins=list(source.origins),
        clients=list(source.clients),
        created_at=source.created_at,
        notes=[f"synthetic ({how}) from {source.id}"],
    )


class _Dreamer:
    """One night's dreaming: the variants made so far, within `cap`, and what became of the
    others (`dream` builds the night's `dream` of it). A night makes one."""

    def __init__(
        self,
        config: DreamConfig,
        cap: int,
        known: set[str],
        analyst: ChatModel | None,
        training: SkillOptConfig,
        train: list[MinedTask],
        threshold: float,
    ):
        self.config, self.cap, self.known = config, cap, known
        # what a variant never asks, but its own source: each task and variant by the task
        # it stands for (a train task itself, a variant its source)
        self.asked: DuplicateIndex[str] = DuplicateIndex(threshold)
        for t in train:
            self.asked.add(task_key(t), t.id)
        self.analyst, self.training = analyst, training
        self.out: list[MinedTask] = []
        self.capped = False  # a variant was wanted with the cap reached
        self.duplicates = 0  # a variant that is a task the night already has
        self.refused: Counter[str] = Counter()  # paraphrases refused, by why
        self.failed_calls = 0  # analyst calls that failed
        self.notes: list[str] = []

    def full(self) -> bool:
        self.capped = self.capped or len(self.out) >= self.cap
        return len(self.out) >= self.cap

    def keep(self, source: MinedTask, messages: list[Message], reference: Any, how: str) -> None:
        task = variant(source, messages, reference, how)
        key = task_key(task)
        if task.id in self.known or any(
            origin != source.id for origin in self.asked.find_all(key)
        ):  # a made-up label never stands beside one a user gave (`trust.py`)
            self.duplicates += 1
            return
        self.known.add(task.id)
        self.asked.add(key, source.id)
        self.out.append(task)

    def renumbered(self, source: MinedTask, rel: Relation, rng: random.Random) -> None:
        for _ in range(self.config.n):
            if self.full():
                return
            made = renumber(source, rel, rng, self.config.max_tries)
            if made is not None:
                self.keep(source, made[0], made[1], RENUMBERED)

    def paraphrased(self, source: MinedTask) -> bool:
        """False when the analyst can no longer be asked (noted)."""
        for _ in range(self.config.n):
            if self.full() or self.analyst is None:
                return True
            try:
                messages, why = paraphrase(source, self.analyst, self.training)
            except TransientBackendError:
                self.failed_calls += 1
                continue
            except (FatalBackendError, BudgetExhausted) as err:
                self.notes.append(f"paraphrases stopped: {err}")
                return False
            if messages is None:
                self.refused[why] += 1
            else:
                self.keep(source, messages, source.reference, PARAPHRASE)
        return True


def dream(
    splits: dict[str, list[MinedTask]],
    config: DreamConfig,
    analyst: ChatModel | None,
    training: SkillOptConfig,
    threshold: float,
    seed: int = 0,
) -> tuple[list[MinedTask], DreamRecord]:
    """Make the night's variants of its checked train tasks and add them to `splits["train"]`
    (`split.add_train_only`); `analyst` (already charged to the night's ledger; None: no
    paraphrases) writes paraphrases. Returns every variant made (a left-out one has no split)
    and the night's `dream`."""
    if config.n == 0:
        return [], DreamRecord(n=0, share=config.synthetic_share, shipped=TrainOnlyUse.empty())
    train = [t for t in splits.get("train", []) if not train_only(t)]
    cap = math.floor(config.synthetic_share * len(train) + 1e-9)
    known = {t.id for tasks in splits.values() for t in tasks}
    paraphraser = analyst if config.paraphrase else None
    dreamer = _Dreamer(
        config, cap, known, paraphraser, training, splits.get("train", []), threshold
    )
    rest = []
    for source in train:
        rel = find_relation(source)
        if rel is None:
            rest.append(source)
            continue
        digest = hashlib.sha256(f"{seed}\x00{source.id}".encode()).digest()
        dreamer.renumbered(source, rel, random.Random(int.from_bytes(digest[:8], "big")))
    for source in rest:
        if paraphrasable(source) and not dreamer.paraphrased(source):
            break
    made = dreamer.out
    added = add_train_only(splits, made, threshold)
    rows = tuple(_row(t) for t in made)
    return made, DreamRecord(
        n=config.n,
        share=config.synthetic_share,
        cap=cap,
        sources=len(train),
        made=dict(Counter(r.how for r in rows)),
        refused=dict(dreamer.refused),
        failed_calls=dreamer.failed_calls,
        duplicates=dreamer.duplicates,
        left_out=len(made) - len(added),
        capped=dreamer.capped,
        trained=len(added),
        tasks=rows,
        notes=tuple(dreamer.notes),
        shipped=TrainOnlyUse.empty(),  # `{}` until the stage phase says what was used
    )


def _row(task: MinedTask) -> DreamTaskRow:
    head = " ".join(task.prompt.split())
    origin = task.state.synthetic
    assert origin is not None  # a dreamt task's (`variant`)
    return DreamTaskRow(
        id=task.id,
        from_task=origin.from_task,
        how=origin.how,
        reference=task.reference,
        prompt_head=head[:160] + ("…" if len(head) > 160 else ""),
        split=task.split,
        no_demo=bool(task.state.no_demo),
        notes=tuple(task.notes),
    )


def dream_lines(d: DreamRecord | None) -> list[str]:
    """report.md's lines for the `dream` section."""
    if not given(d):
        return []
    made = ", ".join(f"{n} {how}" for how, n in d.made.items()) or "none"
    refused = "; ".join(f"{n} {why}" for why, n in d.refused.items())
    lines = [
        f"- dreams (n {d.n}, share {d.share:g}): {made} from {d.sources} checked "
        f"train tasks (cap {d.cap}{', reached' if d.capped else ''}); "
        f"{d.trained} in train, {d.left_out} left out as near-duplicates of val/test"
        + (f"; paraphrases refused: {refused}" if refused else "")
    ]
    lines += [f"  - {n}" for n in d.notes]
    return lines + use_lines(d.shipped)
