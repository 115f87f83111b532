"""What the user's next turn says about a reply, read with no model call.

`read_followup(followup, reply)` returns one `Followup` or None:

- **correction**: the user says the reply is wrong and gives the right value, or gives a value
  that takes the place of the reply's ("No, that's wrong: it's 17 km", "42. not 24", "nope 42",
  "1666, famously", "c'est Baudelaire, pas Hugo", "5月22日に届きました。20日ではないです") → a
  reference (a number with its unit, a date, a name, a quoted value, a code output);
- **rejection**: wrong without the right value ("that's wrong", "still fails", "klopt niet",
  "答非所问", an error printed after a reply that said only what to run) → a thumbs-down;
- **rule**: a restated rule ("just the number", "in French", "under 50 words", "shorter") →
  checks, as `checks.find_rules` reads them in a request (a correction or rejection may state
  one too);
- **acceptance**: "thanks, that works", "perfect", "exactly", "верно" → a thumbs-up;
- None: anything else (a new question or request, small talk, an answer to the assistant's own
  question or to its request for what the user has, a turn that only mentions a mistake, one
  that moves to a new topic, reports someone else's verdict or hedges: "correct me if I'm
  wrong", one about the user's own input, doing or place: "I gave you the wrong list", "it's
  12 here", or the next thing asked: "now the 8 times table").

It reads in two parts. A **verdict detector** finds the cues of a judgement, in the languages
`followup_words` lists: a leading "no", a "wrong" word, a "did not work" phrase, doubt ("are you
sure", the reply's own value echoed with "??"), "X, not Y" where Y is what the reply said, "fine
but ...", thanks; it discounts what sits in a question, a request, quotes, or blames the user
("I typed the wrong movie") or someone else ("my friend says it's wrong"). A **value
extractor** lists the turn's values (numbers with their unit, dates, quoted spans, code, names)
and keeps those the reply did not say, less those a clause denies ("apt isn't a thing on
macOS"), those in a clause saying what the reply's own value really is ("1815 c'est Waterloo",
"401 is unauthorized") and what a restated request names ("I asked for the total"); it prefers
the value after "not Y"'s contrast, then one a lead word puts forward ("it's", "should be", "i
get", "c'est", "ist", "是"), then one that stands in the slot of the reply's value (after the
same word: "nació en Málaga" for "nació en Barcelona"), then a value standing alone ("1453"),
and a number whose unit measures what the reply's did ("2 uur" for "45 minuten", not "40 km")
before another number or a name. With no verdict cue, a value is a correction only where it
stands alone or is put forward, is of the kind the reply gave (a number for a number), and the
turn is no question, request or answer to the assistant's question.

Every pattern is bounded (no unbounded gap; the turn is read on its first `MAX_FOLLOWUP_CHARS`,
the reply on its first `MAX_REPLY_CHARS`). Precision and recall are measured in
`benchmarks/bench_followups.py`; what this misses (nothing read, or a rejection without its
value), the miner model may read (`followup_model.py`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from selftaught.sleep.night import followup_words as W
from selftaught.sleep.night.checks import Rule, find_rules

FollowupKind = Literal["correction", "rejection", "rule", "acceptance"]
MAX_FOLLOWUP_CHARS = 600
"""Longer turns are read on their start only: feedback comes first, a new request after."""
MAX_REPLY_CHARS = 4000
"""The reply is read on its start: the value a user corrects is said early."""
MAX_CLAIMS = 64
"""The reply's first values, among which the one a clause of the turn explains is looked for."""
MAX_TAILS = 64
"""The words after the reply's first numbers that a number in the turn may take as its unit."""

_I = re.IGNORECASE
_NO = W.NO.pattern("start")
_WRONG = W.WRONG.pattern()
_FAILED = W.FAILED.pattern()
_ACCEPT = W.ACCEPT.pattern()
_ACCEPT_START = W.ACCEPT.pattern("start")
_BUT = W.BUT.pattern()
_LEAD = W.LEAD.pattern("end")
_CLAIM = W.LEAD.pattern()

# ---- values ---------------------------------------------------------------------------------

_ONE = r"(?:\d{1,3}(?:[ \u00a0\u202f]\d{3}){1,4}(?!\d)|\d{1,20}(?:[.,:/]\d{1,20}){0,6})"
# a number, a range or a hyphenated one ("2–3", "9:00–17:00", "555-0148"), a fraction, a date
_NUM = rf"{_ONE}(?:(?:[-–]|\s–\s){_ONE})?"
# units written onto a number in Japanese and Chinese ("3,776メートル", "5月22日", "4个半小时")
_CJK_UNIT = (
    r"(?:[年月日時时分秒半个個小間间公里千米円元块塊人歳岁度倍回本件台枚页頁万億亿号號番"
    r"\u30a0-\u30ff]{1,8}(?:\d{1,6}(?:[.,]\d{1,6})?)?){1,4}"
)
# and in Korean, where a particle follows the unit ("1443년이에요", "2시간 반 정도")
_KO_UNITS = r"시간|킬로미터|킬로그램|킬로|미터|년|월|일|시|분|초|개|명|원|번|층|살|배"
_KO_UNIT = rf"(?:(?:만|억|천)(?:\s?(?:{_KO_UNITS}))?|(?:{_KO_UNITS}))(?:\s?반)?"
# "15th", "6x", "3h20", "15%", "350°F", "/kWh"
_ATTACHED = r"(?:[A-Za-zА-Яа-яµ]{1,4}\d{0,3}(?!\w)|[%‰°℃℉²³]{1,2}[CFK]?(?!\w)|/[^\W\d_]{1,6}(?!\w))"
_NUMBER = re.compile(
    rf"(?:(?<![\w.,/:$€£¥₹-])|(?<=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]))"
    rf"(?P<cur>[-+−]?(?:(?:R|US|A|C|NZ|HK|S|NT|MX)\$|[$€£¥₹])\s?|[-+−])?"  # "R$ 5,42", "€12"
    rf"(?P<num>{_NUM}(?:\s?[×x]\s?{_NUM})?)(?P<att>{_CJK_UNIT}|{_KO_UNIT}|{_ATTACHED})?"
)
# an hour and what follows it: "2 hours 15 minutes", "2 horas y media", "3 ore e 10"
_HOURS = re.compile(
    r"h|hrs?|hours?|horas?|ore|ora|uur|stunden?|heures?|godz|godzin[ay]?|час(?:а|ов)?|saat|ghante|"
    r"ghanta|ساعات|ساعة",
    _I,
)
_MORE = re.compile(
    r"\.?\s(?:(?:and|y|e|et|und|en|i|и|ve|aur)\s)?(?:\d{1,2}\s?(?:min(?:utes?|utos|uti|uten|ut)?|"
    r"minuty|минут[аы]?|dakika|dk|mins?)\b|(?:a )?half|media|mezza|meia|demie?|halb|halve|pół|"
    r"половиной|buçuk|\d{1,2}(?=[\s,.;!?]|$))",
    _I,
)
_UNIT_WORD = re.compile(r"\s{1,2}([^\W\d_](?:[^\W\d_]|['’/²³.]){0,14}|°\s?[CFK]|[℃℉%€$£¥₹])", _I)
_DAY = r"\d{1,2}(?:st|nd|rd|th|er|e|º|ª)?\.?"
_DATE = re.compile(
    rf"(?<![\w.,])(?:{_DAY}\s(?:de\s|of\s)?(?:{W.MONTHS})(?!\w)(?:,?\s(?:de\s)?\d{{4}}(?!\d))?"
    rf"|(?:{W.MONTHS})\.?\s\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s\d{{4}})?(?!\d)"
    rf"|(?:{W.MONTHS})\s\d{{4}}(?!\d))",
    _I,
)
_QUOTED = re.compile(
    r'"([^"\n]{1,80})"|“([^”\n]{1,80})”|«\s?([^»\n]{1,80}?)\s?»|„([^“”\n]{1,80})[“”]'
    r"|`([^`\n]{1,80})`|「([^」\n]{1,80})」|‘([^’\n]{1,80})’"
    r"|(?<![\w])'((?:[^'\n]|(?<=\w)'(?=\w)){1,80})'(?!\w)"  # "'That's wrong!'": "That's" inside
)
_CODE = re.compile(
    r"(?<![\w/~.])(?:~|\.{1,2})?/[\w.@+-]{1,40}(?:/[\w.@+-]{1,40}){0,10}/?"  # a path
    r"|(?<![\w'’-])[a-z][a-z0-9+]{0,12}(?:\.[a-z0-9]{1,8})?"  # a command and its flags
    r"(?:\s(?:-[a-zA-Z]{1,3}|--[a-z][\w-]{1,20})(?![\w-])){1,4}"
    r"|(?<![\w.])[A-Za-z_]\w{0,30}(?:\.[A-Za-z_]\w{0,30}){0,4}\([^()\n]{0,30}\)"  # a call
    r"|\[[^\[\]\n]{0,80}\]|\{[^{}\n]{0,80}\}"  # a list, an object
    r"|(?<![\w#])#[A-Z][A-Z0-9/]{0,10}[!?]?(?![\w/])"  # a spreadsheet error: "#REF!", "#N/A"
    r"|(?:(?<![\w'’-])|(?<=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]))"
    r"(?:[A-Za-z]{1,12}\d[\w-]{0,30}|[a-z]\w{0,30}_\w{1,30}|[a-z]{1,20}[A-Z]\w{0,30}"
    r"|[A-Z][a-z]{1,20}[A-Z]\w{0,30}|-{1,2}[A-Za-z][\w-]{0,20})(?![\w-])"  # an identifier, a flag
)
# an identifier ends where Chinese, Japanese or Korean begins ("H2O是水": "H2O")
_CJK_START = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]")
# an error message a program printed: "it says ls: cannot access 'x': No such file"
_PRINTED = re.compile(
    r"<[^<>\n]{1,60}>|(?<![\w.])[A-Z]\w{0,30}(?:Error|Exception)(?::\s[^.\n]{1,100})?"
    r"|(?<!\w)(?:says|said|prints|printed|outputs|shows|throws|raises|gives(?: me)?|got)\s"
    r"([A-Za-z][\w.-]{0,30}:\s[^\n]{1,120}?)(?=\.(?:\s|$)|$)"
    r"|^\W{0,3}(?:output|result|it says|it prints|error|stdout)\s?:\s?([^\n]{1,120}?)\s{0,2}$",
    _I,
)
_UP = r"[A-ZÀ-ÖØ-ÞĀ-ŽА-ЯЁΑ-Ω]"
# a word, or an abbreviation before a name ("St. Louis", "J. R. R. Tolkien"; a longer word
# before ". " ends a sentence: "C'est Flaubert. Hugo ...")
_NAME_WORD = rf"{_UP}(?:[a-z]{{0,2}}\.(?=\s{_UP})|[\w'’-]{{0,30}}(?:\.(?=\w))?[\w'’-]{{0,10}})"
_NAME = re.compile(
    rf"(?<![\w'’-]){_NAME_WORD}(?:\s(?:(?:of|de|da|do|del|della|di|du|van|von|der|den|la|le|al|"
    rf"el|bin|ibn)\s)?{_NAME_WORD}){{0,3}}"
)
_SENTENCE = re.compile(
    rf"(?<=[.!?;])\s{{1,3}}(?!(?:{W.MONTHS})\b)|(?<=[。！？])|(?<=\s)[—–](?=\s)|\n"
    r"|,\s(?=(?:are you|is it|is that|did you|do you|have you|were you|what|why|how)\b)"
    r"|,\s(?=(?:so |and |but )?(?:could|can|would) you\b)",
    _I,
)
_CLAUSE = re.compile(r"[,，、:：()（）]|(?<=\s)[—–-](?=\s)")
_QMARKS = ("?", "？", "؟")
_UNCASED = re.compile(r"[\u0600-\u06ff\u0900-\u097f]{2}")  # Arabic, Devanagari
_SMALL_NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve"
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_SMALL_NUMBERS.split())}
_WORD = re.compile(r"[^\W_][\w'’.-]{0,40}|[^\s\w]")


