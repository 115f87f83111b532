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
on corpora written for it; what this misses (nothing read, or a rejection without its value),
the miner model reads (`followup_model.py`).
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
# Words that say "wrong" on their own, in the languages `checks.LANGUAGES` names.
_VERDICT_WORDS = (
    r"not quite|not really|not even close|no way|wrong \w{1,12}|"
    r"that'?s (?:wrong|incorrect|not right|not it|false)|"
    r"no+|nope|nah|nein|non|nee|wrong|incorrect|inaccurate|false|"
    r"faux|c'?est faux|falsch|das ist falsch|sbagliato|errato|errado|incorrecto|incorrecta|"
    r"incorreto|es incorrecto|est(?:á|a) mal|fout|klopt niet|i don'?t think so"
)
# "no" that is not a verdict: "no worries", "no more than 50 words", "nah, no need"
_NOT_A_NO = re.compile(
    r"^\W{0,3}(?:no+|nah|nope|non)\W{0,3}(?:no )?(?:worries|problem|problems|rush|need|thanks|"
    r"idea|doubt|pressure|hurry|matter|kidding|offen[cs]e|big deal|longer|more|less|fewer|"
    r"further|other|one|complaints|issues)\b",
    _I,
)
_LEADING_VERDICT = re.compile(rf"^\W{{0,3}}(?:{_VERDICT_WORDS})(?=\W|$)", _I)
_REJECT = re.compile(
    r"\b(?:wrong|incorrect|inaccurate|not (?:right|correct|true|accurate|quite)|"
    r"(?:is|was|that's|thats|that is|it's|its) not (?:it|what i (?:asked|wanted|meant|need))|"
    r"not what i (?:asked|wanted|meant|need(?:ed)?)|i (?:asked|wanted) for|"
    r"you (?:got|have) (?:it|that|this) wrong|you misread|you misunderst\w{0,4}|"
    r"(?:a|that's a|made a) mistake|try again|doesn'?t (?:work|compile|run|help|answer|fix)|"
    r"does not (?:work|compile|run|help|answer|fix)|didn'?t (?:work|help|fix)|"
    r"did not (?:work|help|fix)|no luck|made it worse|can'?t be right|i don'?t think so|"
    r"(?:still|now it) (?:fails|failing|broken|crash\w{0,3}|errors?|doesn'?t|does not|wrong|red|"
    r"getting|get|see|seeing|the same|times out|timing out|hangs|loops|the original|not)|"
    r"same (?:error|crash|traceback|problem|issue|result|output|bug|thing)|nothing changed|"
    r"(?:now it|it now|now) (?:hangs|loops|crashes|fails)|"
    r"(?:test|tests|build|it) (?:still )?(?:fails|failed|is failing|are failing|broke)|"
    r"(?:this|it) is broken|isn'?t (?:\w{1,20} ){0,3}at all|"
    r"that'?s (?:false|off|bogus)|not even close|makes no sense|"
    r"c'?est faux|ne marche (?:toujours )?pas|ne fonctionne pas|falsch|funktioniert nicht|"
    r"sbagliato|non funziona|errado|n(?:ã|a)o funciona|n(?:ã|a)o est(?:á|a) certo|"
    r"incorrecto|no funciona|est(?:á|a) mal|werkt niet|klopt niet)(?=\W|$)",
    _I,
)
_NEGATED = re.compile(
    r"\b(?:no complaints|nothing wrong|not wrong|no issues|no problems?|not bad)\b", _I
)
_NUMBER = r"[-+]?[$€£]?\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:[^\W\d_]|[%°€£µ$])(?:[^\W\d_]|[%°µ/²³])?(?:[^\W\d_]|[/²³.]){0,10}"
_NUMBER_UNIT = re.compile(rf"(?<![\w.])({_NUMBER})(?:\s?({_UNIT}))?", _I)
_VALUE_QUOTED = re.compile(
    r'"([^"\n]{1,80})"|“([^”\n]{1,80})”|`([^`\n]{1,80})`|(?<!\w)\'([^\'\n]{1,80})\'(?!\w)'
)
# a clause's opening words before the value: "it's", "c'est", "son", "the answer is", "more like"
_VALUE_LEAD = re.compile(
    r"^(?:(?:it|that) (?:comes to|equals|prints|returns|outputs|says|gives)|"
    r"(?:the )?(?:correct|right|real|actual|true) (?:answer|value|result|one) (?:is|was)|"
    r"(?:the )?answer (?:is|was|should be)|should (?:be|have been)|more like|closer to|"
    r"(?:it|that|this|there)(?:'s| is| was| has| are| were)?(?: actually| on| in| at)?|"
    r"actually|c'est|ce sont|son|es|sono|è|são|é|es sind|sind|ist|het is|zijn|"
    r"(?:the )?\w{1,12} (?:says|said|shows|reads|quoted|is)|(?:i get|i got|i see))\s+",
    _I,
)
_CLAUSES = re.compile(r"\s*(?:[.;:!—–](?=\s|$)|,(?=\s)|\s-\s)\s*")
_NOT_X = re.compile(r"^(.{1,60}?),?\s+not\s+([^\s,.;:!?]{1,40})", _I)
# a value in words has a capital or a symbol ("Jane Austen", "O(n)", "-R"); "nothing changed"
# does not
_LOOKS_LIKE_VALUE = re.compile(r"[A-Z(){}\[\]^*/=+<>_-]")
_SMALL_NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve"
_NUMBER_WORDS = {w: i for i, w in enumerate(_SMALL_NUMBERS.split())}
_STOP_WORDS = (
    "and or but not so because since as please pls thanks thank you i the a an is was it "
    "its instead either sorry though then also which that this yet if to of for on in at "
    "by with from more less than like about just only my your"
)
_STOP = frozenset(_STOP_WORDS.split())
_ACCEPT_FIRST = re.compile(
    r"^\W{0,3}(?:thanks?\b(?!-| in advance| for asking)|thank you(?! in advance| for asking)|thx|"
    r"ty|cheers|perfect|great|awesome|excellent|brilliant|exactly|correct(?!\s+me)|spot on|"
    r"good job|well done|bingo|lgtm|looks good|confirmed|right answer|you'?re right|"
    r"works like a charm|merci|gracias|danke|grazie|obrigad[oa]|bedankt|parfait|perfecto|"
    r"perfetto|genau|esatto|exacto|klopt|c'?est (?:ça|correct|juste)|est(?:á|a) (?:certo|bien)|"
    r"(?:that|this|it)(?:'s| is) (?:right|correct|it|perfect|great|exactly|the one)|"
    r"(?:yes|yep|yup|yeah|ok(?:ay)?|nice|cool|lovely)(?:\W{1,3}(?:thanks?|thank you|exactly|"
    r"perfect|correct|that'?s (?:right|it|correct|the one|exactly)|that works|works|fixed)\b|"
    r"\W{0,3}$))",
    _I,
)
_ACCEPT_ANY = re.compile(
    r"\b(?:that|this|it) (?:works|worked|fixed it|did it|did the trick)\b"
    r"|\b(?:works|passes|passing|green|compiles|builds) now\b"
    r"|\bthank(?:s| you)(?: a lot| so much)?\W{0,4}$|\bno more errors\b|\byou'?re right\b"
    r"|\b(?:tests?|it|build|ci) (?:all )?(?:pass(?:es)?|passing|is green|are green|works)\b"
    r"|\blooks good\b|\bthat'?s (?:exactly|the one|it|right|correct)\b",
    _I,
)
_SHORTER = re.compile(
    r"\b(?:shorter|more concise|too long|too verbose|less verbose|briefer|be brief|kürzer|"
    r"plus court|más corto|più breve)\b",
    _I,
)
# a new question or request, not a verdict on the reply ("What's the wrong way to ...?")
_NEW_QUESTION = re.compile(
    r"^\W{0,3}(?:what|how|why|when|where|which|who|whose|can you|could you|would you|"
    r"please explain|explain|tell me|correct me|is there|are there|is it|is that|are you|"
    r"do you|does|did|actually,)\b",
    _I,
)
# a question about the reply itself: "Can you make that two sentences at most?"
_ABOUT_REPLY = re.compile(
    r"^\W{0,3}(?:can|could|would) you(?: please)? (?:make|keep|put|rewrite|redo|shorten|format|"
    r"give|answer|reply|write|say) (?:it|that|this|me|the answer|again)\b",
    _I,
)
_YES_NO = re.compile(r"^\W{0,3}(?:yes|yep|yeah|no|nope|nah|sure|ok(?:ay)?)\b", _I)


