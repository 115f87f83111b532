"""Weak labels: self-consistency for requests nobody checked, for training only.

A plain request that mining dropped for having nothing to check it by (no reference, no rule
the user stated, no judge: `mine.NO_CHECK`) may still have an answer one can extract: a number,
a number with a unit, a label, a short text. With `--pseudo-k K` the night asks the target
(with the adopted skill and memory, through the rollout runner, charged to the night's ledger
and written to its evidence log) for K samples at the rollout temperature; when one extracted
answer reaches `--pseudo-agree` of the K samples, it becomes the task's **weak reference**
(`state["weak"] = {"agreement", "k", "answers"}`, scored like any reference).

A weak label trains and never validates: a weak task goes to train only (`split.train_only`),
never to val or test, never counts toward the night's minimum train size, is left out when it
nearly duplicates a val or test task, is never written to the recall pool, and weak tasks are
at most `--pseudo-share` of the night's checked train tasks (the best agreed kept). It may
feed a demonstration (the target's own passing reply, or the agreed answer) only when every
row it came from is the operator's own words (`signals.words_trusted`); a weak task on an end
user's request is marked `no_demo` and only feeds reflection.

A weak label is the model's (`trust.py`: below every user's label), so no label is taken
where a user already spoke: a request that the user rejected (a thumb, a re-ask, a "that's
wrong"), whose agreed answer is the one in the rejected reply (its short answer, or a reply in
prose that the agreed answer's check passes), is refuted: the label must fail the rejected
reply (two-sided); a request that a checked task of tonight or of the recall pool also asks
(the same id or a near-duplicate) is not added, and where that task has a reference the weak
label is scored against it: the report counts how often weak labels were right. A label
waiting in `weak_labels.jsonl` names the rows it came from (`sources`): a forget drops it
(`sleep.night.forget`), and one written before labels named them is dropped by the next night, which
cannot tell whose it was.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from selftaught.duplicates import item_key, same_item
from selftaught.errors import BudgetExhausted, ConfigError
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.errors import FatalBackendError
from selftaught.policy import Policy
from selftaught.record import Record
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.runs import RunError, iter_jsonl, write_jsonl
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.threads import logged_tools
from selftaught.sleep.night.checks import short_answer
from selftaught.sleep.night.mine import (
    MineConfig,
    MinedTask,
    merge_near_duplicates,
    new_task,
    quoted,
    request_messages,
    task_key,
)
from selftaught.sleep.night.signals import words_trusted
from selftaught.sleep.night.split import example_of, train_only, use_lines
from selftaught.sleep.night.trust import Trust
from selftaught.sleep.paths import project_dir
from selftaught.sleep.records import (
    JsonValue,
    TaskChecks,
    TrainOnlyUse,
    WeakLabel,
    WeakRecord,
    WeakTaskRow,
    given,
)
from selftaught.tasks.base import Example, Score, Split, TaskKind
from selftaught.tasks.scorers import (
    reference_scorer,
    score_reference,
)

UNTRUSTED_REQUEST = "a weak label on an end user's request (no demonstration is made of it)"


@dataclass
class WeakConfig:
    k: int = 0
    """Samples of the target per request nobody checked, whose agreed extracted answer (a
    number, a number with a unit, a label, a short text) becomes a weak reference for training
    only, never for val or test (0: off; else at least 2)."""
    agree: float = 0.8
    """Share of the samples one extracted answer must reach to become a weak reference (above
    one half)."""
    weak_share: float = 1.0
    """Weak tasks at most this share of the night's checked train tasks (the best agreed
    kept)."""
    max_candidates: int = 32
    """Requests sampled per night at most (newest first): each costs k target samples."""
    max_answer_words: int = 6
    """A reply's extracted answer longer than this is not an answer to agree on."""

    def __post_init__(self) -> None:
        if self.k < 0 or self.k == 1:
            raise ConfigError(f"pseudo k must be 0 (off) or at least 2, got {self.k}")
        if not 0.5 < self.agree <= 1.0:
            raise ConfigError(f"pseudo agree must be in (0.5, 1], got {self.agree}")
        if self.weak_share < 0:
            raise ConfigError(f"pseudo share must be >= 0, got {self.weak_share}")
        if self.max_candidates < 1 or self.max_answer_words < 1:
            raise ConfigError("max_candidates and max_answer_words must be >= 1")


