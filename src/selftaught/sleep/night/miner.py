"""A miner that writes checks: an analyst model reads a thread with no strong check and writes
one, kept only when the thread's own evidence agrees with it.

A row whose user gave a verdict (a thumb, a score, or what the next turn said: `signals.py`)
but no reference and no rule has no check a night can trust: without a judge it is dropped,
with one it gets a generic rubric. The miner (`--miner-model`, default the optimizer model) is
shown such a row's conversation and the replies the user judged (redacted, as quoted JSON
strings), and answers in a closed vocabulary (`prompts/miner.md`): an expected answer (a
number, a number with its unit, an exact text), rules (`regex_must`, `regex_must_not`,
`contains`, `max_words`, `max_sentences`, `json`, `language`), a rubric, or "cannot check".
Its reply is validated; a reply that is not JSON of that shape gets ONE repair call, and the
parse rate is reported.

A written check is kept only when it is **two-sided on the thread's evidence**: the reply the
user accepted (its own thumb up, or the retry the user accepted after rejecting it) passes it,
and the reply the user rejected fails it. With one side only, that side must behave; with
neither (no verdict), the row is not even shown to the miner: there is nothing to test a check
on. A row whose only verdict is a re-ask or a rejection without the right value
(`mine.BARE_VERDICT`) needs both sides, and its task trains only, never validates. A rubric
is tested by the night's judge; without a judge it is left out of the check.
A written pattern runs under a time limit (`checks.search_limited`): where it runs out of time
on either reply the check is refused (a timeout is neither the accepted reply passing nor the
rejected one failing), and at scoring time it fails closed.

Miner calls are charged to the night's ledger (role `miner`: its budget covers them) and go to
its evidence log. A private row is never shown to a remote miner. A check written on an end
user's verdict checks its task but is no demonstration (`no_demo`), like an end user's
correction. Every kept check names its miner (`state["mined_check"]`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Literal, TypeVar

from selftaught import prompts
from selftaught.errors import BudgetExhausted, ConfigError, InputError
from selftaught.models.base import ChatModel, GenerationParams, Message, run_sync
from selftaught.models.errors import BackendError, FatalBackendError, TransientBackendError
from selftaught.redact import redact_for_model
from selftaught.skill.reflect import clip, render
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.sessions import task_turns
from selftaught.sleep.night.checks import LANGUAGES, REGEX_KINDS, Rule, pattern_problem
from selftaught.sleep.night.mine import (
    NO_CHECK,
    MineConfig,
    MinedTask,
    bare_verdict,
    new_task,
    quoted,
    redact_messages,
    task_checks,
)
from selftaught.sleep.night.trust import Trust
from selftaught.sleep.records import (
    BareVerdictMark,
    MinedCheckRecord,
    MinerExample,
    MinerRecord,
    TaskChecks,
)
from selftaught.tasks.base import Example
from selftaught.tasks.extract import extract_json
from selftaught.tasks.scorers import LlmJudge, reference_scorer, score_reference

MINER_RULES: tuple[str, ...] = (
    "regex_must",
    "regex_must_not",
    "contains",
    "max_words",
    "max_sentences",
    "json",
)
MINER_RULES += ("language",)
AnswerKind = Literal["number", "quantity", "text"]
ANSWER_KINDS: dict[str, tuple[str, ...]] = {
    "number": ("numeric",),
    "quantity": ("quantity",),
    "text": ("normalized", "numeric", "quantity"),
}
MAX_VALUE_CHARS = 200  # an expected answer, a `contains` text
MAX_RUBRIC_CHARS = 600
MAX_COUNT = 10_000  # max_words / max_sentences

ONE_SIDED_BARE = (
    "a re-ask or a rejection without its value needs a check two-sided on its thread (a reply "
    "the user accepted too)"
)
Verdict = Literal["up", "down"]
CallStatus = Literal["ok", "repaired", "invalid_json", "backend_error", "budget"]
FollowupReading = Literal["values", "turns"]
"""What the miner reads in the next turns (`followup_model.py`)."""


def load_prompt(name: str) -> str:
    """The night reader's template `name` as the night has it (`--prompts DIR` overrides it)."""
    return prompts.load(name)


