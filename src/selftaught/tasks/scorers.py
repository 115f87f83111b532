"""Built-in scorers for agent tasks: `output` (the model's reply) + `example` -> Score.

Free text is scored as free text: every scorer except `json_match` first looks for an explicit
final-answer marker (`extract_answer`: <answer>, \\boxed{}, "Final answer: ...") and otherwise
compares against the whole reply. Only `json_match` requires JSON.

A reference may be a list of acceptable answers for `exact`, `normalized`, `contains`, `numeric`
and `regex`: any one of them matching counts as solved.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import re
import statistics
import string
from collections import Counter
from collections.abc import Callable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from selftaught import prompts
from selftaught.errors import ConfigError, read_text
from selftaught.models.base import ChatModel, GenerationParams, Message
from selftaught.models.errors import BackendError
from selftaught.models.usage import BudgetExhausted
from selftaught.tasks.base import Example, Score, TaskError
from selftaught.tasks.extract import extract_answer, extract_json

_SHOWN_CHARS = 200  # how much of a reply a feedback string quotes


@runtime_checkable
class Scorer(Protocol):
    def __call__(self, output: str, example: Example) -> Score: ...


def _shorten(text: Any, limit: int = _SHOWN_CHARS) -> str:
    shown = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    shown = " ".join(shown.split())
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _references(example: Example, scorer: str) -> list[Any]:
    """The acceptable answers of an example; a missing reference is a task-data error."""
    ref = example.reference
    if ref is None or (isinstance(ref, list) and not ref):
        raise TaskError(f"example {example.id!r} has no reference; scorer {scorer!r} needs one")
    return list(ref) if isinstance(ref, list) else [ref]


def _expected_text(refs: list[Any]) -> str:
    if len(refs) == 1:
        return repr(_shorten(str(refs[0])))
    return "one of " + ", ".join(repr(_shorten(str(r), 60)) for r in refs[:5])


def _binary(solved: bool, feedback: str) -> Score:
    value = 1.0 if solved else 0.0
    return Score(hard=value, soft=value, feedback=feedback)


# --- exact -----------------------------------------------------------------------------------


def exact(output: str, example: Example) -> Score:
    """The extracted answer equals the reference exactly (surrounding whitespace ignored)."""
    refs = _references(example, "exact")
    answer = extract_answer(output)
    if any(answer == str(r).strip() for r in refs):
        return _binary(True, f"correct: {_shorten(answer)!r}")
    return _binary(False, f"expected {_expected_text(refs)}, got {_shorten(answer)!r}")


# --- normalized ------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({ch: " " for ch in string.punctuation})


def normalize_text(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(prediction: str, reference: str) -> float:
    pred, ref = prediction.split(), reference.split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def normalized(output: str, example: Example) -> Score:
    """Equality after `normalize_text`; soft = best token F1 against the references."""
    refs = _references(example, "normalized")
    answer = extract_answer(output)
    norm_answer = normalize_text(answer)
    norm_refs = [normalize_text(str(r)) for r in refs]
    if norm_answer in norm_refs:
        return Score(1.0, 1.0, f"correct: {_shorten(answer)!r}")
    f1 = max(_token_f1(norm_answer, r) for r in norm_refs)
    return Score(
        0.0,
        round(f1, 6),
        f"expected {_expected_text(refs)}, got {_shorten(answer)!r} (token overlap {f1:.2f})",
    )


# --- contains --------------------------------------------------------------------------------


def contains(output: str, example: Example) -> Score:
    """The reference appears as whole words in the (normalized) extracted answer."""
    refs = _references(example, "contains")
    answer = extract_answer(output)
    padded = f" {normalize_text(answer)} "
    if any(f" {normalize_text(str(r))} " in padded for r in refs if normalize_text(str(r))):
        return _binary(True, f"correct: the answer contains {_expected_text(refs)}")
    return _binary(
        False, f"expected the answer to contain {_expected_text(refs)}, got {_shorten(answer)!r}"
    )


# --- numeric ---------------------------------------------------------------------------------

_NUMBER_TOKEN = re.compile(
    r"[-−]?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
)
REL_TOL = 1e-6
ABS_TOL = 1e-9


def parse_number(text: Any) -> float | None:
    """A number from text: "1,234" -> 1234, "3/4" -> 0.75, "$5" -> 5, "-2.5" -> -2.5.
    Takes the last number in the text; None when there is none."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    hits = _NUMBER_TOKEN.findall(str(text))
    if not hits:
        return None
    token = hits[-1].replace("−", "-").replace("$", "").replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            if float(den) == 0:
                return None
            return float(Fraction(num) / Fraction(den))
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