@dataclass(frozen=True)
class Vote:
    """The samples' verdict on one request."""

    answer: str | None  # the agreed reference (None: no answer reached the share)
    key: str | None  # the most common answer's key
    agreement: float  # its share of the k samples
    answers: dict[str, int]  # every key and its count

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vote(replies: list[str | None], k: int, agree: float, max_words: int) -> Vote:
    """Count the extracted answers of `replies` (None: a sample that failed) over `k`."""
    answers = [short_answer(r, max_words) if r is not None else None for r in replies]
    keys = Counter(a.key for a in answers if a is not None)
    if not keys:
        return Vote(None, None, 0.0, {})
    key, count = keys.most_common(1)[0]
    forms = Counter(a.value for a in answers if a is not None and a.key == key)
    share = count / k
    agreed = forms.most_common(1)[0][0] if share >= agree else None
    return Vote(agreed, key, round(share, 4), dict(keys.most_common(5)))


# ---- the record ----------------------------------------------------------------------------

_UNSCORED: Mapping[str, int] = {"right": 0, "wrong": 0}


def _accuracy(verified: Mapping[str, int], verified_later: Mapping[str, int]) -> float | None:
    """How often a weak label was right, where a real reference came (tonight or since)."""
    right = verified["right"] + verified_later["right"]
    n = right + verified["wrong"] + verified_later["wrong"]
    return None if n == 0 else round(right / n, 4)


# ---- candidates and sampling ----------------------------------------------------------------


class _Unchecked:
    """The requests to sample as a Task for the rollout runner: nothing checks them yet."""

    kind: TaskKind = "agent"
    instructions = ""
    name = "sleep:weak-labels"

    def __init__(self, examples: list[Example]):
        self._examples = examples

    def examples(self, split: Split) -> list[Example]:
        return list(self._examples) if split == "train" else []

    def score(self, output: str, example: Example) -> Score:
        return Score(0.0, 0.0, "no check yet: sampled for a weak label")


def candidates(rows: list[Interaction], mining: MineConfig) -> list[MinedTask]:
    """Check-less tasks from `rows` (plain requests mining dropped with `NO_CHECK`), merged as
    near-duplicates, newest first; `no_demo` unless every row is the operator's words."""
    tasks, trusted = [], {}
    for it in rows:
        if logged_tools(it):
            continue
        messages = request_messages(it, mining)
        if isinstance(messages, str):
            continue
        state = TaskChecks.empty().but(rules=())
        if (it.feedback.comment or "").strip():  # a trusted comment would have stated a rule
            state = state.but(evidence=quoted(it.feedback.comment or ""))
        tasks.append(new_task(it, messages, None, state))
        trusted[it.id] = words_trusted(it)
    merged = merge_near_duplicates(tasks, mining.near_duplicate)
    for task in merged:
        if not all(trusted.get(s, False) for s in task.sources):
            task.state = task.state.but(no_demo=UNTRUSTED_REQUEST)
    return sorted(merged, key=lambda t: t.created_at, reverse=True)


def _sample(
    tasks: list[MinedTask],
    config: WeakConfig,
    target: ChatModel,
    policy: Policy,
    training: SkillOptConfig,
) -> tuple[dict[str, list[str | None]], int]:
    """Each task's k replies (None for a failed or truncated sample), and the samples that
    failed; raises what stopped the sampling (the backend, the budget)."""
    examples = [Example(id=t.id, input=t.messages) for t in tasks]
    rollout = RolloutConfig(
        concurrency=training.concurrency,
        timeout_s=training.timeout_s,
        params=GenerationParams(
            max_tokens=training.max_tokens, temperature=training.rollout_temperature
        ),
        samples=config.k,
        progress=False,
        description="weak labels",
    )
    done = run_rollouts(target, policy, _Unchecked(examples), examples, rollout)
    replies: dict[str, list[str | None]] = {t.id: [] for t in tasks}
    for r in done:
        bad = r.error is not None or r.truncated
        replies[r.example_id].append(None if bad else r.reply)
    return replies, sum(r.error is not None for r in done)