PROMPTS = ("miner", "miner_repair")
# the prompts' example values ("<a number>"): weak miners echo them back as their check
PLACEHOLDERS = frozenset(
    p for name in PROMPTS for p in re.findall(r"<[^<>\n]{1,80}>", prompts.packaged(name))
) | {"...", "…"}


def _placeholder(text: str) -> str | None:
    """The prompt placeholder `text` copies, if any."""
    if text.strip() in PLACEHOLDERS:
        return text.strip()
    return next((p for p in PLACEHOLDERS if p.startswith("<") and p in text), None)


class MinerParseError(InputError):
    """A miner reply that holds no check (nor "cannot check") we can read."""


# ---- the closed vocabulary ----------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedAnswer:
    """The one right answer: `kind` number, quantity (a number and its unit) or text."""

    kind: AnswerKind
    value: str

    @property
    def scorer(self) -> str:
        return reference_scorer(self.value)


@dataclass(frozen=True)
class MinedCheck:
    """What the miner wrote: any of an expected answer, rules and a rubric; `why` is its own
    account of where the check comes from."""

    answer: ExpectedAnswer | None = None
    rules: tuple[Rule, ...] = ()
    rubric: str | None = None
    why: str = ""

    @property
    def empty(self) -> bool:
        return self.answer is None and not self.rules and not self.rubric

    def parts(self) -> list[str]:
        """Its parts, by name: `answer:number`, `rule:max_words`, `rubric`."""
        out = [f"answer:{self.answer.kind}"] if self.answer else []
        out += [f"rule:{r.kind}" for r in self.rules]
        return out + (["rubric"] if self.rubric else [])

    def describe(self) -> str:
        parts = [f"answer {self.answer.value!r}"] if self.answer else []
        parts += [f"{r.kind}" + (f"={r.arg!r}" if r.arg is not None else "") for r in self.rules]
        return ", ".join(parts + ([f"rubric {self.rubric!r}"] if self.rubric else []))

    def record(self, miner: str, tested_on: str) -> MinedCheckRecord:
        """The check as the task it checks holds it (`state["mined_check"]`): which miner
        wrote it and on which side of the thread it was tested."""
        return MinedCheckRecord(
            by=miner,
            tested_on=tested_on,
            answer=None if self.answer is None else asdict(self.answer),
            rules=tuple(r.to_dict() for r in self.rules),
            rubric=self.rubric,
            why=self.why,
        )


class OutsideVocabulary(InputError):
    """A part of a miner's answer outside the closed vocabulary (dropped and counted)."""


