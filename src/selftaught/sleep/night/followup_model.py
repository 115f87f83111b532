"""What the user's next turn says about a reply, read by the miner model where the rules
(`followup.read_followup`) read only a rejection without the right value (or, reading
`"turns"`, nothing at all).

The rules read first and cost nothing; the model is never asked about a turn they read as a
correction with its value, a restated rule or an acceptance. For each turn left, the miner
(`miner.Miner`: its model, charged to the night's ledger and evidence log, its budget, its
privacy rule) is shown the request, the reply and the turn, redacted and quoted as JSON strings.
Two readings (`MinerConfig.followup_reading`):

- `"values"` (the default): asked only where the rules read a rejection, ONE question: which
  value does the user give as the right one (`prompts/followup_value.md`)? A value the turn
  bears out makes the rejection a correction; anything else leaves the rejection as it was. It
  cannot raise a signal the rules did not.
- `"turns"`: also asked where the rules read nothing, in a closed vocabulary
  (`prompts/followup.md`): a correction with its value, a rejection, rules (`FOLLOWUP_RULES`),
  an acceptance, or none. A signal on a turn the rules read nothing in is kept only where the
  rules see a cue of its kind there (`followup.has_cue`: a verdict for a rejection, thanks for
  an acceptance, a verdict or a value in the place of the reply's for a correction), so a turn
  with no such cue stays no signal whatever the model says.

A reply outside the form gets ONE repair call (`prompts/followup_repair.md`,
`prompts/followup_value_repair.md`); still unreadable, the turn keeps the rules' reading and the
failure is counted, never guessed.

The turn is an end user's words: at most they pick a label of the vocabulary. What the model
says is kept only where the turn bears it out:

- a correction's value must be in the turn itself (case, spacing, thousands separators and
  number formatting aside) and not be what the reply already said; otherwise the correction
  is read as a rejection (`downgraded`);
- a rule must be borne out by the turn (its count written in it, its language named, a word of
  its kind: "bullet", "json", "short" ...); a rule outside the vocabulary is dropped;
- where the rules read a rejection, the model can only add its value: any other answer keeps
  the rules' rejection.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from selftaught import prompts
from selftaught.models.base import GenerationParams, run_sync
from selftaught.skill.reflect import render
from selftaught.sleep.night.checks import LANGUAGES, Rule, languages_named
from selftaught.sleep.night.followup import MAX_FOLLOWUP_CHARS, Followup, has_cue
from selftaught.sleep.night.mine import quoted
from selftaught.sleep.night.miner import (
    ANSWERED,
    FollowupReading,
    Miner,
    MinerParseError,
    Parsed,
    first_error,
    load_prompt,
    parse_rate,
    reply_object,
)
from selftaught.sleep.records import FollowupModelRecord
from selftaught.tasks.extract import extract_json

ReadKind = Literal["correction", "rejection", "rule", "acceptance", "none"]
READ_KINDS: tuple[str, ...] = get_args(ReadKind)
READINGS: tuple[str, ...] = get_args(FollowupReading)
FOLLOWUP_RULES = (
    "max_words",
    "max_sentences",
    "max_chars",
    "json",
    "bullets",
    "numbered",
    "just_number",
    "shorter",
    "language",
)
_COUNTED = ("max_words", "max_sentences", "max_chars")
PROMPTS = ("followup", "followup_repair")
VALUE_PROMPTS = ("followup_value", "followup_value_repair")
PROMPT_TEXT = "\n".join(prompts.packaged(name) for name in (*PROMPTS, *VALUE_PROMPTS))
MAX_VALUE_CHARS = 120
MAX_REQUEST_CHARS = 600
MAX_REPLY_CHARS = 1200


@dataclass(frozen=True)
class ModelRead:
    """The model's answer, parsed: its kind, a correction's value, the rules in the
    vocabulary, and how many parts were outside it."""

    kind: ReadKind
    value: str | None = None
    rules: tuple[Rule, ...] = ()
    invalid: int = 0


def _rule(raw: Any) -> Rule | None:
    """One rule of the vocabulary (a count unchecked yet), or None."""
    if not isinstance(raw, dict) or raw.get("kind") not in FOLLOWUP_RULES:
        return None
    kind, value = raw["kind"], raw.get("value")
    if kind in _COUNTED:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 10_000
        return Rule(kind, value) if ok else None
    if kind == "language":
        name = str(value or "").strip().lower()
        return Rule(kind, name) if name in LANGUAGES else None
    return Rule(kind)


def parse_read(text: str) -> ModelRead:
    """The model's answer; MinerParseError when it is no JSON object of the vocabulary."""
    value = reply_object(text)
    kind = value.get("kind")
    if kind not in READ_KINDS:
        raise MinerParseError(f"kind must be one of {', '.join(READ_KINDS)}, got {kind!r}")
    if kind == "correction":
        said = value.get("value")
        if isinstance(said, bool) or not isinstance(said, (str, int, float)) or not str(said):
            raise MinerParseError("a correction needs its value, as a text")
        if re.search(r"<[^<>\n]{1,80}>", str(said)) and str(said) in PROMPT_TEXT:
            raise MinerParseError(f"the value {said!r} copies the prompt's placeholder")
        return ModelRead("correction", str(said).strip())
    if kind == "rule":
        raw = value.get("rules")
        listed = raw if isinstance(raw, list) else [raw] if raw is not None else []
        rules = [r for r in map(_rule, listed) if r is not None]
        return ModelRead("rule", rules=tuple(rules), invalid=len(listed) - len(rules))
    return ModelRead(kind)