def _format_number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def numeric(output: str, example: Example) -> Score:
    """The final number of the answer equals the reference within rel 1e-6 / abs 1e-9.
    Looks in the extracted answer first, then falls back to the last number in the reply."""
    refs = _references(example, "numeric")
    parsed = [parse_number(r) for r in refs]
    expected = [v for v in parsed if v is not None]
    if len(expected) != len(parsed):
        raise TaskError(f"example {example.id!r}: reference {refs!r} is not a number")
    answer = extract_answer(output)
    got = parse_number(answer)
    if got is None:
        got = parse_number(output)
    want = (
        _format_number(expected[0])
        if len(expected) == 1
        else str([_format_number(v) for v in expected])
    )
    if got is None:
        return _binary(False, f"expected {want}, got no number in {_shorten(answer)!r}")
    if any(math.isclose(got, v, rel_tol=REL_TOL, abs_tol=ABS_TOL) for v in expected):
        return _binary(True, f"correct: {_format_number(got)}")
    return _binary(False, f"expected {want}, got {_format_number(got)}")


# --- quantity: a number with a unit ---------------------------------------------------------

_QUANTITY = re.compile(
    r"^\s*(-?\$?\d[\d,]*(?:\.\d+)?)\s*([A-Za-z°%µ€£][A-Za-z°%µ/²³.\-]{0,15}(?: [A-Za-z]{1,10})?)"
    r"\s*\.?\s*$"
)
_PLAIN_NUMBER = re.compile(r"^\s*-?\$?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?\s*$")


def quantity(output: str, example: Example) -> Score:
    """A number with a unit: the answer's number must equal the reference's and the answer
    must end with the unit (e.g. reference "7 km": "... 7 km" solves, "7" does not).
    soft: half for the number, half for the unit."""
    m = _QUANTITY.match(str(example.reference))
    if m is None:
        raise TaskError(f"reference {example.reference!r} is not a number with a unit")
    want, unit = parse_number(m.group(1)), m.group(2).strip().rstrip(".")
    answer = extract_answer(output).strip().rstrip(".!").strip()
    got = parse_number(answer)
    number_ok = got is not None and want is not None and abs(got - want) <= 1e-9 + 1e-6 * abs(want)
    ends = re.search(rf"\d\s*{re.escape(unit)}$", answer, re.I) is not None
    soft = 0.5 * number_ok + 0.5 * ends
    if number_ok and ends:
        return Score(1.0, 1.0, f"correct: {m.group(1)} {unit}")
    problems = []
    if not number_ok:
        problems.append(
            f"expected the number {m.group(1)}, got {got if got is not None else 'none'}"
        )
    if not ends:
        problems.append(f"the answer must end with the unit {unit!r} (right after the number)")
    return Score(0.0, soft, "; ".join(problems))


# --- regex -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a reference pattern; a bad pattern is a task-data error."""
    try:
        return re.compile(pattern)
    except re.error as err:
        raise TaskError(f"bad regex reference {pattern!r}: {err}") from err