def _text(value: Any, what: str, limit: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise OutsideVocabulary(f"{what} must be a text, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise OutsideVocabulary(f"{what} is empty")
    if len(text) > limit:
        raise OutsideVocabulary(f"{what} is {len(text)} characters, over {limit}")
    if _placeholder(text):
        raise OutsideVocabulary(f"{what} {text!r} copies the prompt's placeholder")
    return text


def _answer(raw: Any) -> ExpectedAnswer:
    if not isinstance(raw, dict):
        raise OutsideVocabulary("answer must be an object with kind and value")
    kind = raw.get("kind")
    if kind not in ANSWER_KINDS:
        kinds = ", ".join(ANSWER_KINDS)
        raise OutsideVocabulary(f"answer kind must be one of {kinds}, got {kind!r}")
    value = _text(raw.get("value"), "the answer", MAX_VALUE_CHARS)
    if reference_scorer(value) not in ANSWER_KINDS[kind]:
        raise OutsideVocabulary(f"answer {value!r} is not a {kind}")
    return ExpectedAnswer(kind, value)


def _rule(raw: Any) -> Rule:
    if not isinstance(raw, dict):
        raise OutsideVocabulary("a rule must be an object with kind (and value)")
    kind, value = raw.get("kind"), raw.get("value", raw.get("arg"))
    if kind not in MINER_RULES:
        raise OutsideVocabulary(f"rule kind must be one of {', '.join(MINER_RULES)}, got {kind!r}")
    if kind == "json":
        return Rule("json")
    if kind in ("max_words", "max_sentences"):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_COUNT:
            raise OutsideVocabulary(f"{kind} needs a count in 1..{MAX_COUNT}, got {value!r}")
        return Rule(kind, value)
    if kind == "language":
        name = str(value or "").strip().lower()
        if name not in LANGUAGES:
            names = ", ".join(LANGUAGES)
            raise OutsideVocabulary(f"language must be one of {names}, got {value!r}")
        return Rule(kind, name)
    if kind in REGEX_KINDS:
        problem = pattern_problem(value)
        if problem is None and isinstance(value, str) and _placeholder(value):
            problem = "it copies the prompt's placeholder"
        if problem is not None:
            raise OutsideVocabulary(f"{kind}: {problem}")
        return Rule(kind, value)
    return Rule(kind, _text(value, "the contains text", MAX_VALUE_CHARS))


def reply_object(text: str) -> dict[str, Any]:
    """The JSON object a reply of the miner holds (any role's); MinerParseError when it holds
    none."""
    try:
        value = extract_json(text)
    except ValueError as err:
        raise MinerParseError(str(err)) from err
    if not isinstance(value, dict):
        raise MinerParseError(f"expected a JSON object, got {type(value).__name__}")
    return value


def parse_check(text: str) -> tuple[MinedCheck | None, str | None, list[dict[str, Any]]]:
    """(the check, or None; why it cannot check, or None; the parts refused, with why) from
    a miner reply. Raises MinerParseError when the reply holds no JSON object of the shape."""
    value = reply_object(text)
    if "cannot_check" in value and not any(k in value for k in ("answer", "rules", "rubric")):
        why = value.get("cannot_check")
        return None, str(why if isinstance(why, str) and why.strip() else "no reason given"), []
    if not any(k in value for k in ("answer", "rules", "rubric")):
        raise MinerParseError("the object has none of answer, rules, rubric, cannot_check")
    invalid: list[dict[str, Any]] = []
    answer = None
    if value.get("answer") is not None:
        try:
            answer = _answer(value["answer"])
        except OutsideVocabulary as err:
            invalid.append({"part": value["answer"], "why": str(err)})
    rules: dict[str, Rule] = {}
    raw_rules = value.get("rules") or []
    for raw in raw_rules if isinstance(raw_rules, list) else [raw_rules]:
        try:
            rule = _rule(raw)
        except OutsideVocabulary as err:
            invalid.append({"part": raw, "why": str(err)})
            continue
        rules.setdefault(f"{rule.kind}\x00{rule.arg}", rule)
    rubric = None
    if value.get("rubric") is not None:
        try:
            rubric = _text(value["rubric"], "the rubric", MAX_RUBRIC_CHARS)
        except OutsideVocabulary as err:
            invalid.append({"part": value["rubric"], "why": str(err)})
    why = str(value.get("why") or "")[:MAX_RUBRIC_CHARS]
    check = MinedCheck(answer, tuple(rules.values()), rubric, why)
    return (None if check.empty else check), None, invalid


# ---- the thread's evidence ----------------------------------------------------------------


def verdict(it: Interaction) -> Verdict | None:
    """What the user thought of `it`'s reply: its thumb, else its score (0.5 and up: up)."""
    fb = it.feedback
    if fb.thumb is not None:
        return fb.thumb
    if fb.score is not None:
        return "up" if fb.score >= 0.5 else "down"
    return None


def verdict_trusted(it: Interaction) -> bool:
    field_ = "thumb" if it.feedback.thumb is not None else "score"
    return it.feedback.trusted_for(field_)


@dataclass
class Evidence:
    """The replies a check is tested on (redacted): the one the user accepted, the one the
    user rejected, and what the user said after each."""

    accepted: str | None = None
    rejected: str | None = None
    accepted_said: str | None = None
    rejected_said: str | None = None

    @property
    def sides(self) -> str:
        """both, accepted, rejected or none: what a check can be tested on."""
        have = [n for n in ("accepted", "rejected") if getattr(self, n) is not None]
        return "both" if len(have) == 2 else have[0] if have else "none"


def _said(it: Interaction) -> str | None:
    """The user's words on `it`'s reply: the next turn a signal read, else a comment."""
    signals = it.meta.get("signals") if isinstance(it.meta, dict) else None
    if isinstance(signals, list) and signals and isinstance(signals[0], dict):
        return quoted(str(signals[0].get("words") or ""))
    comment = (it.feedback.comment or "").strip()
    return quoted(comment) if comment else None


def _side(ev: Evidence, it: Interaction, which: Verdict) -> None:
    if it.reply is None:
        return
    if which == "up" and ev.accepted is None:
        ev.accepted, ev.accepted_said = redact_for_model(it.reply), _said(it)
    elif which == "down" and ev.rejected is None:
        ev.rejected, ev.rejected_said = redact_for_model(it.reply), _said(it)


def thread_evidence(rows: list[Interaction]) -> dict[str, Evidence]:
    """Per row id, the replies its check can be tested on: its own reply by its verdict, and
    in a thread (`signals.read_threads` marks each row's thread and turn) a rejected reply
    with the next reply of the thread when the user accepted that one, and the other way. (A
    re-ask's later answer sits in another conversation: it is not paired.)"""
    out: dict[str, Evidence] = {}
    threads: dict[str, list[Interaction]] = {}
    for it in rows:
        ev = out.setdefault(it.id, Evidence())
        v = verdict(it)
        if v is not None:
            _side(ev, it, v)
        meta = it.meta if isinstance(it.meta, dict) else {}
        if "thread" in meta and isinstance(meta.get("turn"), int):
            threads.setdefault(str(meta["thread"]), []).append(it)
    for members in threads.values():
        members.sort(key=lambda r: r.meta["turn"])
        for earlier, later in zip(members, members[1:], strict=False):
            if verdict(earlier) == "down" and verdict(later) == "up":
                _side(out[earlier.id], later, "up")
                _side(out[later.id], earlier, "down")
    return out


# ---- testing a check on the evidence ------------------------------------------------------


def check_passes(
    check: MinedCheck, reply: str, judge: LlmJudge | None, request: list[Message] | None = None
) -> tuple[bool | None, str]:
    """(passed, why) for one reply to `request` on every part of `check` (a rubric by
    `judge`); None for passed when a part cannot tell (a pattern that ran out of time)."""
    reference = check.answer.value if check.answer else None
    example = Example("mined-check", request or "", reference, {"rubric": check.rubric})
    verdicts = [(rule.kind, *rule.verdict(reply)) for rule in check.rules]  # every part runs
    for kind, ok, why in verdicts:
        if ok is None:
            return None, f"rule {kind}: {why}"
    if check.answer is not None:
        score = score_reference(reply, example, check.answer.scorer)
        if not score.hard:
            return False, f"answer: {score.feedback}"
    for kind, ok, why in verdicts:
        if not ok:
            return False, f"rule {kind}: {why}"
    if check.rubric:
        if judge is None:
            raise ConfigError("a rubric is tested by a judge")
        score = judge(reply, example)
        if not score.hard:
            return False, f"rubric: {score.feedback}"
    return True, "passes every part"


UNTOLD = "it cannot tell the {side} reply (a pattern ran out of time)"
"""Why a check is refused when a part of it gives no verdict on one side: a timeout is neither
the accepted reply passing nor the rejected one failing."""


def refusal(
    check: MinedCheck,
    evidence: Evidence,
    judge: LlmJudge | None,
    request: list[Message] | None = None,
) -> str | None:
    """Why `check` is refused on `evidence` (None: it is kept): the accepted reply must pass
    it and the rejected reply must fail it, each where the thread has one; a check that
    cannot tell either reply (a pattern that ran out of time) is refused."""
    if evidence.accepted is None and evidence.rejected is None:
        return "no evidence to test the check on"
    if evidence.accepted is not None:
        ok, _ = check_passes(check, evidence.accepted, judge, request)
        if ok is None:
            return UNTOLD.format(side="accepted")
        if not ok:
            return "the accepted reply fails it"
    if evidence.rejected is not None:
        ok, _ = check_passes(check, evidence.rejected, judge, request)
        if ok is None:
            return UNTOLD.format(side="rejected")
        if ok:
            return "the rejected reply passes it (not two-sided)"
    return None


# ---- the report -----------------------------------------------------------------------------

ANSWERED: tuple[CallStatus, ...] = ("ok", "repaired")
"""A call whose reply parsed (a repaired one included)."""


def parse_rate(statuses: Counter[CallStatus]) -> float | None:
    """Share of the calls a model answered (not a backend error) whose reply parsed, from the
    calls counted by status: every role of the miner reports it alike (`ModelCallsRecord`)."""
    replied = statuses.total() - statuses["backend_error"]
    return sum(statuses[s] for s in ANSWERED) / replied if replied else None


def first_error(calls: Iterable[Parsed[Any] | MinerCall]) -> str | None:
    """The first backend error of `calls`, redacted and clipped, for the night's notes."""
    errors = (c.error for c in calls if c.status == "backend_error")
    return next((redact_for_model(str(e))[:300] for e in errors), None)


MAX_EXAMPLES = 10


@dataclass
class MinerConfig:
    """The miner's caps. Its call settings say they are the miner's (`check_max_tokens`, not the
    skill trainer's `training.max_tokens`): every leaf of a `NightConfig` has one name."""

    max_rows: int = 50
    """Rows shown to the miner per night (those with both an accepted and a rejected reply
    first); the rest are skipped and counted."""
    check_max_tokens: int = 256
    """The miner's reply length when it writes a check (a short JSON object)."""
    call_timeout_s: float = 120.0
    """One miner call's time limit (a call past it is a backend error)."""
    concurrent_calls: int = 4
    """Miner calls in flight at once."""
    max_message_chars: int = 1200
    """Each message of the conversation as the miner reads it (head and tail kept)."""
    max_conversation_chars: int = 6000
    """The conversation's last messages that fit, as the miner reads them."""
    read_followups: bool = False
    """The miner also reads the user's next turns the rules read in part: a rejection without
    the right value (and, reading `turns`, nothing) (`followup_model.py`; a call per such
    turn). Off: on the dev corpora neither Qwen2.5-Coder-0.5B nor the embedded model gained
    enough to pay for it (docs/sleep-conversations.md)."""
    followup_reading: FollowupReading = "values"
    """`values`: the miner is asked only which value a rejection gives as the right one (it
    cannot raise a signal the rules did not); `turns`: it also reads the turns the rules read
    nothing in, in the whole vocabulary, a signal kept only where the rules see a cue of it."""
    max_followups: int = 200
    """Next turns the miner reads per night (bare rejections first); the rest keep the rules'
    reading, counted."""
    followup_max_tokens: int = 96
    """The reply length for a next turn's reading (a short JSON object)."""

    def __post_init__(self) -> None:
        names = ("max_rows", "check_max_tokens", "concurrent_calls", "max_message_chars")
        for name in (*names, "max_followups", "followup_max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"miner {name} must be >= 1, got {getattr(self, name)}")
        if self.call_timeout_s <= 0:
            raise ConfigError(f"miner call_timeout_s must be > 0, got {self.call_timeout_s}")
        if self.followup_reading not in ("values", "turns"):
            raise ConfigError(
                f"miner followup_reading must be values or turns, got {self.followup_reading!r}"
            )


# ---- the miner ----------------------------------------------------------------------------


@dataclass
class Pending:
    """A row without a strong check: `task` when `mine.mine_one` made one anyway (a generic
    rubric), else None with `why` it was dropped."""

    row: Interaction
    task: MinedTask | None
    why: str | None


def wants_check(task: MinedTask | None, why: str | None) -> bool:
    """Whether `mine_one`'s outcome leaves the row without a strong check: dropped for having
    no reference and no rule, or a task checked by a rubric alone."""
    if task is None:
        return bool(why) and str(why).startswith(NO_CHECK)
    s = task.state
    return not (s.scorer or s.rules or s.expected_calls or s.tools)


_T = TypeVar("_T")
_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass
class Parsed(Generic[_T]):
    """One question to the miner: its status, its reply (and the repair's), what it parsed
    into (None: nothing readable)."""

    status: CallStatus = "ok"
    raw_reply: str = ""
    repair_reply: str | None = None
    error: str | None = None
    value: _T | None = None


@dataclass
class MinerCall:
    """One row shown to the miner: its reply, the repair when there was one, what it parsed
    into."""

    row_id: str
    status: CallStatus = "ok"
    raw_reply: str = ""
    repair_reply: str | None = None
    error: str | None = None
    check: MinedCheck | None = None
    cannot_check: str | None = None
    invalid: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Decided:
    """A row the miner answered (its call not stopped by the budget): the call, what became of
    it (`kept`, `refused: why`, ...) and the check put on its task (None: none)."""

    row_id: str
    call: MinerCall
    outcome: str
    kept: MinedCheck | None


REFUSED = "refused: "


def _conversation(messages: list[Message], config: MinerConfig) -> str:
    """The conversation as quoted lines, the newest that fit (the request always)."""
    lines: list[str] = []
    used = 0
    for msg in reversed(messages):
        text = clip(str(msg.get("content") or ""), config.max_message_chars)
        line = f"- {msg.get('role', 'user')}: {json.dumps(text, ensure_ascii=False)}"
        if lines and used + len(line) > config.max_conversation_chars:
            lines.append(f"- (… {len(messages) - len(lines)} earlier messages left out)")
            break
        lines.append(line)
        used += len(line)
    return "\n".join(reversed(lines))


def _evidence_text(ev: Evidence, config: MinerConfig) -> str:
    lines = []
    for label, reply, said in (
        ("the reply the user accepted", ev.accepted, ev.accepted_said),
        ("the reply the user rejected", ev.rejected, ev.rejected_said),
    ):
        if reply is None:
            continue
        text = json.dumps(clip(reply, config.max_message_chars), ensure_ascii=False)
        lines.append(f"- {label}: {text}")
        if said:
            lines.append(f"  what the user said of it: {said}")
    return "\n".join(lines)


def _outcome(call: MinerCall) -> str:
    """What an answered call wrote, before its check is tested."""
    if call.status == "backend_error":
        return f"backend error: {call.error}"
    if call.status == "invalid_json":
        return f"invalid reply: {call.error}"
    if call.cannot_check is not None:
        return f"cannot check: {call.cannot_check}"
    if call.check is None:
        return REFUSED + "no part of the check is in the vocabulary"
    return "written"


def _example(d: _Decided) -> MinerExample:
    """One of the miner's first decisions, as the report shows it."""
    described = d.call.check.describe() if d.call.check else None
    return MinerExample(
        row=d.row_id,
        check=None if described is None else redact_for_model(described),
        outcome=redact_for_model(d.outcome)[:300],
    )


class Miner:
    """The miner model in its role: shows each pending row to the model, parses and repairs
    its answer, tests the check on the thread's evidence and puts a kept check on the task.
    `model` should be charged to the night's ledger (`TrackedModel`, role `miner`); `judge`
    tests rubrics (None: a rubric is left out of a check); `send_private`: private rows may be
    shown (False for a remote miner)."""

    def __init__(
        self,
        model: ChatModel,
        name: str,
        config: MinerConfig | None = None,
        *,
        judge: LlmJudge | None = None,
        send_private: bool = True,
        mining: MineConfig | None = None,
    ):
        self.model = model
        self.name = name
        self.config = config or MinerConfig()
        self.judge = judge
        self.send_private = send_private
        self.mining = mining or MineConfig()
        self.params = GenerationParams(max_tokens=self.config.check_max_tokens, temperature=0.0)
        self.prompts = {n: load_prompt(n) for n in PROMPTS}
        self._stopped: str | None = None

    def resolve(
        self, pending: list[Pending], rows: list[Interaction]
    ) -> tuple[list[tuple[MinedTask | None, str | None]], MinerRecord]:
        """Per pending row, in order: (its task, None) or (None, why it stays dropped); and
        what the miner did. `rows`: every row the night reads (the threads' evidence)."""
        evidence = thread_evidence(rows)
        chosen, skipped = self._choose(pending, evidence)
        prompts = {p.row.id: self._prompt(p, evidence[p.row.id]) for p in chosen}
        jobs = {r: functools.partial(self._call, r, prompt) for r, prompt in prompts.items()}
        calls, stopped = run_sync(self.gather(jobs))
        skipped.update(stopped)
        out: list[tuple[MinedTask | None, str | None]] = []
        decided: list[_Decided] = []
        for p in pending:
            call = calls.get(p.row.id)
            if call is not None and call.status == "budget":  # the budget ran out as it asked
                skipped[self._stopped or "the night's budget was spent"] += 1
            elif call is not None:
                ev = evidence.get(p.row.id) or Evidence()
                decided.append(d := self._decide(p, call, ev))
                if d.kept is not None:
                    out.append((self._apply(p, d.kept, ev), None))
                    continue
            out.append((p.task, p.why))
        return out, self._record(len(pending), skipped, decided)

    def _record(
        self, candidates: int, skipped: Counter[str], decided: list[_Decided]
    ) -> MinerRecord:
        """What the miner did with the `candidates` rows: those never shown, by why; and the
        calls answered, each `decided`."""
        calls = [d.call for d in decided]
        statuses = Counter(c.status for c in calls)
        kept = [d.kept for d in decided if d.kept is not None]
        refused = (
            d.outcome.removeprefix(REFUSED) for d in decided if d.outcome.startswith(REFUSED)
        )
        return MinerRecord(
            miner=self.name,
            candidates=candidates,
            asked=len(calls),
            answered=sum(statuses[s] for s in ANSWERED),
            repaired=statuses["repaired"],
            parse_failures=statuses["invalid_json"],
            backend_errors=statuses["backend_error"],
            cannot_check=sum(c.cannot_check is not None for c in calls),
            kept=len(kept),
            refused=dict(Counter(refused)),
            skipped=dict(skipped),
            invalid_parts=sum(len(c.invalid) for c in calls),
            kept_parts=dict(Counter(part for check in kept for part in check.parts())),
            first_error=first_error(calls),
            examples=tuple(_example(d) for d in decided[:MAX_EXAMPLES]),
            parse_rate=parse_rate(statuses),
        )

    def _choose(
        self, pending: list[Pending], evidence: dict[str, Evidence]
    ) -> tuple[list[Pending], Counter[str]]:
        """The rows to show: with a verdict to test on, allowed to this miner, up to the cap
        (two-sided evidence first); and the others, counted by why."""
        skipped: Counter[str] = Counter()
        ranked = []
        for p in pending:
            ev = evidence.setdefault(p.row.id, Evidence())
            if ev.sides == "none":
                skipped["no verdict: nothing to test a check on"] += 1
            elif p.row.private and not p.row.reviewed and not self.send_private:
                skipped["private row: the miner is a remote model"] += 1
            else:
                ranked.append(p)
        ranked.sort(key=lambda p: evidence[p.row.id].sides != "both")
        over = ranked[self.config.max_rows :]
        if over:
            skipped[f"over the cap of {self.config.max_rows} rows a night"] += len(over)
        return ranked[: self.config.max_rows], skipped

    def _messages(self, p: Pending) -> list[Message]:
        if p.task is not None:
            return p.task.messages
        return redact_messages(task_turns(p.row)) or []

    def _prompt(self, p: Pending, ev: Evidence) -> str:
        return render(
            self.prompts["miner"],
            conversation=_conversation(self._messages(p), self.config),
            evidence=_evidence_text(ev, self.config),
        )

    @property
    def stopped(self) -> str | None:
        """Why the miner asks nothing more (the night's budget spent, its backend failed)."""
        return self._stopped

    async def gather(
        self, jobs: Mapping[_K, Callable[[], Awaitable[_V]]]
    ) -> tuple[dict[_K, _V], Counter[str]]:
        """Run `jobs`, `concurrency` at a time: their results, and the jobs not run once the
        miner stopped, counted by why."""
        gate = asyncio.Semaphore(self.config.concurrent_calls)
        stopped: Counter[str] = Counter()

        async def one(key: _K, job: Callable[[], Awaitable[_V]]) -> tuple[_K, _V] | None:
            async with gate:
                if self._stopped is not None:
                    stopped[self._stopped] += 1
                    return None
                return key, await job()

        done = await asyncio.gather(*(one(k, j) for k, j in jobs.items()))
        return dict(d for d in done if d is not None), stopped

    async def _ask(self, prompt: str, params: GenerationParams | None = None) -> str:
        messages: list[Message] = [{"role": "user", "content": prompt}]
        call = self.model.achat(messages, params or self.params)
        c = await asyncio.wait_for(call, self.config.call_timeout_s)
        return c.text

    async def _reply(
        self, call: Parsed[Any], prompt: str, params: GenerationParams | None = None
    ) -> str | None:
        """The model's reply, or None (the call's status and error set)."""
        try:
            return await self._ask(prompt, params)
        except BudgetExhausted as err:
            self._stopped = f"the night's budget was spent ({err})"
            call.status, call.error = "budget", str(err)
        except FatalBackendError as err:
            self._stopped = f"the miner's backend failed: {err}"
            call.status, call.error = "backend_error", str(err)
        except (BackendError, TransientBackendError, asyncio.TimeoutError) as err:
            call.status, call.error = "backend_error", str(err) or "timed out"
        return None

    async def ask_parsed(
        self,
        prompt: str,
        parse: Callable[[str], _T],
        repair: Callable[[str, str], str],
        params: GenerationParams | None = None,
    ) -> Parsed[_T]:
        """Ask, parse; a reply `parse` refuses (MinerParseError) gets ONE repair call, whose
        prompt `repair(reply, error)` writes. Every role of the miner asks through here."""
        got: Parsed[_T] = Parsed()
        reply = await self._reply(got, prompt, params)
        if reply is None:
            return got
        got.raw_reply = reply
        try:
            got.value = parse(reply)
            return got
        except MinerParseError as err:
            got.error = f"invalid JSON: {err}"
        fixed = await self._reply(Parsed(), repair(clip(reply, 3000), got.error), params)
        if fixed is None:
            got.status = "invalid_json"
            got.error += "; the repair call failed"
            return got
        got.repair_reply = fixed
        try:
            got.value = parse(fixed)
            got.status = "repaired"
        except MinerParseError as err:
            got.status, got.error = "invalid_json", f"{got.error}; after repair: {err}"
        return got

    async def _call(self, row_id: str, prompt: str) -> MinerCall:
        """One row's check: asked, parsed, repaired once when it is not one."""

        def repair(reply: str, error: str) -> str:
            return render(self.prompts["miner_repair"], reply=reply, error=error)

        got = await self.ask_parsed(prompt, parse_check, repair)
        call = MinerCall(row_id, got.status, got.raw_reply, got.repair_reply, got.error)
        if got.value is not None:
            call.check, call.cannot_check, call.invalid = got.value
        return call

    def _decide(self, p: Pending, call: MinerCall, ev: Evidence) -> _Decided:
        """What becomes of an answered call: its check tested, kept or refused."""
        outcome = _outcome(call)
        check = call.check
        if check is not None and check.rubric and self.judge is None:
            check = MinedCheck(check.answer, check.rules, None, check.why)
            if check.empty:
                outcome, check = REFUSED + "a rubric needs a judge model (--judge-model)", None
        if check is not None:
            try:
                why = refusal(check, ev, self.judge, self._messages(p))
            except (BackendError, BudgetExhausted) as err:
                why = f"the judge could not test the rubric ({type(err).__name__})"
            if why is None and bare_verdict(p.row) and ev.sides != "both":
                why = ONE_SIDED_BARE
            outcome = REFUSED + why if why else "kept"
        return _Decided(p.row.id, call, outcome, check if outcome == "kept" else None)

    def _apply(self, p: Pending, check: MinedCheck, ev: Evidence) -> MinedTask:
        """`p`'s task (made now for a dropped row) checked by `check`."""
        messages = self._messages(p)
        if p.task is not None:
            state, reference = p.task.state, p.task.reference
        else:
            got = task_checks(p.row, messages, None, self.mining, other_check=True)
            assert not isinstance(got, str)  # other_check: never "no check"
            state, reference = got
        state, reference = with_check(state, reference, check, self.name, ev.sides)
        trusted = verdict_trusted(p.row)
        whose = Trust.OPERATOR if trusted else Trust.END_USER
        state = state.but(trust=whose.label)  # the verdict's
        if not trusted and state.no_demo is None:
            state = state.but(no_demo="checked by a miner's check on an end user's verdict")
        bare = bare_verdict(p.row)
        if bare is not None:  # a re-ask or a bare rejection: trains, never validates
            state = state.but(bare_verdict=BareVerdictMark(signal=bare, check="miner"))
        if p.task is None:
            return new_task(p.row, messages, reference, state)
        p.task.state, p.task.reference = state, reference
        return p.task


def with_check(
    state: TaskChecks, reference: Any, check: MinedCheck, miner: str, tested_on: str
) -> tuple[TaskChecks, Any]:
    """A task's (state, reference) with `check` added: its answer is the reference (a rubric
    is then not needed), its rules join the task's, its rubric joins the task's rubric."""
    if check.answer is not None:
        reference = check.answer.value
        state = state.but(scorer=check.answer.scorer).without("rubric")
    have = {(r["kind"], str(r.get("arg"))) for r in state.rules}
    added = [r.to_dict() for r in check.rules if (r.kind, str(r.arg)) not in have]
    state = state.but(rules=(*state.rules, *added))
    if check.rubric and check.answer is None:
        before = state.rubric
        state = state.but(rubric=f"{before} {check.rubric}" if before else check.rubric)
    return state.but(mined_check=check.record(miner, tested_on)), reference