@dataclass(frozen=True)
class Followup:
    """What one next turn says about a reply; `words` is the turn it came from."""

    kind: FollowupKind
    words: str
    reference: str | None = None
    rules: tuple[Rule, ...] = field(default_factory=tuple)
    by: str | None = None
    """The model that read it (`followup_model.py`); None: the rules here."""

    @property
    def thumb(self) -> Literal["up", "down"] | None:
        if self.kind in ("correction", "rejection"):
            return "down"
        if self.kind == "acceptance":
            return "up"
        return None


def _content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[^\W_][\w'-]{0,30}", text.lower()) if w not in _STOP]


def _in_reply(value: str, reply: str) -> bool:
    """The reply already said `value` (its number and unit, or its words)."""
    m = _NUMBER_UNIT.fullmatch(value.strip())
    if m is not None:
        return _said(reply, m.group(1), m.group(2) or "")
    if len(value) <= 3:  # "-R" is not "-r"
        return value in reply
    return value.lower() in reply.lower()


def _clause_value(clause: str, reply: str, plain: bool = False) -> str | None:
    """The value a short clause after a verdict states: its number (and unit), else the clause
    itself when it is a few words with no verdict in them (with a capital or a symbol, unless
    `plain`), when the reply did not say it. A value the user asserts ("it's 17 km", "should
    be 8080") counts even when the reply held it in a wrong form ("17 km and 3")."""
    stripped = _VALUE_LEAD.sub("", _VALUE_LEAD.sub("", clause.strip(), count=1), count=1)
    asserted = stripped.strip() != clause.strip()
    clause = stripped.strip()
    if not clause or _REJECT.search(clause) or _LEADING_VERDICT.match(clause):
        return None
    if re.match(r"^(?:not|but|and|so|because)\b", clause, _I):
        return None
    m = _NUMBER_UNIT.search(clause)
    if m is not None:
        unit = m.group(2) or ""
        value = f"{m.group(1)} {unit}".strip() if unit.lower() not in _STOP else m.group(1)
        if len(clause.split()) <= 3 and _content_words(clause):  # "June 2024", "100 °C"
            value = clause
        value = value.rstrip(".,;:!")
        said = _said(reply, m.group(1), "" if value == m.group(1) else unit)
        return None if said and not (asserted and reply.strip() != value) else value
    if (
        len(clause.split()) <= 4
        and _content_words(clause)
        and (plain or _LOOKS_LIKE_VALUE.search(clause))
    ):
        value = clause.rstrip(".,;:!?").strip()
        return None if _in_reply(value, reply) else value
    return None


def _not_x(text: str, reply: str) -> str | None:
    """ "It's 320 lines, not 300": the value before `not`, when what follows `not` is what the
    reply said."""
    for clause in re.split(r"[.;!?](?:\s+|$)", text):
        m = _NOT_X.match(clause.strip())
        if m is None:
            continue
        said = _content_words(m.group(2))
        said += [str(_NUMBER_WORDS[w]) for w in said if w in _NUMBER_WORDS]
        if not any(w in reply.lower() for w in said):
            continue
        before = m.group(1).split(",")[-1].strip()
        lead = _LEADING_VERDICT.match(before)
        if lead is not None:
            before = before[lead.end() :].strip(" ,—–-:")
        if _NUMBER_UNIT.search(before) is None:
            before = " ".join(before.split()[-4:])
        value = _clause_value(before, reply, plain=True)
        if value is not None:
            return value
    return None


def _value(text: str, reply: str) -> str | None:
    """The right value the user gives in `text` after saying the reply is wrong, not one the
    reply already said: a quoted one, "X, not Y", or a short clause after the verdict."""
    for m in _VALUE_QUOTED.finditer(text):
        value = next(g for g in m.groups() if g is not None).strip().rstrip(".,;:!?")
        if value and not _in_reply(value, reply) and value.lower() not in _STOP:
            return value
    found = _not_x(text, reply)
    if found is not None:
        return found
    clauses = [c.strip() for c in _CLAUSES.split(text) if c.strip()]
    lead = _LEADING_VERDICT.match(clauses[0]) if clauses else None
    if lead is not None and _NUMBER_UNIT.search(clauses[0][lead.end() :]):
        clauses[0] = clauses[0][lead.end() :]  # "nah it prints 7"
    verdict = next(
        (i for i, c in enumerate(clauses) if _LEADING_VERDICT.match(c) or _REJECT.search(c)),
        None,
    )
    start = 0 if lead is not None and verdict != 0 else (verdict or 0) + 1
    for clause in clauses[start : start + 3]:
        if _LEADING_VERDICT.fullmatch(clause) or _REJECT.search(clause):
            continue
        value = _clause_value(clause, reply)
        if value is not None:
            return value
    return None


def _said(reply: str, number: str, unit: str) -> bool:
    """The reply already gave this number (and unit): the user quotes it, not corrects it."""
    digits = number.lstrip("+$€£").replace(",", "")
    found = re.findall(_NUMBER, reply.replace(",", ""))
    if digits not in [f.lstrip("+$€£") for f in found]:
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
    if reply.rstrip().endswith("?") and _YES_NO.match(text) is not None:
        return None  # an answer to the assistant's own question
    unquoted = _VALUE_QUOTED.sub(" ", text)  # a quoted "that's wrong" is mentioned, not said
    asks = "?" in text or _NEW_QUESTION.match(text) is not None
    leading = _LEADING_VERDICT.match(text) is not None and _NOT_A_NO.match(text) is None
    negated = _NEGATED.search(unquoted) is not None
    rejected = not negated and (leading or (not asks and _REJECT.search(unquoted) is not None))
    rules = rules_in(text, reply) if not asks or _ABOUT_REPLY.match(text) else ()
    if rejected:
        value = _value(text, reply)
        if value is not None:
            return Followup("correction", text, value, rules)
        return Followup("rejection", text, None, rules)
    if not asks and not negated:  # "actually 12", "it's 320 lines, not 300": no "wrong" said
        actually = re.match(r"^\W{0,3}actually\b\W{0,3}", text, _I)
        value = _not_x(text, reply) or (
            _clause_value(text[actually.end() :], reply) if actually else None
        )
        if value is not None:
            return Followup("correction", text, value, rules)
    if rules:
        return Followup("rule", text, None, rules)
    if _ACCEPT_FIRST.search(text) is not None or (
        _ACCEPT_ANY.search(unquoted) is not None and not asks
    ):
        return Followup("acceptance", text)
    return None
