"""How a mined task is checked: the strongest check the log supports, scored as free text.

- a **reference** (logged, or corrected later by feedback) → the task's scorer: `numeric` when
  the reference is a number, `quantity` when it is a number with a unit ("7 km": the number
  must match and the answer must end with the unit), else `normalized`;
- a **rule** the user stated in the request or the client's system prompt (length, format,
  language) → a rule check of this module (`find_rules`);
- a check the miner model wrote from a thread (`miner.py`): an expected answer, rules (among
  them `regex_must`, `regex_must_not` and `contains`, which only a miner writes) or a rubric;
- otherwise a **rubric** (written by the miner from the request and the feedback) scored by a
  judge model (`LlmJudge`, `--judge-model`).

A reply the user accepted has a reference of its own when its answer is short enough to check
without a judge (`short_answer`: a number, a number with a unit, a short text), scored by the
same choice as any reference.

A task's checks all count: hard = every check passed, soft = their mean, feedback = each
check's own words, then an end user's comment on the logged reply, quoted, when there is one
(`state["evidence"]`: evidence for the analyst, never a check or a rule). Rule checks are
heuristics over English phrasing; a check that cannot decide (a reply too short to tell its
language) passes rather than guesses.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from selftaught.errors import ConfigError, TaskError
from selftaught.sleep.records import RuleRow, TaskChecks, given
from selftaught.tasks.base import Example, Score
from selftaught.tasks.extract import extract_answer, extract_json
from selftaught.tasks.scorers import LlmJudge, normalize_text, parse_number, score_reference
from selftaught.text import words

# ---- rules the user stated ----------------------------------------------------------------

_SMALL = {
    "one": 1,
    "a single": 1,
    "a": 1,
    "single": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "twenty": 20,
    "fifty": 50,
    "hundred": 100,
}
_COUNT = r"(\d{1,4}|" + "|".join(sorted(_SMALL, key=len, reverse=True)) + ")"
_LIMIT = (
    r"(?:in|under|within|at most|no more than|not more than|fewer than|less than"
    r"|max(?:imum)?(?: of)?|up to|keep it to|keep it under|limit it to|stick to|just|only)"
)
_AT_MOST = r"(?:max(?:imum)?|at most|or less|or fewer|tops|top|maximum|max\.)"
_RULE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("max_words", re.compile(rf"\b{_LIMIT}\s+{_COUNT}\s+words?\b", re.I)),
    ("max_words", re.compile(rf"\b{_COUNT}[- ]word (?:answer|reply|response|summary)\b", re.I)),
    ("max_words", re.compile(rf"\b{_COUNT}\s+words?\s+{_AT_MOST}(?=\W|$)", re.I)),
    ("max_sentences", re.compile(rf"\b{_LIMIT}\s+{_COUNT}\s+sentences?\b", re.I)),
    ("max_sentences", re.compile(rf"\b{_COUNT}\s+sentences?\s+{_AT_MOST}(?=\W|$)", re.I)),
    ("max_chars", re.compile(rf"\b{_LIMIT}\s+(\d{{1,5}})\s+(?:characters|chars)\b", re.I)),
    (
        "json",
        re.compile(
            r"\b(?:as|in|return|reply with|respond with|output|answer with|formatted as|only)\s+"
            r"(?:valid\s+|a\s+|an\s+)?json\b|\bjson only\b|\bvalid json\b",
            re.I,
        ),
    ),
    (
        "bullets",
        re.compile(
            r"\b(?:bullet(?:ed)?[- ]?(?:point)?\s+list|bullet points|as bullets|use bullets)\b",
            re.I,
        ),
    ),
    ("numbered", re.compile(r"\bnumbered (?:list|steps|points|items)\b", re.I)),
    (
        "just_number",
        re.compile(
            r"\b(?:just|only)\s+(?:give\s+(?:me\s+)?)?(?:the\s+|a\s+)?(?:final\s+)?"
            r"(?:number|numeral|numeric answer|figure)s?\b"
            r"(?:\s+(?:and|with|plus|in|followed by)\s+(?:the\s+)?(?:unit\s+)?"
            r"\(?([a-z%°$€£µ]{1,8})\)?\b)?"
            r"|\b(?:number|digits|numeral)s?\s+only\b",
            re.I,
        ),
    ),
)
_UNIT_WORDS = frozenset(["the", "a", "an", "its", "unit", "units", "please", "pls", "thanks", "so"])
LANGUAGES = ("english", "french", "spanish", "german", "italian", "portuguese", "dutch")
# the languages' names in their own words (and a few in another's)
_LANGUAGE_NAMES = {
    "english": "english|anglais|inglés|ingles|englisch|inglese|inglês|engels",
    "french": "french|français|francais|francés|frances|französisch|francese|francês|frans",
    "spanish": "spanish|español|espanol|espagnol|spanisch|spagnolo|espanhol|spaans",
    "german": "german|deutsch|allemand|alemán|aleman|tedesco|alemão|duits",
    "italian": "italian|italiano|italien|italienisch|italiaans",
    "portuguese": "portuguese|português|portugues|portugais|portugiesisch|portoghese",
    "dutch": "dutch|nederlands|néerlandais|neerlandés|niederländisch|olandese",
}
_ANY_LANGUAGE = "|".join(_LANGUAGE_NAMES.values())
_LANGUAGE = re.compile(
    r"\b(?:answer|reply|respond|write|translate|speak|say|réponds|répondez|responde|antworte|"
    r"rispondi)\b(?:\s+\S+){0,4}?\s+(?:in|into|en|auf|em|in het)\s+(" + _ANY_LANGUAGE + r")\b"
    r"|^\W{0,3}(?:please\s+)?(?:in|en|auf|em|in het)\s+(" + _ANY_LANGUAGE + r")\b"
    r"|\b(" + _ANY_LANGUAGE + r")\s+(?:please|only|bitte|por favor|s'il (?:te|vous) pla[iî]t|"
    r"per favore|alsjeblieft)\b",
    re.I,
)


def language_named(word: str) -> str:
    """The LANGUAGES entry a language's name (in any of them) stands for."""
    word = word.lower()
    return next(k for k, names in _LANGUAGE_NAMES.items() if word in names.split("|"))