def _twin(
    task_id: str, prompt: str, checked: list[MinedTask], threshold: float
) -> MinedTask | None:
    """The checked task asking what `prompt` asks (the same id, or a near-duplicate)."""
    key = item_key(prompt)
    return next(
        (t for t in checked if t.id == task_id or same_item(key, task_key(t), threshold)),
        None,
    )


def _right(answer: str, twin: MinedTask) -> bool | None:
    """Whether a weak answer passes the real reference of `twin` (None: it has none)."""
    scorer = twin.state.scorer
    if not scorer or twin.reference is None:
        return None
    try:
        return bool(score_reference(answer, example_of(twin), scorer).hard)
    except Exception:  # noqa: BLE001 - a reference its scorer cannot read compares nothing
        return None


def _gives(reply: str, got: Vote, config: WeakConfig) -> bool:
    """Whether `reply` gives the agreed answer: the same short answer, or, in prose, it passes
    the answer as a reference. A weak label on a rejected request must fail the rejected reply
    (two-sided), or the samples only agree with what the user refused."""
    said = short_answer(reply, config.max_answer_words)
    if said is not None or got.answer is None:
        return said is not None and said.key == got.key
    example = Example(id="rejected", input="", reference=got.answer)
    try:
        return bool(score_reference(reply, example, reference_scorer(got.answer)).hard)
    except Exception:  # noqa: BLE001 - a reply the scorer cannot read gives no answer
        return False


def _settle_one(
    task: MinedTask,
    got: Vote,
    checked: list[MinedTask],
    config: WeakConfig,
    threshold: float,
) -> tuple[str, str]:
    """Label `task` from its vote, or say why not: what the record counts it as (`labelled`,
    `no_answer`, `disagreed`, `refuted`, `already_checked`, or `right` / `wrong`: already
    checked, against a real reference) and the outcome word for the report."""
    if got.answer is None:
        return ("no_answer", "no_answer") if got.key is None else ("disagreed", "disagreed")
    twin = _twin(task.id, task.prompt, checked, threshold)
    if twin is not None:
        right = _right(got.answer, twin)
        if right is not None:
            said = "right" if right else "wrong"
            return said, f"checked by {twin.id}: {said}"
        return "already_checked", f"already checked by {twin.id}"
    if task.negative and _gives(task.logged_reply or "", got, config):
        return "refuted", "refuted: the user rejected a reply with this answer"
    task.reference = got.answer
    task.state = task.state.but(
        scorer=reference_scorer(got.answer),
        weak=WeakLabel(agreement=got.agreement, k=config.k, answers=got.answers),
        trust=Trust.MODEL.label,
    )
    task.notes.append(f"weak label: {got.answer!r} agreed by {got.agreement:.0%} of {config.k}")
    return "labelled", "labelled"