def regex(output: str, example: Example) -> Score:
    """The reference is a pattern that must FULLMATCH the extracted answer (the final-answer
    marker's content, else the whole stripped reply; a trailing period is ignored). Fullmatch,
    not search, so a reply listing every option does not pass; write `.*word.*` for search."""
    refs = _references(example, "regex")
    answer = extract_answer(output)
    candidates = {answer, answer.rstrip(".").strip()}
    for ref in refs:
        pattern = compile_pattern(str(ref))
        if any(pattern.fullmatch(c) for c in candidates):
            return _binary(True, f"correct: {_shorten(answer)!r} matches /{_shorten(str(ref))}/")
    shown = " or ".join(f"/{_shorten(str(r), 80)}/" for r in refs[:5])
    return _binary(False, f"expected an answer matching {shown}, got {_shorten(answer)!r}")


# --- json_match ------------------------------------------------------------------------------


def json_match(output: str, example: Example) -> Score:
    """JSON is expected here: the reply's JSON must equal the reference object.
    soft = share of the top-level keys (reference and reply together) whose values match."""
    if example.reference is None:
        raise TaskError(f"example {example.id!r} has no reference; scorer 'json_match' needs one")
    expected = example.reference
    if isinstance(expected, str):
        try:
            expected = json.loads(expected)
        except json.JSONDecodeError as err:
            raise TaskError(
                f"example {example.id!r}: reference is not valid JSON ({err.msg})"
            ) from err
    try:
        got = extract_json(output)
    except ValueError:
        return _binary(
            False,
            f"invalid JSON: no JSON value found in the reply "
            f"{_shorten(output, 120)!r}; expected {_shorten(expected)}",
        )
    if got == expected:
        return _binary(True, "correct: the JSON matches the reference")
    if not isinstance(expected, dict) or not isinstance(got, dict):
        return _binary(False, f"expected {_shorten(expected)}, got {_shorten(got)}")
    keys = list(expected) + [k for k in got if k not in expected]
    matching = [k for k in expected if k in got and got[k] == expected[k]]
    problems = []
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    if wrong:
        problems.append(
            "wrong: "
            + "; ".join(
                f"{k} (expected {_shorten(expected[k], 60)}, got {_shorten(got[k], 60)})"
                for k in wrong[:5]
            )
        )
    missing = [k for k in expected if k not in got]
    if missing:
        problems.append("missing: " + ", ".join(missing[:10]))
    extra = [k for k in got if k not in expected]
    if extra:
        problems.append("unexpected: " + ", ".join(str(k) for k in extra[:10]))
    soft = len(matching) / len(keys) if keys else 0.0
    return Score(0.0, soft, f"{len(matching)}/{len(keys)} keys match; " + "; ".join(problems))


# --- llm_judge -------------------------------------------------------------------------------