def languages_named(text: str) -> set[str]:
    """The LANGUAGES whose name (in any of them) `text` writes."""
    found = re.findall(rf"\b({_ANY_LANGUAGE})\b", text, re.I)
    return {language_named(word) for word in found}


def _words(text: str) -> list[str]:
    return text.split()


# Frequent short words that tell these languages apart (a heuristic, for replies of 4+ words).
_STOPWORDS: dict[str, frozenset[str]] = {
    "english": frozenset(_words("the and is are of to in that it with for this was you not")),
    "french": frozenset(_words("le la les et est un une des du que qui dans pour pas vous avec")),
    "spanish": frozenset(_words("el la los las y es un una que en por para con no del se")),
    "german": frozenset(_words("der die das und ist ein eine nicht mit zu den von sie es auf")),
    "italian": frozenset(_words("il lo la gli le e è un una che di per non con del sono")),
    "portuguese": frozenset(_words("o a os as e é um uma que de do da em para não com")),
    "dutch": frozenset(_words("de het een en is van dat niet met voor op zijn ik je")),
}


# ---- patterns a model wrote --------------------------------------------------------------

try:  # the `regex` package can stop a search after a time limit; `re` cannot
    import regex as _regex
except ImportError:  # a core install without it: a written pattern is never run
    _regex = None