def weak_label(
    rows: list[Interaction],
    checked: list[MinedTask],
    config: WeakConfig,
    mining: MineConfig,
    target: ChatModel,
    policy: Policy,
    training: SkillOptConfig,
) -> tuple[list[MinedTask], WeakRecord]:
    """Weak tasks from `rows` (what `phases.mine.mine(unchecked=...)` handed back), sampled on
    `target` (already charged to the night's ledger and evidence log) under `policy`;
    `checked`: the night's tasks with checks (tonight's and recalled), which a weak label
    never duplicates and is scored against. The tasks come back unsplit, marked `weak`, with
    the night's `weak` as the sampling leaves it (`settle_weak` and `verify_waiting` add what
    the split and the past labels say)."""
    found = candidates(rows, mining) if config.k else []
    sample = found[: config.max_candidates]
    notes = []
    if len(found) > len(sample):
        notes.append(
            f"{len(found) - len(sample)} unchecked requests not sampled (max_candidates "
            f"{config.max_candidates}, newest first)"
        )
    try:
        replies, failed = _sample(sample, config, target, policy, training) if sample else ({}, 0)
    except (FatalBackendError, BudgetExhausted) as err:
        notes.append(f"weak labels: sampling stopped ({err}); none taken tonight")
        replies, failed = {}, 0
    sampled = [t for t in sample if t.id in replies]  # none when the sampling stopped
    out, settled = [], []
    counted: Counter[str] = Counter()
    for task in sampled:
        got = vote(replies[task.id], config.k, config.agree, config.max_answer_words)
        kind, outcome = _settle_one(task, got, checked, config, mining.near_duplicate)
        counted[kind] += 1
        settled.append(
            WeakTaskRow(
                id=task.id,
                answer=got.answer,
                agreement=got.agreement,
                answers=got.answers,
                outcome=outcome,
            )
        )
        if kind == "labelled":
            out.append(task)
    verified = {"right": counted["right"], "wrong": counted["wrong"]}
    return out, WeakRecord(
        k=config.k,
        agree=config.agree,
        candidates=len(found),
        sampled=len(sampled),
        labelled=counted["labelled"],
        disagreed=counted["disagreed"],
        no_answer=counted["no_answer"],
        refuted=counted["refuted"],
        already_checked=counted["already_checked"] + counted["right"] + counted["wrong"],
        verified=verified,
        verified_later=dict(_UNSCORED),
        failed_samples=failed,
        tasks=tuple(settled),
        notes=tuple(notes),
        shipped=TrainOnlyUse.empty(),  # `{}` until the stage phase says what was used
        accuracy=_accuracy(verified, _UNSCORED),
    )


def _weak_label(task: MinedTask) -> WeakLabel:
    """The weak label of a task `_settle_one` labelled."""
    assert task.state.weak is not None, task.id
    return task.state.weak


def settle_weak(
    splits: dict[str, list[MinedTask]],
    tasks: list[MinedTask],
    config: WeakConfig,
    labels: WeakRecord,
) -> WeakRecord:
    """After the split: count the weak tasks left out as near-duplicates of held-out ones,
    keep at most `share` of the checked train tasks (the best agreed), record the rest;
    `labels` (`weak_label`'s) with what the split did to them."""
    left_out = sum(t.split is None for t in tasks)
    train = splits.get("train", [])
    checked = sum(not train_only(t) for t in train)
    cap = math.floor(config.weak_share * checked + 1e-9)
    weak = sorted(
        (t for t in train if train_only(t) == "weak"),
        key=lambda t: (-_weak_label(t).agreement, t.id),
    )
    for task in weak[cap:]:
        train.remove(task)
        task.split = None
        task.notes.append(f"left out: over the weak share ({cap} of {checked} checked train tasks)")
    mean_agreement = None
    if labels.labelled:
        labelled = [t for t in tasks if given(t.state.weak)]
        mean_agreement = round(sum(_weak_label(t).agreement for t in labelled) / len(labelled), 4)
    by_id = {t.id: t for t in tasks}
    rows = []
    for row in labels.tasks:
        found = by_id.get(row.id)
        if found is not None:
            left = found.split is None and found.notes
            # `split`: a labelled row's only, untyped, as report.json has always had it
            row = replace(
                row,
                outcome=found.notes[-1] if left else row.outcome,
                extra={**row.extra, "split": found.split},
            )
        rows.append(row)
    return labels.but(
        left_out=left_out,
        over_cap=max(0, len(weak) - cap),
        trained=len(weak[:cap]),
        mean_agreement=mean_agreement,
        tasks=tuple(rows),
    )


# ---- labels waiting for a real reference ---------------------------------------------------

WEAK_FILE = "weak_labels.jsonl"
MAX_WAITING = 500