@dataclass(frozen=True)
class _Value:
    """One value written in a text: its words, where, its kind, and what makes two the same
    (a number's digits, else its folded words)."""

    text: str
    start: int
    end: int
    kind: str  # number, date, quoted, code, name, word
    key: str
    unit: str = ""
    core: str = ""  # a number's digits as written ("1,204")

    @property
    def numeric(self) -> bool:
        return self.kind in ("number", "date", "spelled")

    def _replace_at(self, offset: int) -> _Value:
        return _Value(
            self.text,
            self.start + offset,
            self.end + offset,
            self.kind,
            self.key,
            self.unit,
            self.core,
        )


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _has(haystack: str, needle: str) -> bool:
    """`needle` is written in `haystack` (both folded) as a whole word or phrase."""
    if not needle:
        return False
    i = haystack.find(needle)
    while i >= 0:
        before = haystack[i - 1] if i else " "
        after = haystack[i + len(needle)] if i + len(needle) < len(haystack) else " "
        word_edges = (
            needle[0].isalnum() and before.isalnum(),
            needle[-1].isalnum() and after.isalnum(),
        )
        if not any(word_edges) or (_cjk(needle[0]) and _cjk(needle[-1])):
            return True
        i = haystack.find(needle, i + 1)
    return False


def _cjk(ch: str) -> bool:
    return "\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af"


def _number(m: re.Match[str], text: str, tails: frozenset[tuple[str, ...]]) -> _Value:
    """A number with what is written onto it, and the unit words after it: a known unit, or
    the words the reply put after its own numbers ("2 PM Eastern" for "3 PM Eastern")."""
    end = m.end()
    unit = _fold(m.group("att") or "")
    words: list[str] = []
    for _ in range(3):
        w = _UNIT_WORD.match(text, end)
        if w is None:
            break
        word = _fold(w.group(1)).rstrip(".")
        if words and not (w.group(1)[:1].isupper() or word in W.UNITS):
            break  # "2 PM Eastern", not "300 mg cada" ("each") or "3 cup paani" ("water")
        if not _follows(words, word, tails):
            break
        words.append(word)
        end = w.start(1) + len(w.group(1).rstrip("."))
    unit = unit or " ".join(words)
    if _HOURS.fullmatch(unit):
        more = _MORE.match(text, end)  # "2 hours 15 minutes", "2 horas y media", "3 ore e 10"
        if more is not None:
            end = more.end()
    value = text[m.start() : end].strip()
    key = _number_key(m.group("num")) + re.sub(r"\D", "", m.group("att") or "")
    return _Value(value, m.start(), end, "number", key, unit, m.group("num"))


def _number_key(num: str) -> str:
    """A number's digits, with its decimal part kept apart: "1,204" and "1204" are one number,
    "4.5" and "45" two (a mark before exactly three digits groups thousands, unless the number
    opens with 0: "0.125")."""
    groups = re.split(r"[.,]", num)
    if len(groups) < 2 or not all(g.isdigit() for g in groups):
        return re.sub(r"\D", "", num)
    if len(groups[-1]) == 3 and groups[0] != "0":
        return "".join(groups)
    fraction = groups[-1].rstrip("0")
    return "".join(groups[:-1]) + (f".{fraction}" if fraction else "")


def _follows(words: list[str], word: str, tails: frozenset[tuple[str, ...]]) -> bool:
    """`word` belongs to the unit after `words`: the first is a known unit or one the reply
    put after a number (its start), the next ones continue the reply's own."""
    if not words:
        if not word[0].isalpha():
            return True  # "°F", "%", "€"
        if word in ("am", "pm"):
            return True  # "9 am" (though "am" is German "at the" too)
        if word in W.STOP or word in W.BETWEEN:
            return False
        return word in W.UNITS or any(
            t and (_unit_like(t[0]) or _counted(t[0])) and _same_word(t[0], word) for t in tails
        )
    n = len(words)
    if word in W.STOP or word in W.BETWEEN or word in W.FILLER:
        return False
    return any(
        len(t) > n
        and all(_same_word(a, b) for a, b in zip(t, words, strict=False))
        and t[n] == word
        for t in tails
    )


def _unit_like(word: str) -> bool:
    """A word the reply wrote after a number that reads as its unit: a known one, a short one
    ("pm", "d.c"), a month, or one in a script without capitals (Arabic, Devanagari, CJK),
    where a unit is not told from a noun."""
    return (
        word in W.UNITS
        or "/" in word  # a rate: "g/mol", "kWh/m²"
        or len(word.replace(".", "")) <= 3
        or re.fullmatch(W.MONTHS, word, _I) is not None
        or not re.search(r"[a-zа-яёα-ωà-ÿ]", word)
    )


def _counted(word: str) -> bool:
    """A plural noun after a number ("eggs", "lines"): what is counted, kept as its unit."""
    return len(word) >= 4 and word.endswith("s") and word.isalpha()


def _same_word(a: str, b: str) -> bool:
    """One word, inflection aside ("metre" and "metredir", "متر" and "مترًا")."""
    if a == b:
        return True
    short, long = sorted((a, b), key=len)
    return len(short) >= 3 and long.startswith(short)


def _values(text: str, tails: frozenset[tuple[str, ...]] = frozenset()) -> list[_Value]:
    """Every value written in `text`, in order; where two overlap, the more specific wins
    (a quoted span, a date, code, a number, a name)."""
    found: list[_Value] = []
    taken = bytearray(len(text) + 1)  # the characters a value holds already

    def add(value: _Value) -> None:
        if value.text and not any(taken[value.start : value.end]):
            taken[value.start : value.end] = b"\x01" * (value.end - value.start)
            found.append(value)

    for m in _PRINTED.finditer(text):
        i = next((i for i, g in enumerate(m.groups(), 1) if g is not None), 0)
        add(_Value(m.group(i), m.start(i), m.end(i), "code", _fold(m.group(i))))
    for m in _QUOTED.finditer(text):
        i = next(i for i, g in enumerate(m.groups(), 1) if g is not None)
        inner = m.group(i).strip().rstrip(".,;:!?")
        number = _NUMBER.fullmatch(inner)
        if number is not None:
            add(_number(number, inner, tails)._replace_at(m.start(i)))
        else:
            add(_Value(inner, m.start(i), m.end(i), "quoted", _fold(inner)))
    for m in _DATE.finditer(text):
        add(_Value(m.group(0), m.start(), m.end(), "date", _fold(m.group(0))))
    for m in _CODE.finditer(text):
        code = m.group(0)
        cjk = _CJK_START.search(code, 1) if code[0] not in "[{" else None
        code = code[: cjk.start()] if cjk else code
        if re.search(r"[^\W\d_]", code) or code[0] in "[{":
            add(_Value(code, m.start(), m.start() + len(code), "code", _fold(code)))
    for m in _NUMBER.finditer(text):
        add(_number(m, text, tails))
    for m in _NUMBER_WORD.finditer(text):  # "four bedrooms, not three"
        spelled = _number_word(m, text, tails)
        if spelled is not None:
            add(spelled)
    for value in _names(text):
        add(value)
    return sorted(found, key=lambda v: v.start)