def parse_value(text: str) -> ModelRead:
    """The model's answer to "which value is the right one?": a correction with it, or a
    rejection (null); MinerParseError when it is no JSON object with a `value`."""
    try:
        value = extract_json(text)
    except ValueError as err:
        raise MinerParseError(str(err)) from err
    if not isinstance(value, dict) or "value" not in value:
        raise MinerParseError('expected a JSON object {"value": ...}')
    said = value["value"]
    if said is None or (isinstance(said, str) and not said.strip()):
        return ModelRead("rejection")
    if isinstance(said, bool) or not isinstance(said, (str, int, float)):
        raise MinerParseError("the value must be a text, a number or null")
    if re.search(r"<[^<>\n]{1,80}>", str(said)) and str(said) in PROMPT_TEXT:
        raise MinerParseError(f"the value {said!r} copies the prompt's placeholder")
    return ModelRead("correction", str(said).strip())


# ---- what the turn bears out ----------------------------------------------------------------


def _norm(text: str) -> str:
    """Case, spacing and thousands separators aside; "17 km" as "17km"."""
    t = unicodedata.normalize("NFKC", text).casefold()
    t = re.sub(r"(?<=\d)[,'’\u00a0\u202f ](?=\d{3}(?!\d))", "", t)
    t = " ".join(t.split())
    return re.sub(r"(?<=\d) (?=[^\W\d_]|[%°])", "", t)


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?")
_NUMBER_VALUE = re.compile(r"([-+]?[$€£]?)(\d+(?:\.\d+)?)(\S{0,12})")


def found_in(value: str, text: str) -> bool:
    """`value` is written in `text`, as a whole word or phrase: case, spacing, thousands
    separators and a number's formatting ("12.0", "12") aside."""
    v, t = _norm(value), _norm(text)
    if not v:
        return False
    sign = r"(?<![-+])" if v[0].isdigit() else ""  # "3" is not in "-3"
    if re.search(rf"(?<!\w)(?<!\d[.,]){sign}{re.escape(v)}(?!\w)(?![.,]\d)", t):
        return True
    m = _NUMBER_VALUE.fullmatch(v)
    if m is None:
        return False
    number = float(m.group(2)) * (-1 if "-" in m.group(1) else 1)
    return any(
        float(hit.group(0)) == number and t[hit.end() :].startswith(m.group(3))
        for hit in _NUMBER.finditer(t)
    )


def checked_value(value: str | None, followup: str, reply: str) -> str | None:
    """A correction's value when the user's turn bears it out: written in the turn, short, and
    not what the reply already said (the user quoting it); else None."""
    if value is None:
        return None
    marks = "\"'`“”‘’«»,;:!? "
    value = " ".join(value.split()).strip(marks).rstrip(".").strip(marks)
    if not value or len(value) > MAX_VALUE_CHARS or not found_in(value, followup):
        return None
    return None if found_in(value, reply) else value