DEFAULT_RUBRIC = (
    "The reply answers the question correctly and completely. When a reference answer is "
    "given, the reply must agree with it in substance (wording may differ)."
)
JudgeMode = Literal["absolute", "reference", "pairwise"]
JUDGE_MODES: tuple[JudgeMode, ...] = ("absolute", "reference", "pairwise")
SAMPLE_TEMPERATURE = 0.7  # the judge's temperature when it is asked k > 1 times per reply
_JUDGE_MAX_TOKENS = 512
_TEMPLATES: dict[JudgeMode, str] = {  # each mode's prompt name (`selftaught.prompts`)
    "absolute": "llm_judge",
    "reference": "llm_judge_reference",
    "pairwise": "llm_judge_pairwise",
}
_NEEDS: dict[JudgeMode, tuple[str, ...]] = {
    "absolute": ("{{reply}}",),
    "reference": ("{{reply}}",),
    "pairwise": ("{{reply_a}}", "{{reply_b}}"),
}
_JUDGE_SCORE = re.compile(r'"?score"?\s*[:=]\s*"?(\d+(?:\.\d+)?)', re.I)
_JUDGE_REASON = re.compile(r'"reason"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)
_JUDGE_BETTER = re.compile(r'"?better"?\s*[:=]\s*"?(A|B|tie)\b', re.I)
_REPAIR_PROMPT = (
    "Your reply could not be read. Answer again with exactly one JSON object and nothing else: "
    '{"score": <integer 0..10>, "reason": "<one or two sentences>"}'
)
_PAIRWISE_REPAIR_PROMPT = (
    "Your reply could not be read. Answer again with exactly one JSON object and nothing else: "
    '{"reason": "<one or two sentences>", "better": "A" or "B" or "tie"}'
)
_WIN, _TIE, _LOSS = 10.0, 5.0, 0.0  # a pairwise verdict on the 0..10 scale of a score
_OUTCOME = {_WIN: "win", _TIE: "tie", _LOSS: "loss"}

Baseline: TypeAlias = "Mapping[str, str] | Callable[[str], str | None]"
"""Pairwise mode's baseline reply of an example, by example id."""


def judge_prompt_template(mode: JudgeMode = "absolute") -> str:
    """The judge's template of `mode` as the run has it (`--prompts DIR` overrides it)."""
    return prompts.load(_TEMPLATES[mode])


def _judge_field(
    text: str, key: str, bare: re.Pattern[str], usable: Callable[[Any], bool]
) -> tuple[Any, str] | None:
    """(the value of `key`, the reason) from a judge reply: a JSON object (fenced or inline),
    else, when its value is not `usable`, the bare `"key": value` that `bare` finds; None when
    neither holds it."""
    value: Any = None
    reason = ""
    try:
        data = extract_json(text)
        if isinstance(data, dict):
            value, reason = data.get(key), str(data.get("reason", "") or "")
    except ValueError:
        pass
    if not usable(value):
        hit = bare.search(text)
        if hit is None:
            return None
        value = hit.group(1)
        reason_hit = _JUDGE_REASON.search(text)
        reason = reason_hit.group(1) if reason_hit else ""
    return value, reason


def parse_judge_reply(text: str) -> tuple[float, str] | None:
    """(score 0..10, reason) from a judge reply, or None when it cannot be read.
    Accepts a JSON object (fenced or inline), and as a fallback a bare `"score": 7`."""
    found = _judge_field(text, "score", _JUDGE_SCORE, lambda v: v is not None)
    if found is None:
        return None
    score, reason = found
    if isinstance(score, str):
        score = parse_number(score)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 10:
        return None
    return float(score), reason.strip()


def parse_pairwise_reply(text: str) -> tuple[str, str] | None:
    """("A" | "B" | "tie", reason) from a pairwise judge reply, or None when it cannot be
    read. Accepts a JSON object, and as a fallback a bare `"better": "A"`."""
    found = _judge_field(text, "better", _JUDGE_BETTER, lambda v: isinstance(v, str))
    if found is None:
        return None
    better, reason = found
    label = {"a": "A", "b": "B", "tie": "tie"}.get(better.strip().casefold())
    return None if label is None else (label, reason.strip())


def read_baselines(path: Path) -> dict[str, str]:
    """Pairwise baselines from a JSONL file of `{"id": ..., "reply": ...}` lines."""
    from selftaught.runs import iter_jsonl

    out: dict[str, str] = {}
    for lineno, row in iter_jsonl(path, ConfigError):
        if "id" not in row or not isinstance(row.get("reply"), str):
            raise ConfigError(f"{path}:{lineno}: a baseline line needs `id` and a string `reply`")
        out[str(row["id"])] = row["reply"]
    return out


class UnreadableVerdict(BackendError):
    """The judge answered, twice, with no verdict that can be read: a backend error whose
    message shows the reply cut short, and `reply` its whole last reply (for a judge check
    to save: why it was unreadable)."""

    def __init__(self, backend: str, cause: str, *, reply: str):
        super().__init__(backend, cause)
        self.reply = reply


class LlmJudge:
    """Scores a reply with a judge model against a rubric.

    hard = score >= threshold, soft = score / 10, feedback = the judge's reason. A judge that
    fails (backend error, or no readable score after one repair request) raises BackendError:
    a broken judge is never a wrong answer. An example's own `state["rubric"]` overrides the
    scorer's rubric. `template` (text or a Path to a `.md` file) replaces the packaged judge
    prompt (`prompts/llm_judge.md`); it fills `{{rubric}}`, `{{question}}`, `{{reference}}` and
    `{{reply}}`, and must hold `{{reply}}`.

    Variants (each off by default): `samples` = k judge calls per reply at `temperature`
    (default `SAMPLE_TEMPERATURE` when k > 1), the verdict their median; `mode="reference"`
    shows the reference first and asks whether the reply gives the same answer (an example
    without a reference is a TaskError); `mode="pairwise"` asks which of the reply and the
    example's `baseline` reply (by example id) better meets the rubric, labelled A / B in an
    order drawn per (seed, example, sample), so judging x against y and y against x shows the
    pair both ways round; hard = the reply wins (median verdict: win 10, tie 5, loss 0)."""

    name = "llm_judge"

    def __init__(
        self,
        judge_model: ChatModel,
        rubric: str | Path | None = None,
        *,
        threshold: float = 7.0,
        params: GenerationParams | None = None,
        template: str | Path | None = None,
        samples: int = 1,
        temperature: float | None = None,
        mode: JudgeMode = "absolute",
        baseline: Baseline | None = None,
        seed: int = 0,
    ):
        if judge_model is None:
            raise ConfigError("scorer 'llm_judge' needs a judge model")
        if not 0 <= threshold <= 10:
            raise ConfigError(f"llm_judge threshold must be in 0..10, got {threshold}")
        if isinstance(rubric, Path):
            rubric = read_text(rubric, "rubric file")
        self.judge_model = judge_model
        self.rubric = (rubric or "").strip() or DEFAULT_RUBRIC
        self.threshold = threshold
        self.samples, self.mode, self.seed = samples, mode, seed
        self.params = _judge_params(params, samples, temperature)
        self.baseline = _check_mode(mode, baseline)
        if isinstance(template, Path):
            template = read_text(template, "judge template file")
        # None: the packaged template, or the run's override, read when a reply is judged
        self._template = template or None
        missing = [field for field in _NEEDS[mode] if template and field not in template]
        if missing:
            raise ConfigError(
                f"a {mode} judge template must hold {' and '.join(missing)}: "
                "the judge would not see the reply"
            )

    @property
    def needs_reference(self) -> bool:
        """Whether every example needs a reference (a JSONL task checks it at load)."""
        return self.mode == "reference"

    def _fill(self, example: Example, **replies: str) -> list[Message]:
        rubric = str(example.state.get("rubric") or self.rubric)
        reference = example.reference
        if reference is None:
            reference_text = "(none given)"
        elif isinstance(reference, str):
            reference_text = reference
        else:
            reference_text = json.dumps(reference, ensure_ascii=False, default=str)
        fields = {
            "rubric": rubric,
            "question": example.prompt_text(),
            "reference": reference_text,
            **replies,
        }
        prompt = self._template or judge_prompt_template(self.mode)
        for key, value in fields.items():  # plain replace: the texts may hold braces
            prompt = prompt.replace("{{" + key + "}}", value)
        return [{"role": "user", "content": prompt}]

    def messages(self, output: str, example: Example, sample: int = 0) -> list[Message]:
        """The judge's prompt for `output` (pairwise: for judge sample `sample`)."""
        if self.mode == "reference" and (
            example.reference is None or example.reference in ("", [])
        ):
            raise TaskError(
                f"example {example.id!r} has no reference; the reference-guided judge "
                "(llm_judge mode 'reference') needs one"
            )
        if self.mode != "pairwise":
            return self._fill(example, reply=output)
        baseline = self._baseline_of(example)
        a, b = (output, baseline) if self.reply_first(example, sample) else (baseline, output)
        return self._fill(example, reply_a=a, reply_b=b)

    def reply_first(self, example: Example, sample: int) -> bool:
        """Pairwise: whether the reply is A in judge sample `sample` of `example`. Drawn from
        an RNG seeded by (seed, example id, sample): the same for every reply of the example,
        so a pair judged both ways round sees both orders, and reproducible under threads."""
        return random.Random(f"{self.seed}\x00{example.id}\x00{sample}").random() < 0.5

    def _baseline_of(self, example: Example) -> str:
        got: str | None
        if isinstance(self.baseline, Mapping):
            got = self.baseline.get(example.id)
        else:
            assert self.baseline is not None  # _check_mode refused pairwise without one
            got = self.baseline(example.id)
        if got is None:
            raise TaskError(
                f"example {example.id!r} has no baseline reply; the pairwise judge "
                "(llm_judge mode 'pairwise') needs one for every example it scores"
            )
        return got

    def _ask(self, messages: list[Message]) -> str:
        try:
            return self.judge_model.chat(messages, self.params).text
        except (BackendError, BudgetExhausted):
            raise
        except Exception as err:  # any other judge failure is still not the reply's fault
            name = getattr(self.judge_model, "name", "judge")
            raise BackendError(name, f"judge call failed: {err!r}") from err

    def _read(self, reply: str, example: Example, sample: int) -> tuple[float, str] | None:
        """A reply of the judge as (0..10 for the graded reply, reason), or None."""
        if self.mode != "pairwise":
            return parse_judge_reply(reply)
        parsed = parse_pairwise_reply(reply)
        if parsed is None:
            return None
        better, reason = parsed
        if better == "tie":
            return _TIE, reason
        ours = "A" if self.reply_first(example, sample) else "B"
        return (_WIN if better == ours else _LOSS), reason

    def _verdict(self, output: str, example: Example, sample: int) -> tuple[float, str]:
        """One judge call (and one repair request when its reply cannot be read)."""
        messages = self.messages(output, example, sample)
        reply = self._ask(messages)
        parsed = self._read(reply, example, sample)
        if parsed is None:  # one repair attempt, in the same conversation
            repair = _PAIRWISE_REPAIR_PROMPT if self.mode == "pairwise" else _REPAIR_PROMPT
            repair_messages = messages + [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": repair},
            ]
            reply = self._ask(repair_messages)
            parsed = self._read(reply, example, sample)
        if parsed is None:
            name = getattr(self.judge_model, "name", "judge")
            what = "verdict" if self.mode == "pairwise" else "score"
            raise UnreadableVerdict(
                name,
                f"judge gave no readable {what} after one repair: {_shorten(reply, 120)!r}",
                reply=reply,
            )
        return parsed

    def __call__(self, output: str, example: Example) -> Score:
        # every call must answer: one that fails raises, never a median of the others
        verdicts = [self._verdict(output, example, i) for i in range(self.samples)]
        values = [value for value, _ in verdicts]
        value = float(statistics.median(values))
        # the reason of the sample closest to the median speaks for the verdict
        reason = min(verdicts, key=lambda v: abs(v[0] - value))[1] or "(no reason given)"
        if self.mode == "pairwise":
            hard = value > _TIE
            outcomes = ", ".join(_OUTCOME[v] for v in values)
            head = f"pairwise judge vs the baseline: {outcomes}"
            head += f" (median {value:g}/10: {'a win' if hard else 'no win'})"
        else:
            hard = value >= self.threshold
            if self.samples == 1:
                head = f"judge score {value:g}/10"
            else:
                shown = ", ".join(f"{v:g}" for v in values)
                head = f"judge scores {shown} (median {value:g}/10)"
        return Score(hard=1.0 if hard else 0.0, soft=value / 10.0, feedback=f"{head}: {reason}")


def _judge_params(
    params: GenerationParams | None, samples: int, temperature: float | None
) -> GenerationParams:
    """The judge's sampling settings: greedy for one call; k > 1 calls at `temperature`
    (default SAMPLE_TEMPERATURE), since k greedy calls are k copies of one (and cached)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ConfigError(f"llm_judge samples must be an integer >= 1, got {samples!r}")
    if temperature is None and samples > 1 and (params is None or params.temperature == 0):
        temperature = SAMPLE_TEMPERATURE
    if temperature is not None and not 0 <= temperature <= 2:
        raise ConfigError(f"llm_judge temperature must be in 0..2, got {temperature}")
    base = params or GenerationParams(max_tokens=_JUDGE_MAX_TOKENS, temperature=0.0)
    if temperature is not None:
        base = dataclasses.replace(base, temperature=temperature)
    if samples > 1 and base.temperature == 0:
        raise ConfigError(
            f"llm_judge samples={samples} at temperature 0 are {samples} copies of one verdict; "
            "give a temperature > 0"
        )
    return base


def _check_mode(mode: str, baseline: Baseline | None) -> Baseline | None:
    if mode not in JUDGE_MODES:
        raise ConfigError(f"unknown llm_judge mode {mode!r}; valid: {', '.join(JUDGE_MODES)}")
    if mode == "pairwise" and baseline is None:
        raise ConfigError(
            "llm_judge mode 'pairwise' needs a baseline reply per example to compare with "
            "(baseline=: a mapping or a callable from example id to the reply; "
            "--judge-baselines FILE on the command line)"
        )
    if mode != "pairwise" and baseline is not None:
        raise ConfigError(f"a baseline is for llm_judge mode 'pairwise', not {mode!r}")
    return baseline


# --- registry --------------------------------------------------------------------------------

SCORERS: dict[str, Scorer] = {
    "exact": exact,
    "normalized": normalized,
    "numeric": numeric,
    "contains": contains,
    "regex": regex,
    "json_match": json_match,
    "quantity": quantity,
}
JUDGE_SCORER = "llm_judge"  # built by get_scorer: it needs a judge model
SCORER_NAMES: tuple[str, ...] = (*SCORERS, JUDGE_SCORER)

# ---- a reference alone picks its scorer (mined tasks, probation) ----------------------------

REFERENCE_SCORERS = ("numeric", "quantity", "normalized")


def reference_scorer(reference: Any) -> str:
    """Which scorer checks this reference: numeric, quantity or normalized."""
    refs = reference if isinstance(reference, list) else [reference]
    texts = [str(r) for r in refs]
    if texts and all(_PLAIN_NUMBER.match(t) for t in texts):
        return "numeric"
    if len(texts) == 1 and _QUANTITY.match(texts[0]):
        return "quantity"
    return "normalized"


def score_reference(output: str, example: Example, scorer: str) -> Score:
    """`output` against the example's reference with one of REFERENCE_SCORERS."""
    if scorer not in REFERENCE_SCORERS:
        raise ConfigError(
            f"unknown reference scorer {scorer!r}; valid: {', '.join(REFERENCE_SCORERS)}"
        )
    return SCORERS[scorer](output, example)


def get_scorer(
    name: str,
    judge_model: ChatModel | None = None,
    rubric: str | Path | None = None,
    **judge_options: Any,
) -> Scorer:
    """A scorer by name. `llm_judge` needs `judge_model`; `rubric` (text or a Path to a file)
    and LlmJudge's keywords (`threshold=`, `samples=`, `mode=`, `baseline=`, ...) configure
    it."""
    if name == JUDGE_SCORER:
        if judge_model is None:
            raise ConfigError(
                "scorer 'llm_judge' needs a judge model (--judge-model, or judge_model=...)"
            )
        return LlmJudge(judge_model, rubric, **judge_options)
    try:
        return SCORERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown scorer {name!r}; valid scorers: {', '.join(SCORER_NAMES)}"
        ) from None