MAX_PATTERN_CHARS = 200
"""A written pattern longer than this is refused."""
MAX_REPEATS = 10_000
"""The product of a written pattern's counted repeats (`{n}`, `{n,m}`) is capped: compiling
`((a{1000}){1000}){1000}` takes more memory than the machine has, and no time limit covers
compiling."""
_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")
REGEX_TIMEOUT_S = 0.25
"""A written pattern's search that runs longer fails its check (it never passes)."""
NO_REGEX_PACKAGE = (
    "regex checks need the `regex` package (a time limit on the search): "
    "pip install regex, or selftaught[local]"
)
REGEX_KINDS = ("regex_must", "regex_must_not")


def regex_available() -> bool:
    return _regex is not None


def pattern_problem(pattern: Any) -> str | None:
    """Why a written pattern cannot be a check (None: it can): not a string, empty, too long,
    the `regex` package absent, or it does not compile."""
    if not isinstance(pattern, str) or not pattern.strip():
        return "a regex rule needs a non-empty pattern"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"the pattern is {len(pattern)} characters, over {MAX_PATTERN_CHARS}"
    if _regex is None:
        return NO_REGEX_PACKAGE
    repeats = 1
    for m in _COUNTED.finditer(pattern):  # an overestimate: every count as if nested
        repeats *= max([int(n) for n in m.groups() if n] or [1], default=1) or 1
        if repeats > MAX_REPEATS:
            return (
                f"the pattern's counted repeats exceed {MAX_REPEATS} (compiling it could "
                "exhaust memory)"
            )
    try:
        _compiled(pattern)
    except Exception as err:  # regex.error, or an overflow on a pathological pattern
        return f"the pattern does not compile: {err}"
    return None


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    assert _regex is not None
    return _regex.compile(pattern)


def search_limited(pattern: str, text: str) -> bool | None:
    """Whether `pattern` matches somewhere in `text`, searched under `REGEX_TIMEOUT_S`; None
    when it could not be told (timed out, refused pattern, no `regex` package)."""
    if pattern_problem(pattern) is not None:
        return None
    try:
        return _compiled(pattern).search(text, timeout=REGEX_TIMEOUT_S) is not None
    except TimeoutError:
        return None


def _regex_check(kind: str, pattern: str, text: str) -> tuple[bool | None, str]:
    """A written pattern's verdict; None for one that cannot run or runs out of time."""
    problem = pattern_problem(pattern)
    if problem is not None:
        return None, problem
    found = search_limited(pattern, text)
    if found is None:
        return None, f"the pattern {pattern!r} ran past {REGEX_TIMEOUT_S:g} s"
    if kind == "regex_must":
        return found, f"matches {pattern!r}" if found else f"does not match {pattern!r}"
    return not found, f"matches {pattern!r}, which it must not" if found else "no forbidden match"


def _contains(text: str, wanted: str) -> tuple[bool, str]:
    """Case and spacing aside, `wanted` is in `text`."""
    have = " ".join(text.lower().split())
    want = " ".join(str(wanted).lower().split())
    ok = bool(want) and want in have
    return ok, f"contains {wanted!r}" if ok else f"does not contain {wanted!r}"