# a word the turn must hold for a rule without a count (a weak model echoes the prompt's
# example rule on any turn: measured on the dev corpus, 14 "bullets" on 34 turns of no feedback)
_RULE_CUES = {
    "bullets": r"bullet|\bpoints\b|puces?\b|viñeta|stichpunkt|aufz[äa]hlung|punti elenco|"
    r"tópicos|opsomming|•",
    "numbered": r"number|numérot|nummer|numer|steps?\b|étapes?|pasos?\b|schritt|passi|stappen",
    "json": r"json",
    "just_number": r"number|digit|numeric|nombre|chiffre|n[úu]mero|zahl|getal|cijfer",
    "shorter": r"short|long|brief|concise|verbose|wordy|less|tl;?dr|court|corto|kurz|breve|kort",
}


def _said_in(rule: Rule, followup: str) -> bool:
    """The turn bears out `rule`: its count written in it, its language named, or a word of
    its kind (`_RULE_CUES`)."""
    text = _norm(followup)
    if rule.kind in _COUNTED:
        return re.search(rf"(?<!\d){rule.arg}(?!\d)", text) is not None
    if rule.kind == "language":
        return rule.arg in languages_named(text)
    cue = _RULE_CUES.get(rule.kind)
    return cue is not None and re.search(cue, text) is not None


# ---- asking --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FollowupAsk:
    """One next turn for the model: the request and its reply, the user's turn, what the
    rules read in it (nothing, or a bare rejection), and whether its rows are private."""

    request: str
    reply: str
    followup: str
    ruled: Followup | None = None
    private: bool = False

    @property
    def words(self) -> str:
        return " ".join(self.followup[:MAX_FOLLOWUP_CHARS].split())


def wants_model(
    followup: str | None, ruled: Followup | None, reading: FollowupReading = "values"
) -> bool:
    """Whether the model is asked about a next turn: there is one, and the rules read a
    rejection without its value in it (reading `"turns"`: or nothing)."""
    if not (followup and followup.strip()):
        return False
    return (ruled is not None and ruled.kind == "rejection") or (
        ruled is None and reading == "turns"
    )


def settle(ask: FollowupAsk, got: ModelRead, by: str) -> tuple[Followup | None, str]:
    """What the night takes from the model's reading of `ask`, and the outcome's name."""
    ruled = ask.ruled
    judged = got.kind in ("correction", "rejection", "acceptance")
    if ruled is None and judged and not has_cue(ask.followup, ask.reply, got.kind):
        return None, "no cue in the turn"  # a turn the rules see nothing of stays nothing
    if got.kind == "correction":
        value = checked_value(got.value, ask.words, ask.reply)
        rules = ruled.rules if ruled is not None else ()
        if value is not None:
            return Followup("correction", ask.words, value, rules, by=by), "correction"
        return ruled or Followup("rejection", ask.words, None, (), by=by), "downgraded"
    if ruled is not None:
        return ruled, "kept the rules' rejection"
    if got.kind in ("rejection", "acceptance"):
        return Followup(got.kind, ask.words, by=by), got.kind
    if got.kind == "rule":
        rules = _rules(got.rules, ask)
        if rules:
            return Followup("rule", ask.words, None, rules, by=by), "rule"
        return None, "rule the turn does not bear out"
    return None, "none"