_NUMBER_WORD = re.compile(rf"(?<![\w-])(?:{'|'.join(_SMALL_NUMBERS.split())})(?![\w-])", _I)


def _number_word(m: re.Match[str], text: str, tails: frozenset[tuple[str, ...]]) -> _Value | None:
    """A number written in words, where it counts something ("four bedrooms") or is denied
    ("not three")."""
    key = _NUMBER_WORDS[_fold(m.group(0))]
    unit = _UNIT_WORD.match(text, m.end())
    if unit is not None and _follows([], _fold(unit.group(1)), tails):
        end = unit.end()
        value = text[m.start() : end]
        return _Value(value, m.start(), end, "spelled", key, _fold(unit.group(1)), key)
    if re.search(r"(?<!\w)not\s$", text[max(0, m.start() - 5) : m.start()], _I):
        return _Value(m.group(0), m.start(), m.end(), "spelled", key, "", key)
    return None


def _names(text: str) -> Iterable[_Value]:
    """Capitalised words ("Elon Musk", "Vatican City", "Толстой"), less the function words and
    verdicts that open a sentence; none in a turn written in capitals."""
    letters = [c for c in text if c.isalpha() and c.lower() != c.upper()]
    if letters and sum(c.isupper() for c in letters) > 0.6 * len(letters):
        return

    def opens(at: int) -> bool:
        return (
            re.search(r"(?:^|[.!?;:]\s{1,3}|[\"'“«(]\s?)$", text[max(0, at - 4) : at]) is not None
        )

    for m in _NAME.finditer(text):
        words = m.group(0).split(" ")
        start = m.start()
        while words and (_fold(words[0]).strip("'’.") in W.STOP or _verdict_word(words[0])):
            if (
                len(words) > 1
                and _fold(words[0]) in W.ARTICLES
                and words[0][:1].isupper()
                and not opens(start)
            ):
                break  # "es La Paz", "near Le Havre": a capital article inside a sentence
            start += len(words[0]) + 1
            words = words[1:]
        name = " ".join(words).rstrip(".'’-")
        if name and re.search(r"[^\W\d_]{2}|^[A-Z]$", name):
            kind = "word" if opens(start) and " " not in name else "name"
            yield _Value(name, start, start + len(name), kind, _fold(name))


def _verdict_word(word: str) -> bool:
    w = word.strip(".,!?")
    return any(p.fullmatch(w) for p in (_ACCEPT, _WRONG, _NO, _FAILED))


# ---- what the reply said --------------------------------------------------------------------


@dataclass(frozen=True)
class _Reply:
    """What a turn is read against: the reply's values and words."""

    text: str
    folded: str
    values: tuple[_Value, ...]
    tails: frozenset[tuple[str, ...]]
    heads: frozenset[str]  # the words the reply wrote before a number ("platform" in "platform 7")
    anchors: frozenset[tuple[str, bool]]  # (a word beside a value, the value is a number)
    slots: frozenset[tuple[str, tuple[str, ...]]]  # the word and prepositions before a name
    asks: bool  # the reply asks the user something: the turn answers it
    answer: str | None  # "yes" / "no": the reply answers a yes/no question

    @property
    def numeric(self) -> bool:
        return any(v.numeric for v in self.values)

    @property
    def named(self) -> bool:
        """The reply gives a name, code or a quoted value (or is written without capitals,
        where a name is not told from a word)."""
        return (
            any(not v.numeric for v in self.values)
            or bool(_UNCASED.search(self.text))
            or _CJK_START.search(self.text) is not None
        )

    @property
    def states(self) -> bool:
        """The reply says what something is (a name, code, a quoted value, or a copula: "Dolphins
        are fish"), not only what to do ("Bake at 220°C for 40 minutes"), where a lone word
        in the turn reports what came of it ("burned.")."""
        return (
            any(not v.numeric and v.kind != "word" for v in self.values)
            or _CLAIM.search(self.text) is not None
            or bool(_UNCASED.search(self.text) or _CJK_START.search(self.text))
        )

    def said(self, value: _Value) -> bool:
        """The reply already gave `value`: the user quotes it, not corrects it."""
        if value.kind in ("number", "spelled"):
            return self._said_number(value)
        if not _has(self.folded, value.key):
            return False
        # "HOLA" is not "Hola", "-R" is not "-r"
        cased = value.kind == "code" or (value.text.isupper() and len(value.text) > 1)
        return not cased or _has(self.text, value.text)

    def _said_number(self, value: _Value) -> bool:
        """The same digits (a phone number's end too), with the same unit when one is given."""
        if any(v.numeric and v.key == value.key and not value.unit for v in self.values):
            return True
        core = re.escape(value.core or value.text)
        for m in re.finditer(rf"(?<![\d.,])(?<!\d[.,]){core}(?![\d]|[.,]\d)", self.folded):
            if not value.unit:
                return True
            after = self.folded[m.end() : m.end() + 24].split()
            if after and _same_word(after[0].strip(".,;:!?()"), value.unit.split()[0]):
                return True
            if self.folded[m.end() : m.end() + len(value.unit)] == value.unit:
                return True
        return False


def _reply(reply: str) -> _Reply:
    text = " ".join(reply[:MAX_REPLY_CHARS].split())
    tails: set[tuple[str, ...]] = set()
    for m in _NUMBER.finditer(text):
        after = [_fold(w).strip(".,;:!?()") for w in text[m.end() : m.end() + 60].split()[:3]]
        if len(tails) >= MAX_TAILS:
            break
        if not m.group("att") and after:
            tails.add(tuple(w for w in after if w))
        elif m.group("att"):  # "100°C": "78 C" in the turn writes the same unit
            unit = re.sub(r"[\W\d_]", "", _fold(m.group("att")))
            if unit.isalpha():
                tails.add((unit,))
    values = _values(text)
    heads = {
        _fold(m.group(1))
        for v in values
        if v.kind == "number"
        for m in [_HEAD.search(text[max(0, v.start - 24) : v.start])]
        if m is not None and _is_head(m.group(1))
    }
    anchors: set[tuple[str, bool]] = set()
    slots: set[tuple[str, tuple[str, ...]]] = set()
    named = {w for x in values for w in _fold(x.text).split()}
    for v in values:
        near = _content_words(text[max(0, v.start - 40) : v.start])[-3:]
        near += _content_words(text[v.end : v.end + 40])[:2]
        anchors.update((word[:5], v.numeric) for word in near)
        before = [_fold(w) for w in text[max(0, v.start - 40) : v.start].split()]
        preps: list[str] = []
        while before and before[-1] in W.BETWEEN and len(preps) < 2:
            preps.insert(0, before.pop())
        anchor = before[-1] if before else ""
        if (
            not v.numeric
            and anchor.isalpha()
            and anchor not in W.STOP
            and len(anchor) > 2
            and anchor not in named  # "Monday" in "Monday to Saturday" is no anchor
        ):
            slots.add((anchor[:5], tuple(preps)))
    asks = _asks_user(text)
    answer = None
    for sentence in re.split(r"(?<=[?？])\s{0,3}", text)[1:2] or [text]:
        if W.YES.match(sentence):
            answer = "yes"
        elif W.NO_ANSWER.match(sentence):
            answer = "no"
    return _Reply(
        text,
        _fold(text),
        tuple(values),
        frozenset(tails),
        frozenset(heads),
        frozenset(anchors),
        frozenset(slots),
        asks,
        answer,
    )


_HEAD = re.compile(r"(?<![\w'’-])([^\W\d_][\w'’-]{1,20})\s$")


def _is_head(word: str) -> bool:
    """A name before a number, part of what the number names ("Terminal 3", "Python 3.8"),
    not a function word, a verb that leads a value ("costs 5"), a unit or a month."""
    folded = _fold(word)
    return word[:1].isupper() and not (
        folded in W.STOP
        or folded in W.BETWEEN
        or folded in W.UNITS
        or _LEAD.search(word) is not None
        or re.fullmatch(W.MONTHS, folded, _I) is not None
    )


def _headed(text: str, values: list[_Value], reply: _Reply) -> list[_Value]:
    """`values`, with a number taking the word before it where the reply wrote that word before
    its own ("platform 11" for "platform 7"), and what that word was read as dropped."""
    out: list[_Value] = []
    for v in values:
        m = _HEAD.search(text[max(0, v.start - 24) : v.start]) if v.kind == "number" else None
        if m is not None and _fold(m.group(1)) in reply.heads and v.text[:1].isdigit():
            start = v.start - len(m.group(0))
            out = [w for w in out if w.end <= start]
            v = _Value(text[start : v.end], start, v.end, v.kind, v.key, v.unit, v.core)
        out.append(v)
    return out


def _asks_user(text: str) -> bool:
    """The reply ends by asking the user something: a question, perhaps with a few words
    after it that answer nothing ("What's 7 × 8? Take your time!"), a request for what the
    user has ("Let me know the exact error"), or a quiz."""
    last = [s for s in re.split(r"(?<=[.!?？。！])\s{0,3}", text.strip()) if s][-2:]
    if not last:
        return False
    coda = (
        len(last) == 2
        and last[0].rstrip().endswith(_QMARKS)
        and len(last[1].split()) <= 5
        and not re.search(r"\d", last[1])
        and not (W.YES.match(last[1]) or W.NO_ANSWER.match(last[1]))
    )
    return (
        last[-1].rstrip().endswith(_QMARKS)
        or coda
        or W.ASK_USER.search(last[-1]) is not None
        or W.QUIZ.search(text) is not None
    )