@dataclass(frozen=True)
class Rule:
    """A rule the user stated or the miner wrote: `kind` (max_words, max_sentences, max_chars,
    json, bullets, numbered, language, just_number; and only from the miner: regex_must,
    regex_must_not, contains) and its argument (a count, a language name, the unit a bare
    number must carry, a pattern, or a text)."""

    kind: str
    arg: Any = None
    said: str = ""  # the user's own words

    def to_dict(self) -> RuleRow:
        return RuleRow(kind=self.kind, arg=self.arg, said=self.said)

    def check(self, reply: str) -> tuple[bool, str]:
        """(passed, why) for one reply; a verdict that cannot be told fails (closed)."""
        ok, why = self.verdict(reply)
        return (ok, why) if ok is not None else (False, f"{why}: failed closed")

    def verdict(self, reply: str) -> tuple[bool | None, str]:
        """(passed, why) for one reply; None for passed when it cannot be told (a written
        pattern that cannot run or runs out of time): neither a pass nor a failure."""
        text = reply.strip()
        if self.kind == "max_words":
            n = len(text.split())
            return n <= self.arg, f"{n} words (the user asked for at most {self.arg})"
        if self.kind == "max_sentences":
            n = len([s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()])
            return n <= self.arg, f"{n} sentences (the user asked for at most {self.arg})"
        if self.kind == "max_chars":
            return len(text) <= self.arg, f"{len(text)} characters (at most {self.arg} asked)"
        if self.kind == "json":
            try:
                extract_json(text)
            except ValueError:
                return False, "no JSON in the reply (the user asked for JSON)"
            return True, "JSON given as asked"
        if self.kind in ("bullets", "numbered"):
            mark = r"[-*•]\s" if self.kind == "bullets" else r"\d+[.)]\s"
            items = sum(1 for line in text.splitlines() if re.match(rf"\s*{mark}", line))
            what = "bulleted" if self.kind == "bullets" else "numbered"
            return items >= 2, f"{items} {what} items (the user asked for a {what} list)"
        if self.kind == "just_number":
            return _just_number(text, self.arg)
        if self.kind == "language":
            found = detect_language(text)
            if found is None:
                return True, f"too short to tell its language (the user asked for {self.arg})"
            return found == self.arg, f"written in {found} (the user asked for {self.arg})"
        if self.kind in REGEX_KINDS:
            return _regex_check(self.kind, self.arg, text)
        if self.kind == "contains":
            return _contains(text, self.arg)
        raise TaskError(f"unknown rule kind {self.kind!r}")


_BARE_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?")


def _just_number(text: str, unit: str | None) -> tuple[bool, str]:
    """A reply that is only a number (and the unit, when the user named one)."""
    body = text.strip().rstrip(".!").strip()
    m = _BARE_NUMBER.match(body)
    rest = body[m.end() :].strip() if m else body
    asked = "just the number" + (f" and {unit}" if unit else "")
    if m is None:
        return False, f"no number at the start (the user asked for {asked})"
    if unit is None:
        return not rest, "a bare number" if not rest else f"more than a number: {rest[:40]!r}"
    if rest.lower() == unit:
        return True, f"a number and {unit}, as asked"
    return False, f"{rest[:40]!r} after the number (the user asked for {asked})"


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _SMALL[word.lower()]


def find_rules(text: str) -> list[Rule]:
    """The rules stated in `text` (one per kind, the first statement wins)."""
    rules: dict[str, Rule] = {}
    for kind, pattern in _RULE_PATTERNS:
        m = pattern.search(text)
        if m is None or kind in rules:
            continue
        if kind == "just_number":
            unit = (m.group(1) or "").lower()
            arg = unit if unit and unit not in _UNIT_WORDS else None
        else:
            arg = _count(m.group(1)) if m.groups() else None
            if arg == 0:
                continue
        rules[kind] = Rule(kind, arg, m.group(0))
    m = _LANGUAGE.search(text)
    if m is not None:
        name = next(g for g in m.groups() if g is not None)
        rules["language"] = Rule("language", language_named(name), m.group(0))
    return list(rules.values())


def detect_language(text: str) -> str | None:
    """The language of `text` among LANGUAGES by frequent short words; None when the text is
    too short or no language stands out."""
    words = re.findall(r"[a-zàâäéèêëïîôöùûüçñáíóúãõ]+", text.lower())
    if len(words) < 4:
        return None
    counts = {lang: sum(w in stop for w in words) for lang, stop in _STOPWORDS.items()}
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    (best, hits), (_, second) = ranked[0], ranked[1]
    return best if hits >= 2 and hits > second else None


# ---- the answer a reply gives --------------------------------------------------------------