@dataclass(frozen=True, kw_only=True)
class WaitingLabel(Record):
    """A weak label waiting for a real reference (a line of the project's weak-label file):
    the task, the answer the samples agreed on, how many agreed of `k`, its night, and the
    rows it came from (a forget drops it by them)."""

    id: str = ""
    prompt: str = ""
    answer: JsonValue = None  # the reference the samples agreed on, as the file holds it
    agreement: float | None = None
    k: int | None = None
    night: str = ""
    sources: tuple[str, ...] = ()


class WeakLabelsError(RunError):
    """The project's weak-label file cannot be read (a malformed line, named)."""


def weak_labels_path(project: str, home: Path | None = None) -> Path:
    return project_dir(project, home) / WEAK_FILE


def load_waiting(project: str, home: Path | None = None) -> list[WaitingLabel]:
    """Past nights' weak labels no real reference has scored yet (newest first)."""
    path = weak_labels_path(project, home)
    if not path.is_file():
        return []
    rows = [row for _, row in iter_jsonl(path, WeakLabelsError)]
    return [
        WaitingLabel.from_dict(r)
        for r in rows
        if isinstance(r.get("prompt"), str) and r.get("answer") is not None
    ]


def verify_waiting(
    waiting: list[WaitingLabel],
    checked: list[MinedTask],
    threshold: float,
    labels: WeakRecord,
) -> tuple[list[WaitingLabel], WeakRecord]:
    """Score each waiting label against a checked task that asks the same (its real reference
    arrived since): those still waiting, and `labels` with the scores."""
    left = []
    later: Counter[str] = Counter(_UNSCORED)
    for row in waiting:
        twin = _twin(str(row.id or None), row.prompt, checked, threshold)
        right = None if twin is None else _right(str(row.answer), twin)
        if right is None:
            left.append(row)
        else:
            later["right" if right else "wrong"] += 1
    scored = labels.but(verified_later=dict(later), accuracy=_accuracy(labels.verified, later))
    return left, scored


def still_waiting(
    left: list[WaitingLabel], labelled: list[MinedTask], night_id: str
) -> list[WaitingLabel]:
    """What the weak-label file holds after tonight: tonight's labels, then those still
    waiting, at most `MAX_WAITING` (the oldest dropped)."""
    rows = [
        WaitingLabel(
            id=t.id,
            prompt=t.prompt,
            answer=t.reference,
            agreement=_weak_label(t).agreement,
            k=_weak_label(t).k,
            night=night_id,
            sources=tuple(t.sources),  # the rows it came from: a forget drops it
        )
        for t in labelled
    ]
    ids = {r.id for r in rows}
    rows += [r for r in left if r.id not in ids]
    return rows[:MAX_WAITING]


def remember_waiting(project: str, home: Path | None, rows: list[WaitingLabel]) -> None:
    """Write the weak-label file (after a night that used its interactions)."""
    write_jsonl(weak_labels_path(project, home), [r.to_dict() for r in rows])


def weak_lines(d: WeakRecord | None) -> list[str]:
    """report.md's lines for the `weak` section."""
    if not given(d):
        return []
    agreement = "-" if d.mean_agreement is None else f"{d.mean_agreement:.0%}"
    v, later = d.verified, d.verified_later
    n_right = v.get("right", 0) + later.get("right", 0)
    checked = n_right + v.get("wrong", 0) + later.get("wrong", 0)
    right = f"{n_right} of {checked} right" if checked else "none to compare yet"
    lines = [
        f"- weak labels (k {d.k}, agree {d.agree:.0%}): {d.candidates} unchecked "
        f"requests, {d.sampled} sampled, {d.labelled} agreed (mean {agreement}), "
        f"{d.disagreed} disagreed, {d.no_answer} gave no short answer, {d.refuted} "
        f"refuted by the user; {d.trained} in train ({d.left_out} left out as "
        f"near-duplicates of val/test, {d.over_cap} over the share); against a real "
        f"reference (tonight's, or one that came since a past night): {right}; "
        f"{d.waiting} waiting for one"
    ]
    return lines + [f"  - {n}" for n in d.notes] + use_lines(d.shipped)