def _content_words(text: str) -> list[str]:
    words = [_fold(w).strip("'’.-") for w in _WORD.findall(text)]
    return [
        w
        for w in words
        if len(w) >= 3 and w not in W.STOP and w not in W.BETWEEN and not w[0].isdigit()
    ]


# ---- the turn -------------------------------------------------------------------------------

# "1868年では？", "isn't it 1889?", "42, no?": a value put forward as a question
_TENTATIVE = re.compile(
    r"(?:では|じゃない|じゃ|吧|(?:,\s?|\s)(?:no|right|non|nicht|oder|né|ne|nee|nie|да|değil mi))"
    r"\s?(?:です)?か?[?？]{1,3}$"
    r"|^\W{0,3}(?:isn'?t it|wasn'?t it|shouldn'?t it be|isn'?t that|wouldn'?t it be|"
    r"n'est-ce pas|c'est pas plutôt|ce n'est pas plutôt|ist es nicht|war es nicht|no es|"
    r"no era|não é|não seria|non è|non era|is het niet|was het niet|czy to nie|разве не)\b",
    _I,
)


@dataclass(frozen=True)
class _Sentence:
    text: str
    start: int
    asks: bool  # a question, or a request for something new
    tentative: bool = False


_TAG = re.compile(r",?\s(?:remember|ok|okay|right|yeah|alright)\s?[?？]{1,3}$", _I)


def _sentences(text: str) -> list[_Sentence]:
    out, start = [], 0
    for m in [*_SENTENCE.finditer(text), None]:
        end = len(text) if m is None else m.start()
        part = text[start:end]
        if part.strip():
            lead = len(part) - len(part.lstrip())
            body = part.strip()
            out.append(_Sentence(body, start + lead, *_asks(body)))
        if m is not None:
            start = m.end()
    return out


def _asks(body: str) -> tuple[bool, bool]:
    """Whether a sentence asks something or for something new, and whether it puts a value
    forward as a question ("isn't it 1889?")."""
    tentative = _TENTATIVE.search(body) is not None and bool(
        _NUMBER.search(body)
        or any(  # a name, not "I" or "I'm"
            re.split(r"['’]", _fold(m.group(0)))[0] not in W.STOP for m in _NAME.finditer(body, 1)
        )
    )
    untagged = _TAG.sub(".", body)  # "answer in Spanish, remember?"
    asks = (
        not tentative
        and not W.CHALLENGE.match(body)
        and (
            "¿" in body
            or (untagged.endswith(_QMARKS) and not re.fullmatch(r"[?？؟!\s]{1,8}", body))
            or bool(W.QUESTION_START.search(body) or W.QUESTION_END.search(body))
            or bool(W.REQUEST.search(body))
        )
    )
    return asks, tentative


@dataclass(frozen=True)
class _Cues:
    """What the turn says about the reply, before its value is looked for."""

    no: bool = False  # a "no" opening the turn or standing alone
    wrong: bool = False  # a "wrong" word, "did not work", doubt
    contrast: _Value | None = None  # "X, not Y": X, where Y is what the reply said
    contrasted: bool = False  # "not Y" where Y is what the reply said (X perhaps not given)
    partial: bool = False  # "... fine, but ..."
    accept: bool = False  # an acceptance opens the turn
    accept_later: bool = False  # an acceptance further on
    asks: bool = False  # the turn asks something, or asks for something new
    questions: bool = False  # asks, but for what it wants of this answer ("i need it as json")
    self_blame: bool = False
    own_mistake: bool = False  # the user blames themselves ("I gave you the wrong numbers")
    hard: bool = False  # a "wrong" or "did not work" word
    failed: bool = False  # a "did not work" word, and no "wrong" one
    restate: bool = False  # "I said", "as I asked"

    @property
    def verdict(self) -> bool:
        return self.no or self.wrong or self.contrasted or self.partial or self.restate


def _cues(text: str, sentences: list[_Sentence], reply: _Reply, values: list[_Value]) -> _Cues:
    clean = _unjudged(text)
    statements = [_unjudged(s.text) for s in sentences if not s.asks]
    judged = [s for s in statements if not W.SELF.search(s)]
    hits = [
        m
        for s in judged
        for p in (_WRONG, _FAILED)
        for m in p.finditer(s)
        if not _reported(s[max(0, m.start() - 48) : m.start()])
        # "I don't need the working": what the user does not do, not what failed
        and not (p is _FAILED and re.search(r"(?<!\w)(?:i|we)\s$", s[: m.start()], _I))
    ]
    rest = " ".join(statements)
    for m in hits:
        rest = rest.replace(m.group(0), " ")
    doubt = _doubt(sentences, reply, values)
    opening = _strip_fillers(clean)
    no = (
        not reply.asks
        and W.NOT_A_NO.match(opening) is None
        and W.EXCLAIM.match(clean) is None
        and (
            _opening_no(opening, sentences)
            or any(_NO.fullmatch(s.text.strip(" .!?,")) for s in sentences)
        )
    )
    accepted = clean
    for m in hits:
        accepted = accepted.replace(m.group(0), " ")
    asked = [(s.start, s.start + len(s.text)) for s in sentences if s.asks]
    # "X, not Y" in a question asks for something new ("... when it's not prime?")
    stated = _blanked(text, asked)
    contrast, contrasted = _contrast(
        stated, [v for v in values if not any(a <= v.start < b for a, b in asked)], reply
    )
    return _Cues(
        no=no and not (W.SELF.search(clean) and not hits),
        wrong=bool(hits) or doubt or any(s.tentative for s in sentences),
        hard=bool(hits),
        failed=bool(hits) and all(m.re is _FAILED for m in hits),
        restate=any(W.RESTATE.search(s) for s in statements),
        contrast=contrast,
        contrasted=contrasted,
        partial=_partial(rest),
        accept=_accepts(_strip_fillers(clean)) and not _opens_with_hit(_strip_fillers(clean)),
        accept_later=any(
            not (
                W.NEGATION_AFTER.match(rest[m.end() :]) or W.NOT_ACCEPT_AFTER.match(rest[m.end() :])
            )
            for m in [_ACCEPT.search(rest)]
            if m
        ),
        asks=any(s.asks for s in sentences),
        questions=any(s.asks and not W.WANT.search(s.text) for s in sentences),
        self_blame=W.SELF.search(clean) is not None or W.OTHERS.search(clean) is not None,
        own_mistake=W.SELF.search(clean) is not None,
    )


def _opening_no(opening: str, sentences: list[_Sentence]) -> bool:
    """A "no" opens the turn as a verdict; a "wrong" word only where it is set apart by a mark
    or opens a statement (in a question it may qualify what is asked: "wrong question maybe,
    but can I ...?")."""
    m = _NO.match(opening)
    if m is None:
        return False
    if _WRONG.search(m.group(0)) is None:
        return True  # "no wait, ... can you change it?"
    apart = re.match(r"\s{0,2}(?:[,.!;:?…—–-]|$)", opening[m.end() :]) is not None
    return apart or not (sentences and sentences[0].asks)


def _unjudged(text: str) -> str:
    """`text` less what judges nothing: quotes, "nothing wrong", thanks named as a word."""
    return W.NAMED_THANKS.sub(" ", W.NEGATED.sub(" ", _QUOTED.sub(" ", text)))