_NON_ANSWER = re.compile(
    r"\b(?:i\s+(?:do\s+not|don'?t|can\s*not|can'?t)|not sure|unable|sorry|unknown|no idea)\b",
    re.I,
)
_NUM = re.compile(r"[-−]?\$?\d[\d,]*(?:\.\d+)?")
_WITH_UNIT = re.compile(r"^([-−]?\$?\d[\d,]*(?:\.\d+)?)\s*([A-Za-z°%µ€£][A-Za-z°%µ/²³]{0,15})$")


@dataclass(frozen=True)
class Answer:
    """The answer a reply gives: what two answers are compared by (`key`: self-consistency
    votes on it, `weak.py`) and the reference it becomes (`value`)."""

    key: str
    value: str


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def short_answer(reply: str, max_words: int = 6) -> Answer | None:
    """The answer a reply gives, when it is short enough to check without a judge (and to agree
    on): the final-answer marker's content (else the reply), after its last `=`; a number
    (keyed by its value), a number with a unit ("7 km"), else a short text (keyed normalized).
    None: no such answer (prose, several numbers, several lines, a refusal such as "I do not
    know")."""
    text = extract_answer(reply)
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    text = text.strip().strip("*`\"'").rstrip(".!").strip()
    if not text or "\n" in text or len(words(text)) > max_words:
        return None
    found = _NUM.findall(text)
    if len(found) > 1:
        return None
    if found:
        value = parse_number(found[0])
        if value is None or not math.isfinite(value):
            return None
        number = _number(value)
        unit = _WITH_UNIT.match(text)
        return Answer(number, f"{number} {unit.group(2)}" if unit else number)
    key = normalize_text(text)
    if not key or _NON_ANSWER.search(text):  # "I do not know" agreed is no label
        return None
    return Answer(key, text)


# ---- a mined task's score ------------------------------------------------------------------


def score_example(output: str, example: Example, judge: LlmJudge | None) -> Score:
    """Every check of a mined example (`example.state`: scorer, rules, rubric) on one reply."""
    state = example.state
    scores: list[Score] = []
    if state.get("scorer"):
        scores.append(score_reference(output, example, state["scorer"]))
    elif state.get("rubric"):
        if judge is None:
            raise ConfigError(f"task {example.id} is scored by a rubric but no judge model is set")
        scores.append(judge(output, example))
    for raw in state.get("rules", []):
        rule = Rule(**raw)
        ok, why = rule.check(output)
        scores.append(Score(float(ok), float(ok), f"rule {rule.kind}: {why}"))
    if not scores:
        raise TaskError(f"task {example.id} has no check")
    hard = float(all(s.hard for s in scores))
    soft = sum(s.soft for s in scores) / len(scores)
    said = [s.feedback for s in scores if s.feedback]
    if state.get("evidence"):
        said.append(
            "an end user commented on the logged reply (quoted evidence, not an instruction): "
            + str(state["evidence"])
        )
    return Score(hard, soft, "; ".join(said))


def describe_checks(state: TaskChecks) -> str:
    """One line naming a task's checks, for reports."""
    parts = []
    if state.workspace is not None:  # the agent's own test run (agent_outcome.py)
        parts.append(f"workspace check `{shlex.join(state.workspace.check)}`")
    if state.scorer:
        parts.append(f"reference ({state.scorer})")
    elif state.rubric:
        parts.append("rubric (judge)")
    parts += [f"rule {r['kind']}" + (f"={r['arg']}" if r.get("arg") else "") for r in state.rules]
    if given(state.mined_check):  # a check the miner wrote (`miner.py`)
        parts.append(f"written by {state.mined_check.by}")
    if state.expected_calls:
        parts.append(f"corrected tool call ({len(state.expected_calls)})")
    if state.tools:  # a replayed episode (selftaught.sleep.night.replay)
        parts.append(f"episode: {len(state.tools)} tools, {len(state.fixtures)} recorded results")
    return ", ".join(parts)
