"""What the user's next turn says about a reply, read with no model call.

`read_followup(followup, reply)` returns one `Followup` or None:

- **correction**: the user says the reply is wrong and gives the right value ("No, that's
  wrong: it's 17 km", "actually 12", "should be 3.5 kg", "Wrong, the capital is Canberra") →
  a reference (a number, a number with its unit, or the quoted / restated answer);
- **rejection**: wrong without the right value ("that's wrong", "still fails", "doesn't
  work", "not what I asked") → a thumbs-down;
- **rule**: a restated rule ("just the number", "in French", "under 50 words", "shorter") →
  checks, as `checks.find_rules` reads them in a request (a correction or rejection may state
  one too);
- **acceptance**: "thanks, that works", "perfect", "exactly" → a thumbs-up;
- None: anything else (a new question, small talk, an answer to the assistant's own question).

The patterns are plain English phrasings, each bounded (no unbounded gap), read on the first
`MAX_FOLLOWUP_CHARS` of the turn. A reply that ends with a question makes a leading "yes" /
"no" an answer to it, not feedback. Precision is measured in `benchmarks/bench_followups.py`
on a corpus written for it; what this misses, the miner model reads (`--miner-model`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from selftaught.sleep.night.checks import Rule, find_rules

FollowupKind = Literal["correction", "rejection", "rule", "acceptance"]
MAX_FOLLOWUP_CHARS = 600
"""Longer turns are read on their start only: feedback comes first, a new request after."""

_I = re.IGNORECASE
# "no, ...", "nope", "wrong", "that's not right", "incorrect", "you made a mistake"
_REJECT = re.compile(
    r"^\W{0,3}(?:no+|nope|nah|nein|non)\b(?!\s+(?:worries|problem|rush|need|thanks|idea|way|"
    r"doubt|pressure|hurry|matter|kidding|offen[cs]e|big deal|longer)\b)"
    r"|\b(?:wrong|incorrect|inaccurate|not (?:right|correct|true|accurate|quite)|"
    r"(?:is|was|that's|thats|that is|it's|its) not (?:it|what i (?:asked|wanted|meant|need))|"
    r"not what i (?:asked|wanted|meant|need(?:ed)?)|you (?:got|have) (?:it|that|this) wrong|"
    r"(?:a|that's a|made a) mistake|try again|doesn'?t (?:work|compile|run|help|answer)|"
    r"does not (?:work|compile|run|help|answer)|didn'?t (?:work|help)|did not (?:work|help)|"
    r"(?:still|now it) (?:fails|failing|broken|crashes|errors?|doesn'?t|does not|wrong|red)|"
    r"(?:test|tests|build|it) (?:still )?(?:fails|failed|is failing|are failing|broke)|"
    r"that'?s (?:false|off|bogus)|not even close|makes no sense)\b",
    _I,
)
# a value after a correcting phrase: "it's 17 km", "should be 3.5 kg", "the answer is 42"
_VALUE_LEAD = (
    r"(?:(?:the )?(?:correct|right|real|actual|true) (?:answer|value|result|one) (?:is|was|=)|"
    r"(?:the )?answer (?:is|was|should be)|should (?:be|have been|'?ve been)|"
    r"(?:it|that|this)(?:'s| is| was)(?: actually)?|actually(?: it'?s| it is)?|"
    r"(?:is|was|equals|=)|(?:it|that) (?:comes to|equals))"
)
_NUMBER = r"[-+]?\$?\d[\d,]*(?:\.\d+)?"
_UNIT = r"[a-z%°€£µ][a-z%°µ/²³]{0,11}"
_VALUE_NUMBER = re.compile(rf"\b{_VALUE_LEAD}\s{{0,3}}:?\s{{0,3}}({_NUMBER})(?:\s?({_UNIT}))?", _I)
_VALUE_QUOTED = re.compile(
    r'"([^"\n]{1,80})"|“([^”\n]{1,80})”|`([^`\n]{1,80})`|(?<!\w)\'([^\'\n]{1,80})\'(?!\w)'
)
_VALUE_WORDS = re.compile(
    r"\b(?:(?:the )?(?:correct|right|real|actual) (?:answer|one|value) (?:is|was)|"
    r"(?:it|that|this)(?:'s| is) actually|should be|it'?s|is)\s{1,3}"
    r"([A-Z][\w'-]{0,30}(?: [A-Z][\w'-]{0,30}){0,3})\b"
)
_BARE_VALUE = re.compile(
    rf"^\W{{0,3}}(?:no+|nope|wrong|nah|incorrect|not quite)\W{{1,4}}"
    rf"({_NUMBER})(?:\s?({_UNIT}))?\W*$",
    _I,
)
_WORDS_NOT_UNITS = (
    "and or but not so because since as please pls thanks thank you i the a an is was it "
    "its instead either sorry though then also which that this yet if"
)
_NOT_UNITS = frozenset(_WORDS_NOT_UNITS.split())
_ACCEPT_FIRST = re.compile(
    r"^\W{0,3}(?:thanks?|thank you|thx|ty|cheers|perfect|great|awesome|excellent|brilliant|"
    r"exactly|correct(?!\s+me)|spot on|good job|well done|merci|gracias|danke|"
    r"(?:that|this|it)(?:'s| is) (?:right|correct|it|perfect|great|exactly what i)|"
    r"(?:yes|yep|yup|yeah|ok(?:ay)?|nice|cool)(?:\W{1,3}(?:thanks?|thank you|exactly|perfect|"
    r"correct|that'?s (?:right|it|correct)|that works|works)\b|\W{0,3}$))",
    _I,
)
_ACCEPT_ANY = re.compile(
    r"\b(?:that|this|it) (?:works|worked|fixed it|did it|did the trick)\b"
    r"|\b(?:works|passes|passing|green) now\b|\bthanks?(?: a lot| so much)?\W{0,3}$"
    r"|\b(?:tests?|it|build|ci) (?:all )?(?:pass(?:es)?|passing|is green|are green|works)\b",
    _I,
)
_SHORTER = re.compile(
    r"\b(?:shorter|more concise|too long|too verbose|less verbose|briefer|be brief)\b", _I
)
# a new question or request, not a verdict on the reply ("What's the wrong way to ...?")
_NEW_QUESTION = re.compile(
    r"^\W{0,3}(?:what|how|why|when|where|which|who|whose|can you|could you|would you|"
    r"please explain|explain|tell me|correct me|is there|are there|do you|does)\b",
    _I,
)
_YES_NO = re.compile(r"^\W{0,3}(?:yes|yep|yeah|no|nope|sure|ok(?:ay)?)\b", _I)


@dataclass(frozen=True)
class Followup:
    """What one next turn says about a reply; `words` is the turn it came from."""

    kind: FollowupKind
    words: str
    reference: str | None = None
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    @property
    def thumb(self) -> Literal["up", "down"] | None:
        if self.kind in ("correction", "rejection"):
            return "down"
        if self.kind == "acceptance":
            return "up"
        return None


def _value(text: str, reply: str) -> str | None:
    """The right value the user gives in `text`, not one the reply already said."""
    m = _BARE_VALUE.match(text) or _VALUE_NUMBER.search(text)
    if m is not None:
        number, unit = m.group(1), (m.group(2) or "")
        if unit.lower() in _NOT_UNITS:
            unit = ""
        value = f"{number} {unit}".strip()
        return value if not _said(reply, number, unit) else None
    for pattern in (_VALUE_QUOTED, _VALUE_WORDS):
        for m in pattern.finditer(text):
            value = next(g for g in m.groups() if g is not None).strip().rstrip(".,;:!?")
            if value and value.lower() not in reply.lower() and value.lower() not in _NOT_UNITS:
                return value
    return None


def _said(reply: str, number: str, unit: str) -> bool:
    """The reply already gave this number (and unit): the user quotes it, not corrects it."""
    digits = number.lstrip("+$").replace(",", "")
    found = re.findall(_NUMBER, reply.replace(",", ""))
    if digits not in [f.lstrip("+$") for f in found]:
        return False
    with_unit = rf"{re.escape(digits)}\s?{re.escape(unit)}\b"
    return not unit or re.search(with_unit, reply, _I) is not None


def rules_in(text: str, reply: str | None = None) -> tuple[Rule, ...]:
    """The rules `text` states about a reply: `find_rules`'s, and "shorter" (at most half the
    words of `reply`, when there is one)."""
    rules = list(find_rules(text))
    m = _SHORTER.search(text)
    if m is not None and reply and not any(r.kind == "max_words" for r in rules):
        half = max(1, len(reply.split()) // 2)
        rules.append(Rule("max_words", half, m.group(0)))
    return tuple(rules)


def read_followup(followup: str | None, reply: str) -> Followup | None:
    """What `followup` (the user's next turn) says about `reply`, or None when nothing."""
    if not followup or not followup.strip():
        return None
    text = " ".join(followup[:MAX_FOLLOWUP_CHARS].split())
    answers_question = reply.rstrip().endswith("?") and _YES_NO.match(text) is not None
    rules = rules_in(text, reply)
    asks = _NEW_QUESTION.match(text) is not None
    rejected = _REJECT.search(text) is not None and not answers_question and not asks
    if rejected:
        value = _value(text, reply)
        if value is not None:
            return Followup("correction", text, value, rules)
        return Followup("rejection", text, None, rules)
    if rules:
        return Followup("rule", text, None, rules)
    if answers_question:
        return None
    if _ACCEPT_FIRST.search(text) is not None or (
        _ACCEPT_ANY.search(text) is not None and "?" not in text
    ):
        return Followup("acceptance", text)
    return None