def _rules(rules: tuple[Rule, ...], ask: FollowupAsk) -> tuple[Rule, ...]:
    """The rules the turn bears out, one per kind ("shorter": at most half the reply's
    words)."""
    out: dict[str, Rule] = {}
    for rule in rules:
        if not _said_in(rule, ask.words):
            continue
        if rule.kind == "shorter":
            rule = Rule("max_words", max(1, len(ask.reply.split()) // 2), "shorter")
        out.setdefault(rule.kind, Rule(rule.kind, rule.arg, rule.said or "read by the miner"))
    return tuple(out.values())


class ModelReader:
    """The miner in its second role: reads the next turns the rules could not
    (`read(asks)`), through the miner's own calls (its ledger, budget and concurrency)."""

    def __init__(self, miner: Miner, reading: FollowupReading | None = None):
        self.miner = miner
        self.reading: FollowupReading = reading or miner.config.followup_reading
        names = VALUE_PROMPTS if self.reading == "values" else PROMPTS
        self.prompt, self.repair_prompt = (load_prompt(name) for name in names)
        self.parse = parse_value if self.reading == "values" else parse_read
        self.params = GenerationParams(max_tokens=miner.config.followup_max_tokens, temperature=0.0)

    def read(self, asks: list[FollowupAsk]) -> tuple[list[Followup | None], FollowupModelRecord]:
        """Per ask, in order: what the night reads in the turn (the rules' reading where the
        model was not asked or not understood); and what the model read."""
        answers, skipped = self.answers(asks)
        return settle_answers(asks, answers, self.miner.name, skipped)

    def answers(
        self, asks: list[FollowupAsk]
    ) -> tuple[list[Parsed[ModelRead] | None], Counter[str]]:
        """Per ask, the model's answer (None: not asked); and the turns not asked, counted by
        why (`settle_answers` counts the answers)."""
        chosen, skipped = self._choose(asks)
        jobs = {i: functools.partial(self._ask, asks[i]) for i in chosen}
        got, stopped = run_sync(self.miner.gather(jobs))
        skipped.update(stopped)
        return [got.get(i) for i in range(len(asks))], skipped

    def _choose(self, asks: list[FollowupAsk]) -> tuple[list[int], Counter[str]]:
        """The turns to ask about: allowed to this miner, up to the cap, bare rejections
        first; and the others, counted by why."""
        skipped: Counter[str] = Counter()
        ranked = []
        for i, ask in enumerate(asks):
            if ask.private and not self.miner.send_private:
                skipped["private row: the miner is a remote model"] += 1
            else:
                ranked.append(i)
        ranked.sort(key=lambda i: asks[i].ruled is None)
        cap = self.miner.config.max_followups
        if len(ranked) > cap:
            skipped[f"over the cap of {cap} next turns a night"] += len(ranked) - cap
        return ranked[:cap], skipped

    async def _ask(self, ask: FollowupAsk) -> Parsed[ModelRead]:
        prompt = render(
            self.prompt,
            request=quoted(ask.request, MAX_REQUEST_CHARS) if ask.request.strip() else "(none)",
            reply=quoted(ask.reply, MAX_REPLY_CHARS),
            followup=quoted(ask.words, MAX_FOLLOWUP_CHARS),  # the end user's words, last
        )

        def repair(reply: str, error: str) -> str:
            return render(self.repair_prompt, reply=reply, error=error)

        return await self.miner.ask_parsed(prompt, self.parse, repair, self.params)


def settle_answers(
    asks: list[FollowupAsk],
    answers: list[Parsed[ModelRead] | None],
    model: str,
    skipped: Mapping[str, int],
) -> tuple[list[Followup | None], FollowupModelRecord]:
    """Per ask, what the night reads in the turn: `model`'s answer where it gave one the turn
    bears out (`settle`), else the rules' reading; and what the model read (`candidates`: the
    asks; `skipped`: the turns never asked, by why; an answer the budget stopped joins them)."""
    not_asked = Counter(skipped)
    asked: list[Parsed[ModelRead]] = []
    outcomes: Counter[str] = Counter()
    reads: list[Followup | None] = []
    for ask, got in zip(asks, answers, strict=True):
        read = ask.ruled
        if got is not None and got.status == "budget":
            spent = f" ({got.error})" if got.error else ""
            not_asked[f"the night's budget was spent{spent}"] += 1
        elif got is not None:
            asked.append(got)
            if got.status in ANSWERED and got.value is not None:
                read, outcome = settle(ask, got.value, model)
                outcomes[outcome] += 1
        reads.append(read)
    statuses = Counter(got.status for got in asked)
    return reads, FollowupModelRecord(
        model=model,
        candidates=len(asks),
        asked=len(asked),
        answered=sum(statuses[s] for s in ANSWERED),
        repaired=statuses["repaired"],
        parse_failures=statuses["invalid_json"],
        backend_errors=statuses["backend_error"],
        outcomes=dict(outcomes),
        invalid_parts=sum(got.value.invalid for got in asked if got.value is not None),
        skipped=dict(not_asked),
        first_error=first_error(asked),
        parse_rate=parse_rate(statuses),
    )