def _blanked(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with `spans` blanked (the same length, so places hold)."""
    for a, b in spans:
        text = text[:a] + " " * (b - a) + text[b:]
    return text


def _partial(rest: str) -> bool:
    """ "the date is fine but ...": part of the reply is right, and a "but" follows (a tag
    question's "right?" approves nothing)."""
    rest = re.sub(r",?\s(?:right|ok|okay|correct)\s?[?？]", " ", rest, flags=_I)
    return bool(
        re.search(r"\b(?:fine|ok|okay|right|correct|good)\b|" + _ACCEPT.pattern, rest, _I)
        and _BUT.search(rest)
    )


def _reported(before: str) -> bool:
    """A verdict said after someone else says it ("my friend says it's wrong", "my kid got it
    wrong"): theirs, unless the user turns to the reply ("..., you said")."""
    said = [m.end() for m in W.OTHERS.finditer(before)]
    return bool(said) and re.search(r"(?<!\w)(?:you|your)(?!\w)", before[said[-1] :], _I) is None


def _opens_with_hit(text: str) -> bool:
    """The acceptance word that opens `text` is part of a "wrong" or "did not work" phrase
    ("funktioniert immer noch nicht", "it still sounds super ...")."""
    m = _ACCEPT_START.match(text)
    end = m.end() if m else 0
    return any(
        h is not None and h.start() < end for h in (_WRONG.search(text), _FAILED.search(text))
    )


def _strip_fillers(text: str) -> str:
    """`text` less the fillers that open it ("lol no", "haha perfect")."""
    words = text.split(" ")
    while len(words) > 1 and _fold(words[0]).strip(_MARKS) in W.FILLER:
        words = words[1:]
    return " ".join(words)


def _accepts(text: str) -> bool:
    """The turn opens with an acceptance: "perfect, thanks!", "yep that's right", "верно"."""
    if W.WEAK_ACCEPT.match(text):
        return True
    m = _ACCEPT_START.match(text) or W.ACCEPT_OPENING.match(text)
    if m is None or W.NOT_ACCEPT_AFTER.match(text[m.end() :]):
        return False
    return not W.NEGATION_AFTER.match(text[m.end() :])


def _doubt(sentences: list[_Sentence], reply: _Reply, values: list[_Value]) -> bool:
    """ "4 hours??", "17?", "????": the user echoes the reply with disbelief."""
    for s in sentences:
        if re.fullmatch(r"[?？!]{2,8}", s.text):
            return True
        if not s.text.endswith(("?", "？")):
            continue
        inside = [v for v in values if s.start <= v.start < s.start + len(s.text)]
        rest = s.text
        for v in inside:
            rest = rest.replace(v.text, " ")
        bare = not [w for w in re.findall(r"\w+", rest) if _fold(w) not in W.FILLER]
        if inside and all(reply.said(v) for v in inside) and (bare or s.text.endswith("??")):
            return True
    return False


_BETWEEN = "|".join(re.escape(w) for w in sorted(W.BETWEEN, key=len, reverse=True))
_DENIED = re.compile(rf"(?:{W.NOT_BEFORE.pattern})\s{{0,2}}(?:(?:{_BETWEEN})\s){{0,2}}$", _I)


def _contrast(text: str, values: list[_Value], reply: _Reply) -> tuple[_Value | None, bool]:
    """ "12, not 10", "Baudelaire, pas Hugo", "20日ではない": (the value put in the place of
    the reply's, when the turn gives one; whether the turn denies a value the reply said)."""
    for i, v in enumerate(values):
        denied = _DENIED.search(text[max(0, v.start - 24) : v.start])
        after = W.NOT_AFTER.match(text, v.end)
        if (denied is None and after is None) or not reply.said(v):
            continue
        at = max(0, v.start - 24) + denied.start() if denied is not None else v.end
        if denied is not None and _has(reply.folded, _fold(text[at : v.end])):
            continue  # "Not Found is 404": the reply's own words ('Not Found'), no denial
        before = values[i - 1] if i else None
        if (
            before is not None
            and before.key != v.key
            and _same_kind(before, v)
            and not text[before.end : at].strip(" ,;")
        ):
            return before, True  # "6, pas 3": the value beside the denial, though said elsewhere
        rest = [w for w in values[:i] if not reply.said(w)][-1:] or [
            w for w in values[i + 1 :] if not reply.said(w)
        ][:1]
        if rest and _same_kind(rest[0], v):
            return rest[0], True
        return None, True
    return _plain_contrast(text, reply)


_NOT_WORD = re.compile(
    rf"([^\W\d_][\w'’-]{{1,30}}),?\s(?:{W.NOT_BEFORE.pattern})\s(?:(?:{_BETWEEN})\s){{0,2}}"
    rf"([^\W\d_][\w'’-]{{1,30}})",
    _I,
)


# a copula, or a word with one or a negation written onto it ("that's", "they're", "isn't")
_COPULA_WORD = re.compile(
    r"\w{1,12}['’](?:s|re|m|t)|is|are|was|were|be|ist|sind|war|est|sont|es|son|era|è|sono|é|são|"
    r"zijn|jest|są|это|c['’]est|isn|aren|wasn",
    _I,
)


def _plain_contrast(text: str, reply: _Reply) -> tuple[_Value | None, bool]:
    """ "na sexta, não na terça": the word before "not" where the word after it is the
    reply's."""
    for m in _NOT_WORD.finditer(text):
        said, new = _fold(m.group(2)), _fold(m.group(1))
        if not _has(reply.folded, said) or said in W.STOP:
            continue
        if (
            new in W.STOP
            or new in W.BETWEEN
            or _COPULA_WORD.fullmatch(new) is not None  # "that's not a haiku": a denial
            or _verdict_word(m.group(1))
            or _has(reply.folded, new)
        ):
            return None, True
        return _Value(m.group(1), m.start(1), m.end(1), "word", new), True
    return None, False


def _same_kind(a: _Value, b: _Value) -> bool:
    return a.numeric == b.numeric or a.kind in ("quoted", "code") or b.kind in ("quoted", "code")


# ---- the value ------------------------------------------------------------------------------


def _led(text: str, value: _Value) -> bool:
    """A lead word puts `value` forward: "it's 8 hours", "should be 350 °F", "i get 12.6"."""
    if _OUTPUT_LABEL.search(text[max(0, value.start - 24) : value.start]):
        return True
    told = re.search(
        r"([^.!?;:]{1,40}):\s{0,2}[\"'“«`]?$", text[max(0, value.start - 48) : value.start]
    )
    if told and (_WRONG.search(told.group(1)) or _NO.match(told.group(1).strip())):
        return True  # "That's not right: 12"
    before = re.split(r"[.!?;:,，。！？()]", text[max(0, value.start - 48) : value.start])[-1]
    words = before.split()
    for _ in range(4):
        if words and _LEAD.search(" ".join(words)) is not None:
            return True
        if words and (
            _fold(words[-1]).strip("'’") in W.BETWEEN or words[-1].endswith(("'", "’"))
        ):  # "it's about", "nell'80"
            words.pop()
        else:
            return False
    return False


def _aligned(text: str, value: _Value, reply: _Reply) -> bool:
    """`value` stands beside a word that, in the reply, stands beside the reply's own value
    of its kind: "it shipped Thursday" for "shipped on Monday", "1881'de doğdu"."""
    before = re.split(r"[.!?;。！？]", text[max(0, value.start - 40) : value.start])[-1]
    after = re.split(r"[.!?;。！？,]", text[value.end : value.end + 40])[0]
    near = _content_words(before)[-3:] + _content_words(after)[:2]
    return any((w[:5], value.numeric) in reply.anchors for w in near)


_OUTPUT_LABEL = re.compile(
    r"(?:output|result|error|stdout|answer|réponse|resultado|risultato|ergebnis|wynik|"
    r"результат|sonuç|结果|答案)\s?[:：]\s?$",
    _I,
)
_COPULA = re.compile(r"\s(?:is|was|are|ist|est|es|è|é|is het|jest|это)\s(\w+)(?:\s(\w+))?", _I)


def _opens(text: str, sentence: _Sentence, value: _Value, reply: _Reply) -> bool:
    """The sentence opens with `value` and says nothing else of it but a reason or the
    reply's own subject: "1666, famously", "8,849 m per the latest survey", "amsterdam is
    bigger", "Au is gold" (not "42 is my favourite number")."""
    head = text[sentence.start : value.start]
    if re.search(r"\w", head) and not all(
        _fold(w) in W.FILLER or _fold(w) in W.BETWEEN for w in re.findall(r"[\w']+", head)
    ):
        return False
    m = _COPULA.match(text, value.end)
    if m is None:
        return True
    said = [_fold(w) for w in m.groups() if w]
    return any(
        w.endswith("er") or w in ("right", "correct", "it", "the") or _has(reply.folded, w)
        for w in said
    )


_MARKS = ".,!?…:;\"'’“”«»"


def _tokens(text: str, offset: int) -> list[tuple[int, int, str]]:
    """Each word of `text` less its marks, with where it is (offset added)."""
    out = []
    for m in re.finditer(r"\S+", text):
        word = m.group(0).strip(_MARKS)
        if word and re.search(r"\w", word) and _fold(word) not in W.FILLER:
            start = offset + m.start() + m.group(0).find(word)
            out.append((start, start + len(word), word))
    return out


_SUBJECT = re.compile(
    r"^\W{0,3}([^\W\d_][\w'’-]{1,30}(?:\s[^\W\d_][\w'’-]{1,30})?)\s(?:is|are|was|ist|est|es|"
    r"è|é|is het|jest|это)\s(?:(?:the|a|an|way|much|far|even)\s)?([^\W\d_][\w'’-]{1,30})\b",
    _I,
)


def _subject(sentence: _Sentence, reply: _Reply) -> _Value | None:
    """The subject of "X is bigger", "X is the right one", "Au is gold" (gold: the reply's
    word): the value the user puts in the reply's place."""
    m = _SUBJECT.match(sentence.text)
    if m is None:
        return None
    said, what = m.group(1), _fold(m.group(2))
    if any(_fold(w) in W.STOP or _verdict_word(w) for w in said.split()):
        return None
    ranked = re.search(r"\w{3,}est\b|\bmost\b|\bleast\b", reply.folded) is not None
    compared = ranked and re.fullmatch(r"\w{3,}(?:er|est)|better|worse", what)
    judged = compared or re.fullmatch(r"right|correct|one|answer", what)
    if not judged and not _has(reply.folded, what):
        return None
    if not judged and re.search(rf"(?<!\w){re.escape(what)}\W{{0,3}}(?:[.!?;]|$)", reply.folded):
        return None  # "tuples are the immutable ones" for "lists are immutable": what has the claim
    if _has(reply.folded, _fold(said)):
        return None
    at = sentence.start + m.start(1)
    kind = "name" if said[:1].isupper() else "word"
    return _Value(said, at, at + len(said), kind, _fold(said))


def _bare(sentence: _Sentence, reply: _Reply, strict: bool = False) -> _Value | None:
    """A sentence that is one value on its own, less fillers, marks, a parenthesis, a leading
    verdict ("Nope, Mark Twain.") and a leading preposition: "canberra", "a Firenze, dai",
    "Swiss franc (CHF)", "Толстой конечно"; or, unspaced, one value and a few words
    ("3,776メートルですよ"). `strict`: nothing else is said in the sentence."""
    body = re.sub(
        r"\([^()]{0,80}\)|（[^（）]{0,80}）", lambda m: " " * len(m.group(0)), sentence.text
    )
    if " " not in body.strip() and any(_cjk(c) for c in body):
        inner = [v for v in _values(body, reply.tails) if not reply.said(v)]
        if len(inner) == 1 and inner[0].numeric and len(body) - len(inner[0].text) <= 12:
            v = inner[0]
            return _Value(v.text, sentence.start + v.start, sentence.start + v.end, v.kind, v.key)
        return None
    words: list[tuple[int, int, str]] = []
    start = 0
    said_no = False
    for m in [*re.finditer(r",\s|，|、|:\s|\s[—–-]\s", body), None]:
        end = len(body) if m is None else m.start()
        raw, clause = body[start:end], _tokens(body[start:end], start)
        start = end if m is None else m.end()
        if not clause or (not words and all(_verdict_word(w) for _, _, w in clause)):
            continue  # "Nope, Mark Twain.": the clause after the verdict
        if words and strict:
            return None  # "Close, but it's 5,895 m": more is said
        if words:
            break
        words = clause
        # "still fails", "Please fix", "لم ينجح" ("it didn't work"): a verdict in words
        said_no = any(_verdict_word(w) for _, _, w in clause) or any(
            p.search(raw) for p in (_WRONG, _FAILED, _ACCEPT)
        )
    if said_no:
        return None  # "no luck": a verdict, not a value
    while len(words) > 1 and _fold(words[0][2]).rstrip("'’") in W.BETWEEN:
        if words[0][2][:1].isupper() and _fold(words[0][2]) in W.ARTICLES:
            break  # "Den Haag", "La Paz"
        words = words[1:]
    named = bool(words) and (
        words[0][2][:1].isupper() or all(_UNCASED.fullmatch(w[:2]) for _, _, w in words)
    )
    while named and len(words) > 1 and _fold(words[-1][2]) in W.STOP:
        words = words[:-1]  # "बाघ है", "Agra mein hai": a postposition or copula after a name
    if not words or len(words) > 3 or any(_verdict_word(w) for _, _, w in words):
        return None
    first, last = words[0][0], words[-1][1]
    elided = re.match(r"\w{1,4}['’](?=\d)", sentence.text[first:last])  # "nell'80"
    first += elided.end() if elided else 0
    phrase = sentence.text[first:last]
    at = sentence.start + first
    inner = _values(phrase, reply.tails)
    plain = [w for _, _, w in words]
    if len(inner) == 1 and inner[0].text == phrase:
        v = inner[0]
        kind = "name" if v.kind == "word" and v.text[:1].isupper() else v.kind
        return _Value(v.text, at, at + len(phrase), kind, v.key, v.unit, v.core)
    if len(inner) == 1 and len(plain) == 2 and inner[0].kind in ("name", "word"):  # noqa: SIM102
        if plain[0][:1].isupper() and not reply.said(inner[0]):  # "Swiss franc"
            return _Value(phrase, at, at + len(phrase), "name", _fold(phrase))
    if not inner and len(plain) <= 2 and all(_UNCASED.fullmatch(w[:2]) for w in plain):
        return _Value(phrase, at, at + len(phrase), "name", _fold(phrase))  # "نجيب محفوظ"
    if not inner and len(plain) == 1 and plain[0].isalpha() and _fold(plain[0]) not in W.STOP:
        number = _NUMBER_WORDS.get(_fold(phrase))
        kind = "number" if number else "word"
        return _Value(phrase, at, at + len(phrase), kind, number or _fold(phrase))
    return None


def _variant(text: str, sentences: list[_Sentence], reply: _Reply) -> _Value | None:
    """A few plain words a lead puts forward that change a value of the reply: "it's monday
    to friday" for "Monday to Saturday", "that's git log" for `git status`."""
    for s in sentences:
        if s.asks:
            continue
        for clause in re.split(r",\s|;\s", s.text):
            words = clause.split()
            for n in range(1, min(4, len(words))):
                rest = [w.strip(".,!?;:\"'’") for w in words[n:]]
                if _LEAD.search(" ".join(words[:n])) is None or not 1 <= len(rest) <= 3:
                    continue
                phrase = " ".join(rest)
                changed = [
                    v
                    for v in reply.values
                    if not v.numeric
                    and " " in v.text
                    and set(_fold(v.text).split()) & set(_fold(phrase).split())
                ]
                if changed and not _has(reply.folded, _fold(phrase)):
                    start = s.start + s.text.find(phrase)
                    return _Value(phrase, start, start + len(phrase), "word", _fold(phrase))
    return None


@dataclass(frozen=True)
class _Found:
    value: _Value
    how: str  # yes/no, contrast, led, aligned, opens, bare, first, variant, asserted


def _yes_no(text: str, cues: _Cues, reply: _Reply) -> _Found | None:
    """The yes or no that answers a reply's yes/no claim the other way ("no it isn't")."""
    if reply.answer is None:
        return None
    m = (W.NO_ANSWER if reply.answer == "yes" else W.YES).match(text)
    if m is None or not (cues.no or cues.wrong or reply.answer == "no"):
        return None
    word = m.group(0).strip(" ,.!")
    return _Found(_Value(word, 0, m.end(), "word", "yes/no"), "yes/no")


def _fresh(
    text: str, sentences: list[_Sentence], reply: _Reply, values: list[_Value]
) -> list[_Value]:
    """The turn's values that could be the right one: not the reply's own, not asked about,
    not in an aside, an explanation or a negation's scope."""
    asked = [(s.start, s.start + len(s.text)) for s in sentences if s.asks]
    aside = [m.span() for m in re.finditer(r"\([^()]{0,80}\)", text)]
    aside += _explained(text, values, reply) + _negated(text, values)
    return [  # a number in words counts only in "X, not Y" ("four bedrooms, not three")
        v
        for v in values
        if v.kind != "spelled"
        and not reply.said(v)
        and not any(a <= v.start < b for a, b in asked + aside)
    ]


def _value(
    text: str, sentences: list[_Sentence], cues: _Cues, reply: _Reply, values: list[_Value]
) -> _Found | None:
    """The right value the turn gives, and how it was found; None when it gives none."""
    yes_no = _yes_no(text, cues, reply)
    if yes_no is not None:
        return yes_no
    # "now the 8 times table": what follows "now" is the next thing asked for, built on the reply
    sentences = [replace(s, asks=True) if W.NEXT.match(s.text) else s for s in sentences]
    fresh = _fresh(text, sentences, reply, values)
    statements = [s for s in sentences if not s.asks]
    # a number the reply's unit fits stands in for the reply's number before a name does
    # ("Pendolino jedzie ok. 2 godz. 40 min" for "6 godzin")
    numbered = reply.numeric and any(v.numeric and _unit_fits(v, reply) for v in fresh)

    def kind_fits(v: _Value | None) -> bool:
        return v is not None and (v.numeric or not numbered)

    # "That's the circumference, not the area. Area is 28.27 cm²": a word put in the place of
    # the reply's word, where a number stands in for the reply's number
    if cues.contrast is not None and kind_fits(cues.contrast):
        return _Found(cues.contrast, "contrast")
    quoted = [  # "No, it's "git rebase"": a quoted value the reply did not say
        v for v in values if v.kind == "quoted" and not reply.said(v) and cues.verdict
    ]
    if quoted:
        return _Found(quoted[0], "quoted")

    for s in statements[:1]:  # "1989. The Soviet Union dissolved in 1991"
        bare = _bare(s, reply, strict=True)
        if bare is not None and not reply.said(bare) and kind_fits(bare):
            return _Found(bare, "bare")
    led = _fitting([v for v in fresh if v.kind != "word" and _led(text, v) and kind_fits(v)], reply)
    if led:
        return _Found(led[-1], "led")
    # after a verdict, a number in the unit of the reply's claim stands in its place before one
    # beside the reply's other words ("400 g como mínimo, 100 por persona" for "4 personas
    # necesitas 200 g")
    units = {_unit_key(v.unit) for v in reply.values if v.numeric and v.unit and _claimed(v, reply)}
    united = [v for v in fresh if v.numeric and v.unit and _unit_key(v.unit) in units]
    if united and cues.verdict:
        return _Found(united[0], "unit")
    aligned = [
        v
        for v in fresh
        if (v.kind != "word" or v.text[:1].isupper()) and kind_fits(v) and _aligned(text, v, reply)
    ]
    if aligned:
        return _Found(aligned[0], "aligned")
    slot = _slot(text, statements, reply)
    if slot is not None and kind_fits(slot):
        return _Found(slot, "slot")
    for s in statements:
        first = next((v for v in fresh if s.start <= v.start < s.start + len(s.text)), None)
        if (
            first is not None
            and first.kind != "word"
            and kind_fits(first)
            and _opens(text, s, first, reply)
        ):
            return _Found(first, "opens")
        subject = _subject(s, reply)
        if subject is not None and kind_fits(subject):
            return _Found(subject, "opens")
        bare = _bare(s, reply)
        if bare is not None and not reply.said(bare) and kind_fits(bare):
            return _Found(bare, "bare")
    found = _variant(text, sentences, reply) or _led_uncased(text, statements, reply)
    if found is not None:
        return _Found(found, "variant")
    coded = any(v.kind in ("code", "quoted") for v in reply.values)
    kinds = [
        v
        for v in fresh
        if (v.numeric and reply.numeric) or (v.kind in ("code", "quoted") and coded)
    ]
    if kinds:
        return _Found(kinds[0], "first")
    return None


# a clause that opens with a value and says what it is: "1815 c'est Waterloo", "x = y"
_CLAUSES = re.compile(r"[^.!?;,，。！？；—–]+")
_IS = re.compile(
    r"\s{0,2}(?:is|was|are|were|ist|war|sind|est|c['’]est|sont|es|era|son|è|sono|é|foi|são|"
    r"jest|są|это|=|là|is het|zijn|är|er|adalah)\s|\s{0,2}(?:是|は)",
    _I,
)


def _explained(text: str, values: list[_Value], reply: _Reply) -> list[tuple[int, int]]:
    """The clauses that open with the value the reply claimed and say what it is ("200 ml is
    a Japanese cup", "o Pessoa é do século XX", "1815 c'est Waterloo", "lisa su is AMD"), or
    say what has the reply's value ("401 is unauthorized"): they explain the mistake, and a
    value there is not the right one."""
    spans = []
    for m in _CLAUSES.finditer(text):
        head = m.group(0)
        subject = _claim_subject(text, m, reply)
        if subject is not None:
            spans.append((subject, m.end()))  # "lisa su is AMD": the reply's value, unwritten
            continue
        inside = [v for v in values if m.start() <= v.start < m.end()]
        if not inside or not _IS.match(text, inside[0].end):
            continue
        first, rest = inside[0], inside[1:]
        before = re.findall(r"[\w']+", head[: first.start - m.start()])
        if any(_fold(w) not in W.FILLER and _fold(w) not in W.BETWEEN for w in before):
            continue
        if not _claimed(first, reply):
            said = _fold(text[first.end : m.end()])
            if not reply.said(first) and any(
                _has(said, v.key) and _claimed(v, reply) for v in reply.values[:MAX_CLAIMS]
            ):
                spans.append((first.start, first.end))  # "401 is unauthorized": what it names
            continue
        if first.unit and any(v.numeric and v.unit for v in rest):
            continue  # "5 miles is 8 km": the reply's conversion, done again
        spans.append((first.end, m.end()))
    return spans


def _claim_subject(text: str, clause: re.Match[str], reply: _Reply) -> int | None:
    """Where the copula ends in a clause whose subject is the value the reply claimed, written
    in other letters than a value is ("lisa su is AMD" for "... is Lisa Su"); else None."""
    copula = _IS.search(clause.group(0))
    if copula is None:
        return None
    head = _fold(clause.group(0)[: copula.start()]).strip(" \"'“”«»")
    claimed = [v for v in reply.values[:MAX_CLAIMS] if not v.numeric and _fold(v.text) == head]
    if not claimed or not _claimed(claimed[0], reply):
        return None
    return clause.start() + copula.end()


# a negation inside a clause: what follows it is denied ("apt isn't a thing on macOS")
_NEGATION = re.compile(
    r"(?<=\w)n['’]t\b|(?<!\w)(?:not|never|no|pas|jamais|nicht|kein\w{0,2}|nie|niet|geen|nunca|"
    r"não|nao|mai|не|ни|inte|ikke|tidak|bukan|không|chẳng)(?!\w)",
    _I,
)
_CLAUSE_END = re.compile(
    r"[.!?;:,，。！？；—–]|\b(?:but|mais|aber|sondern|pero|sino|però|mas|maar)\b", _I
)


_OPENING_NO = re.compile(
    r"[\s\"'“«(]*(?:(?:no+|nope|nah|non|nein|nee|nie|нет|não|nao)\b[\s,!.]*)*", _I
)


def _negated(text: str, values: list[_Value]) -> list[tuple[int, int]]:
    """The first value after a negation in its clause ("apt isn't a thing on macOS", "not 12
    it's 14"), less a "no" that opens the clause (the verdict): it is denied, not put
    forward."""
    spans = []
    start = 0
    for end in [m.start() for m in _CLAUSE_END.finditer(text)] + [len(text)]:
        clause = text[start:end]
        opening = _OPENING_NO.match(clause)  # "no no, it leaves at 7:50": the verdict
        lead = opening.end() if opening else 0
        for m in _NEGATION.finditer(clause):
            if m.start() >= lead:
                after = [v for v in values if start + m.end() <= v.start < end]
                # "aqui no app do banco tá R$ 5,42": a lead after the negation puts it forward
                if after and not _led(text, after[0]):
                    spans.append((after[0].start, after[0].end))
                break
        start = end + 1
    return spans


def _claimed(value: _Value, reply: _Reply) -> bool:
    """The reply said `value` as what it claims, not as its subject: the last value of its
    sentence ("Napoleon died in 1815", "HTTP 404 means 'Unauthorized'")."""
    said = list(reply.values[:MAX_CLAIMS])
    for i, v in enumerate(said):
        if v.key != value.key and not _has(_fold(v.text), value.key):
            continue
        end = re.search(r"[.!?;](?:\s|$)", reply.text[v.end :])
        stop = v.end + end.start() if end else len(reply.text)
        if i + 1 == len(said) or said[i + 1].start >= stop:
            return True
    return False


def _fitting(values: list[_Value], reply: _Reply) -> list[_Value]:
    """The numbers among `values` whose unit fits the reply's (a time for a time: "2 uur" over
    "40 km" for "45 minuten"), where there are any; else `values`."""
    fit = [v for v in values if v.numeric and reply.numeric and _unit_fits(v, reply)]
    return fit or values


def _slot(text: str, statements: list[_Sentence], reply: _Reply) -> _Value | None:
    """The word in the place of the reply's name, after the same word and prepositions: "it
    premiered in vienna" for "premiered in Berlin"."""
    frames = dict(reply.slots)
    for s in statements:
        words = [
            (m.start(), m.end(), m.group(0)) for m in re.finditer(r"[^\W\d_][\w'’-]{0,30}", s.text)
        ]
        for i, (_, _, word) in enumerate(words):
            preps = frames.get(_fold(word)[:5])
            if preps is None or len(word) < 3 or _fold(word) in W.STOP:
                continue
            n = len(preps)
            if [_fold(w) for _, _, w in words[i + 1 : i + 1 + n]] != list(preps):
                continue
            if i + 1 + n >= len(words):
                continue
            a, b, value = words[i + 1 + n]
            gap = s.text[words[i + n][1] : a] if n else s.text[words[i][1] : a]
            if gap.strip() or _fold(value) in W.STOP or _verdict_word(value):
                continue
            clause = re.split(r"[.!?;:,，。！？；]", s.text[:a])[-1]
            if _NEGATION.search(clause):
                continue  # "Malang bukan ibu kota provinsi": a word a negation denies
            if _has(reply.folded, _fold(value)):
                continue
            return _Value(value, s.start + a, s.start + b, "word", _fold(value))
    return None


def _led_uncased(text: str, statements: list[_Sentence], reply: _Reply) -> _Value | None:
    """In a script without capitals, the one word a lead puts forward ("هي الرباط")."""
    for s in statements:
        for m in re.finditer(r"(\S{1,20})\s([^\W\d_]{2,30})[.!]?$", s.text):
            word = m.group(2)
            if re.search(r"[A-Za-zÀ-ÿА-яЁё]", word) or not _LEAD.search(m.group(1)):
                continue
            if _verdict_word(word) or _has(reply.folded, _fold(word)):
                continue
            start = s.start + m.start(2)
            return _Value(word, start, start + len(word), "name", _fold(word))
    return None


def _asserted(
    text: str, sentences: list[_Sentence], reply: _Reply, values: list[_Value]
) -> _Found | None:
    """A value the reply said among others, which the user says is the one ("No, that's wrong:
    it's 17 km" for "17 km and 3 m"); not one in a question ("for 8 it's 500 g, no??")."""
    numbers = [v for v in reply.values if v.numeric]
    if len(numbers) < 2:
        return None
    asked = [(s.start, s.start + len(s.text)) for s in sentences if s.asks]
    led = [
        v
        for v in values
        if v.numeric
        and _led(text, v)
        and reply.said(v)
        and not any(a <= v.start < b for a, b in asked)
    ]
    return _Found(led[-1], "asserted") if led else None


def _implicit(text: str, found: _Found, cues: _Cues, reply: _Reply) -> bool:
    """A value with no verdict said is a correction only where it takes the place of the
    reply's: put forward, in its slot, or alone, of the kind (and unit) the reply gave, and
    not said of the user's own things ("my train is at 5 pm", "we are still on 3.8")."""
    if cues.asks or cues.self_blame or reply.asks or cues.accept_later:
        return False
    v = found.value
    if found.how not in ("led", "aligned", "opens", "bare", "slot", "variant"):
        return False
    own = _OWN if found.how == "led" else _DOING
    if own.search(text[max(0, v.start - 40) : v.start]) or _HERE.match(text, v.end):
        return False
    if v.key in ("true", "false") and not re.search(r"\b(?:true|false)\b", reply.folded):
        return False  # "false, I flew it last week": a verdict, where the reply gave no boolean
    if v.kind == "word":
        return found.how in ("bare", "opens", "slot") and reply.states and len(v.text) >= 3
    if v.numeric:
        return reply.numeric and _unit_fits(v, reply)
    return reply.named


# "my train is at", "we are still on", "I'm" (but "I get", "I count": a result the user found)
_OWN = re.compile(
    r"(?<!\w)(?:i|we|my|our|mine|ours|i'm|we're)\b(?:\s\w+){0,3}?\s(?:am|are|is|was|were|"
    r"have|has|had|will be|'ll be)(?:\s\w+){0,2}\s?$|(?<!\w)(?:i'm|we're)(?:\s\w+){0,2}\s?$",
    _I,
)


# "I'm printing on A5": what the user is doing, not the reply's value
_DOING = re.compile(r"(?<!\w)(?:i'?m|we'?re|i am|we are)(?:\s\w+){0,2}\s?$", _I)


# "it's 12 here in Berlin": the user's place, not the reply's value
_HERE = re.compile(
    r"\s(?:here|over here|outside|where i|at my|in my|chez moi|ici|dehors|bei mir|hier|draußen|"
    r"aquí|acá|afuera|fuera|qui|fuori|aqui|lá fora|buiten|"
    r"у нас|burada|yahan)\b",
    _I,
)


def _unit_fits(value: _Value, reply: _Reply) -> bool:
    """A number's unit is one the reply gave a number in (or either has none): "5 pm" does
    not correct "3 hours"."""
    units = {_unit_key(v.unit) for v in reply.values if v.numeric and v.unit}
    if not value.unit or not units:
        return True
    key = _unit_key(value.unit)
    return key in units or _DIMENSION.get(key, key) in {_DIMENSION.get(u, u) for u in units}


_DIMENSION = {unit: dim for dim, units in W.DIMENSIONS.items() for unit in units.split()}


_UNIT_OF = {w: key for key, words in W.UNIT_FAMILIES.items() for w in words.split()}


def _unit_key(unit: str) -> str:
    """One name for a unit's spellings ("meters" and "m", "h20" and "h")."""
    word = re.sub(r"[\d²³.]", "", unit.split()[0]) if unit.split() else ""
    return _UNIT_OF.get(word, word[:3])


# ---- reading --------------------------------------------------------------------------------


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


_SHORTER = re.compile(
    r"\b(?:shorter|more concise|too long|too verbose|less verbose|less text|briefer|be brief|"
    r"tl;?dr|kürzer|zu lang|plus court|trop long|más corto|demasiado largo|più breve|troppo "
    r"lungo|mais curto|muito longo|korter|te lang|krócej|za długie|короче|слишком длинн|"
    r"daha kısa|çok uzun)\b|短く|简短|太长",
    _I,
)
# a question about the reply itself: "Can you make that two sentences at most?"
_ABOUT_REPLY = re.compile(
    r"^\W{0,3}(?:can|could|would) you(?: please)? (?:make|keep|put|rewrite|redo|shorten|format|"
    r"give|answer|reply|write|say|stick) (?:it|that|this|me|the answer|again|to)\b"
    r"|^\W{0,3}(?:can|could) i (?:get|have) (?:it|that|this)\b",
    _I,
)


_COUNT_WORDS = {
    1: "one un une ein eine einen una uno um uma één jedno jedną jeden одно одним bir ek واحدة",
    2: "two deux zwei dos due dois duas twee dwa два iki do",
    3: "three trois drei tres tre três drie trzy три üç teen",
    4: "four quatre vier cuatro quattro quatro",
    5: "five cinq fünf cinco cinque vijf",
    10: "ten dix zehn diez dieci dez tien",
}
_COUNT = {w: n for n, words in _COUNT_WORDS.items() for w in words.split()}


def rules_in(text: str, reply: str | None = None) -> tuple[Rule, ...]:
    """The rules `text` states about a reply: `find_rules`'s, the same kinds said in the
    other languages `followup_words` lists ("max 3 frasi", "箇条書きで", "только число"), and
    "shorter" (at most half the words of `reply`, when there is one)."""
    rules = {r.kind: r for r in find_rules(text)}
    for kind, pattern in W.RULE_CUES.items():
        m = pattern.search(text)
        if m is None or kind in rules:
            continue
        if kind in ("max_words", "max_sentences"):
            said = next((g for g in m.groups() if g), "")
            count = int(said) if said.isdigit() else _COUNT.get(said.lower(), 0)
            if 0 < count <= 10_000:
                rules[kind] = Rule(kind, count, m.group(0))
        else:
            rules[kind] = Rule(kind, None, m.group(0))
    m = _SHORTER.search(text)
    if m is not None and reply and "max_words" not in rules:
        half = max(1, len(reply.split()) // 2)
        rules["max_words"] = Rule("max_words", half, m.group(0))
    return tuple(rules.values())


def _turn(
    followup: str | None, reply: str
) -> tuple[str, list[_Sentence], _Reply, list[_Value], _Cues] | None:
    """A follow-up turn as both readers see it (its text clipped and spaced, its sentences,
    the reply's parts, the values and the cues), or None for an empty turn."""
    if not followup or not followup.strip():
        return None
    text = " ".join(followup[:MAX_FOLLOWUP_CHARS].split())
    said = _reply(reply)
    sentences = _sentences(text)
    values = _headed(text, _values(text, said.tails), said)
    return text, sentences, said, values, _cues(text, sentences, said, values)


def read_followup(followup: str | None, reply: str) -> Followup | None:
    """What `followup` (the user's next turn) says about `reply`, or None when nothing."""
    turn = _turn(followup, reply)
    if turn is None or W.NEW_TOPIC.search(turn[0]):
        return None  # "unrelated, but ...": the turn moves on
    text, sentences, said, values, cues = turn
    about_reply = _ABOUT_REPLY.match(text) is not None
    # a rule's words in quotes or code are mentioned, not asked for ("open 'config.json'")
    unquoted = _QUOTED.sub(lambda m: " " * len(m.group(0)), text)
    rules = rules_in(unquoted, reply) if not cues.questions or about_reply else ()
    if said.asks:  # "JSON" after "CSV or JSON?": the answer picks what the reply offered
        rules = tuple(r for r in rules if not _offered(r, said))
    # after the reply's question, "the book, not the film" picks one of its options
    verdict = cues.verdict and not (said.asks and not (cues.wrong or cues.contrast))
    if cues.accept and not (cues.partial or cues.contrasted):
        verdict = False  # "you're right, I had the date wrong"
    if cues.own_mistake and not (cues.no or cues.wrong or cues.partial or cues.restate):
        verdict = False  # "I gave you the wrong list, it's 19 not 91": the user's own input
    found = None
    if verdict or not said.asks:
        masked = _masked(text, rules)  # "I said under 20 words" states a rule, not a value
        values = _headed(masked, _values(masked, said.tails), said) if masked != text else values
        found = _value(masked, _sentences(masked), cues, said, values)
        found = found or (_asserted(masked, _sentences(masked), said, values) if verdict else None)
    if verdict:
        if rules and cues.restate and not cues.hard:
            return Followup("rule", text, None, rules)  # "in JSON, as I asked"
        if not (rules or cues.no or cues.wrong or cues.contrasted or cues.partial) and any(
            re.match(r"(?:as|like|comme|wie|como|come)\b", m.group(0), _I)
            for m in W.RESTATE.finditer(text)
        ):
            return None  # "respond in Japanese, as I said": a rule these words cannot read
        # after the reply's question ("Have you tried restarting?"), a value beside "same
        # thing" answers it ("yes. twice. same thing"): the reply failed, nothing more
        answered = said.asks and cues.failed and not (cues.no or cues.contrasted)
        if found is not None and not answered and not _failure_output(found.value, said):
            return Followup("correction", text, found.value.text, rules)
        if rules and not cues.hard and not cues.contrasted:
            return Followup("rule", text, None, rules)  # "I said under 20 words"
        return Followup("rejection", text, None, rules)
    if found is not None and not rules and not cues.accept and _implicit(text, found, cues, said):
        if _failure_output(found.value, said):
            return Followup("rejection", text)  # "#N/A everywhere" after "use =VLOOKUP(...)"
        return Followup("correction", text, found.value.text, rules)
    if rules:
        return Followup("rule", text, None, rules)
    if (cues.accept or (cues.accept_later and not cues.asks)) and not said.asks:
        # thanks for "Good luck tomorrow!" approves nothing: the reply said nothing to approve
        return None if W.COURTESY.fullmatch(said.text) else Followup("acceptance", text)
    return None


_ERROR_TEXT = re.compile(
    r"error|exception|fatal|failed|traceback|cannot|can'?t|not found|no such|denied|refused|"
    r"invalid|undefined|unexpected|^#[A-Z][A-Z0-9/]{0,10}[!?]?$",
    _I,
)


def _failure_output(value: _Value, reply: _Reply) -> bool:
    """`value` is an error a program printed after a reply that told the user what to do, not
    what it would print ("ERROR: syntax error" after "here's the query"): the reply failed,
    and the error is no right value (after "it will print X", it is)."""
    return (
        value.kind in ("code", "quoted")
        and _ERROR_TEXT.search(value.text) is not None
        and W.OUTCOME.search(reply.text) is None
    )


def _offered(rule: Rule, reply: _Reply) -> bool:
    """The words stating `rule` are the reply's own ("5 bullets" after "how many bullet
    points?")."""
    words = {w[:5] for w in re.findall(r"[^\W\d_]{3,}", _fold(rule.said or ""))} - W.STOP
    return any(w[:5] in words for w in re.findall(r"[^\W\d_]{3,}", reply.folded))


def has_cue(followup: str | None, reply: str, kind: str) -> bool:
    """The rules see a cue of a `kind` of feedback in the turn, whatever they read: a value in
    the place of the reply's or a verdict for a correction, a verdict for a rejection, thanks
    for an acceptance. A model's reading of a turn the rules read nothing in must stand on one
    (`followup_model.settle`)."""
    turn = _turn(followup, reply)
    if turn is None or W.NEW_TOPIC.search(turn[0]):
        return False
    text, sentences, said, values, cues = turn
    if kind == "acceptance":
        return cues.accept or cues.accept_later
    if kind == "rejection" or cues.verdict:
        return cues.verdict
    return kind == "correction" and _value(text, sentences, cues, said, values) is not None


def _masked(text: str, rules: tuple[Rule, ...]) -> str:
    """`text` with each rule's words, and the words restating a request, blanked (the same
    length, so places hold)."""
    for rule in rules:
        at = text.find(rule.said) if rule.said else -1
        if at >= 0:
            text = text[:at] + " " * len(rule.said) + text[at + len(rule.said) :]
    # "I asked for the total", "como te pedí": what a restated request names is what the
    # user asked for, not a value the reply got wrong
    return _RESTATED.sub(lambda m: " " * len(m.group(0)), text)


_RESTATED = re.compile(rf"(?:{W.RESTATE.pattern})[^,;.!?]{{0,80}}", _I)
