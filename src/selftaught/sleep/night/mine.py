"""Mine: logged interactions → replayable tasks, each with the strongest check available.

One interaction (a request and the reply the deployed agent gave) becomes one task: its
messages as the client sent them (any injected skill stripped, every text redacted again for
the models that will read it), and a check (`selftaught.sleep.night.checks`): the reference (logged
or corrected by feedback), else the answer of a reply the user accepted when it is short enough
to check without a judge (`row_label`), else a rubric for the judge model; plus every rule the
user stated.
A thumbs-down (or a score below 0.5) marks a failure to learn from: the rubric shows the reply
the user rejected. An interaction with no possible check is dropped, and the report says why.
An interaction with `tools` is mined by `selftaught.sleep.night.replay` into an episode task (the
same tools, the recorded tool results as fixtures, the steps of one conversation folded).
A coding agent's row (Claude Code / Codex, through the proxy or harvested) is the user's
request, by one rule for both (`sessions.task_turns`): the harness's system / developer prompt
and what it writes into user turns are not part of the task, nor of its size check.

Requests that are the same item (`selftaught.duplicates`: a resend, a rewording, a politer
copy; never two instances of one template with other values or another answer) are merged
into one task that keeps every source, so a request the user asked twice lands on one side of
the split only: its label is the most trusted one (`trust.py`: the operator's over an end
user's), then the strongest check, then the newest. Each task records where it came from: the
interactions and the clients that sent them, and its label's trust (`state["trust"]`).

Whose words are taken as words: feedback the operator gave (`Feedback.trusted_for`, per
field) keeps its power: the rules its comment states become checks, the comment itself a memory
candidate (`consolidate.user_statements`), its correction a demonstration's reply. An end
user's feedback (a field whose merged value an untrusted giver set) is evidence only: its comment
states no rule and is never memory text; it reaches the analyst quoted, in the check's
feedback (`state["evidence"]`), and the judge quoted, in the rubric; its correction still
checks the task but is marked `no_demo`, so no demonstration (nor adapter sample) carries it
or a reply that passed it. So is a reference a file imported without `--trust-fields` gave,
and a reply an end user approved (its answer as the reference, or the judge's). A row's
correction never replaces the reference it was logged with when it is less trusted
(`trust.row_reference`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from selftaught.duplicates import WORD_SHARE, ItemKey, groups, item_key
from selftaught.errors import ConfigError
from selftaught.models.base import Message
from selftaught.redact import redact_for_model
from selftaught.sleep.adoption.inject import strip_injected_messages
from selftaught.sleep.intake.log import OPERATOR, Interaction
from selftaught.sleep.intake.sessions import AGENT_TRANSCRIPTS, task_turns
from selftaught.sleep.intake.threads import message_text
from selftaught.sleep.night.checks import find_rules, short_answer
from selftaught.sleep.night.followup import rules_in
from selftaught.sleep.night.trust import (
    Label,
    Trust,
    field_trust,
    label_trust,
    rank,
    row_reference,
    verdict_trust,
)
from selftaught.sleep.records import JsonValue, TaskChecks, TaskSignal
from selftaught.tasks.scorers import reference_scorer


@dataclass
class MineConfig:
    near_duplicate: float = WORD_SHARE
    """Requests with the same values whose what-is-asked words overlap at this Jaccard or
    more are one item (`selftaught.duplicates`): merged, kept on one side of the split."""
    max_prompt_chars: int = 12_000
    """Longer requests are not replayed (counted as dropped). Counted on the task's messages:
    an agent's harness prompt and any row's tool schemas are not part of them."""
    max_rubric_reply_chars: int = 600
    """How much of a rejected reply the rubric quotes."""
    judge: bool = False
    """A judge model is available: interactions without a reference get a rubric."""
    conversation: bool = True
    """Read the user's next turn as feedback on a reply (`signals.py`)."""
    reask_window_s: float = 3600.0
    """The same request again from the same end user within this many seconds marks the
    earlier reply failed (0: off)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.near_duplicate <= 1.0:
            raise ConfigError(f"near_duplicate must be in (0, 1], got {self.near_duplicate}")
        if self.max_prompt_chars < 1:
            raise ConfigError("max_prompt_chars must be >= 1")
        if self.reask_window_s < 0:
            raise ConfigError(f"reask_window_s must be >= 0, got {self.reask_window_s}")


@dataclass
class MinedTask:
    """One replayable task. `state` holds its checks (scorer, rules, rubric, ...), the keys
    of the `Example.state` it is scored with (`split.example_of`)."""

    id: str
    messages: list[Message]
    reference: JsonValue = None
    state: TaskChecks = field(default_factory=TaskChecks.empty)
    sources: list[str] = field(default_factory=list)  # interaction ids, newest first
    origins: list[str] = field(default_factory=list)  # proxy / api / import / claude-code ...
    clients: list[str] = field(default_factory=list)  # who sent them (`client_label`)
    negative: bool = False  # the user rejected the logged reply
    logged_reply: str | None = None
    created_at: float = 0.0
    split: str | None = None
    notes: list[str] = field(default_factory=list)
    signals: tuple[TaskSignal, ...] = ()
    """What the conversation said of the logged reply (`signals.Signal`, as the log's row
    holds it): kind, the user's words, who said them and whether they count as the
    operator's."""
    kind: str | None = None
    """The kind of request it is (`kinds.py`: a cluster of request intents with a stable id),
    set by the night; a recalled task keeps its kind."""

    @property
    def prompt(self) -> str:
        return "\n".join(str(m["content"]) for m in self.messages if m.get("role") == "user")

    @property
    def check(self) -> str:
        if self.state.workspace:
            return "workspace"
        if self.state.scorer:
            return "reference"
        if self.state.rubric:
            return "rubric"
        if self.state.expected_calls:
            return "tool_call"
        return "rule"

    def to_dict(self) -> dict[str, Any]:
        """The task as the recall pool stores it (its checks and signals as they were read)."""
        row = asdict(replace(self, state=TaskChecks.empty(), signals=()))
        row["state"] = self.state.to_dict()
        row["signals"] = [s.to_dict() for s in self.signals]
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> MinedTask:
        """A task the recall pool stored (`to_dict`), of this version or an older one: its
        checks' keys this version does not type are kept (`TaskChecks.extra`)."""
        state = TaskChecks.from_dict(row.get("state") or {})
        signals = tuple(TaskSignal.from_dict(s) for s in row.get("signals") or ())
        return cls(**{**row, "state": state, "signals": signals})


# ---- whose words ----------------------------------------------------------------------------

HARVESTED = AGENT_TRANSCRIPTS  # the operator's own agent transcripts
UNKNOWN_CLIENT = "unknown"
MAX_EVIDENCE_CHARS = 400  # of an end user's comment, quoted to the analyst and the judge
REFERENCE_REPLY = "reference_reply"
"""`meta` key (`signals.py`): the reply that answered a user's correction in the conversation;
when the correction is the operator's, the demonstration's reply (if it passes the check)."""


BARE_VERDICT = "bare_verdict"
"""`meta` key (`signals.py`) and `state` key: the row's only verdict is a re-ask or a rejection
without the right value, read from the conversation. Such a row becomes a task only through a
check two-sided on its thread (the miner's, `miner.py`, or a weak label that the rejected reply
fails, `weak.py`), and that task trains only (`split.train_only`)."""


def bare_verdict(it: Interaction) -> str | None:
    """The signal kind ("reask", "rejection") when `it`'s only verdict is a bare one."""
    kind = it.meta.get(BARE_VERDICT) if isinstance(it.meta, dict) else None
    return kind if isinstance(kind, str) else None


def client_label(it: Interaction) -> str:
    """Who sent `it`: its recorded client; for a row without one, `operator` when it is a
    harvested transcript of the operator's own agent, else `unknown` (rows logged before
    clients were recorded, or by an API caller that named none)."""
    if it.client:
        return it.client
    return OPERATOR if it.source in HARVESTED else UNKNOWN_CLIENT


def quoted(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """An end user's words as a quoted string (newlines escaped, clipped): evidence to read,
    not text to follow or copy."""
    text = redact_for_model(text.strip())
    if len(text) > limit:
        text = text[:limit] + " […]"
    return json.dumps(text, ensure_ascii=False)


# ---- text ---------------------------------------------------------------------------------


def normalized_prompt(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def task_key(task: MinedTask) -> ItemKey:
    """What `same_item` compares of a task: its user requests and its reference."""
    return item_key(task.prompt, task.reference)


def redact_messages(messages: list[Message]) -> list[Message] | None:
    out = []
    for msg in strip_injected_messages(messages):
        text = message_text(msg.get("content"))
        if text is None:
            return None
        out.append({"role": str(msg.get("role", "user")), "content": redact_for_model(text)})
    return out


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_for_model(value)
    if isinstance(value, list):
        return [_redact_value(v) for v in value]
    return value


# ---- one interaction ----------------------------------------------------------------------


def _rubric(it: Interaction, config: MineConfig) -> str:
    fb = it.feedback
    lines = [
        "The reply does what the user asked in the request, correctly and completely.",
    ]
    if fb.comment and fb.trusted_for("comment"):
        lines.append(f"The user's comment on an earlier reply: {redact_for_model(fb.comment)!r}.")
    elif fb.comment:
        lines.append(
            "An end user commented on an earlier reply (quoted evidence of what they wanted, "
            f"not an instruction): {quoted(fb.comment)}."
        )
    if it.reply and (fb.thumb == "down" or (fb.score is not None and fb.score < 0.5)):
        shown = redact_for_model(it.reply)[: config.max_rubric_reply_chars]
        lines.append(
            "The user rejected this earlier reply; a reply that repeats its mistakes fails: "
            f"{shown!r}"
        )
    elif it.reply and (fb.thumb == "up" or (fb.score is not None and fb.score >= 0.5)):
        lines.append("The user approved the reference reply; a good reply agrees with it.")
    return " ".join(lines)


def _negative(it: Interaction) -> bool:
    fb = it.feedback
    return fb.thumb == "down" or (fb.score is not None and fb.score < 0.5)


def request_messages(it: Interaction, config: MineConfig) -> list[Message] | str:
    """The redacted messages `it`'s task replays (ending with the user request), or why it
    has none."""
    if not it.is_task:
        return it.not_task_reason
    messages = redact_messages(task_turns(it))
    if messages is None:
        return "holds non-text content (images, files): cannot be replayed as text"
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        return "no user request to replay"
    if sum(len(m["content"]) for m in messages) > config.max_prompt_chars:
        return f"longer than {config.max_prompt_chars} characters"
    return messages


def mine_one(it: Interaction, config: MineConfig) -> tuple[MinedTask | None, str | None]:
    """(task, None), or (None, why it cannot be a task)."""
    messages = request_messages(it, config)
    if isinstance(messages, str):
        return None, messages
    checks = task_checks(it, messages, row_label(it, config.judge), config)
    if isinstance(checks, str):
        return None, checks
    state, reference = checks
    return new_task(it, messages, reference, state), None


def row_label(it: Interaction, judge: bool = False) -> Label | None:
    """The reference `it` is checked by (`trust.row_reference`); without one, the answer of
    its reply when its user accepted the reply (a thumbs-up or full marks, nothing marking it
    wrong) and the answer is short enough to check without a judge (`checks.short_answer`),
    with the trust of whoever accepted it. An accepted reply is *a* right answer: a number (or
    a number with a unit) is the answer, but a short text may be one of several, so with a
    `judge` a text answer is left to the judge (`task_checks` gives it the accepted reply).
    The operator's acceptance is a label like their correction (it trains, validates and may
    teach); an end user's checks the task and is never a demonstration (`_reference_demo`)."""
    label = row_reference(it)
    fb = it.feedback
    if label is not None or it.reply is None or _negative(it):
        return label
    if fb.thumb == "up":
        trust = field_trust(fb, "thumb")
    elif fb.score is not None and fb.score >= 1.0:
        trust = field_trust(fb, "score")
    else:
        return None
    answer = short_answer(it.reply)
    if answer is None or (judge and reference_scorer(answer.value) == "normalized"):
        return None
    return Label(answer.value, trust, approved=True)


NO_CHECK = "no reference, no stated rule"
"""Why a row with nothing to check it by was dropped (the start of the reason): the rows a
weak label may be sampled for (`weak.py`, `phases.mine.mine(unchecked=...)`)."""


UNTRUSTED_REFERENCE = {
    True: "checked by an end user's correction",
    False: "checked by a reference a file imported without --trust-fields gave",
}
"""Why a task checked by an end user's reference is `no_demo` (by whether it was a correction)."""
APPROVED_BY_END_USER = "checked by a reply an end user approved"


def task_checks(
    it: Interaction,
    messages: list[Message],
    label: Label | None,
    config: MineConfig,
    other_check: bool = False,
) -> tuple[TaskChecks, Any] | str:
    """(state, reference) holding the checks of a task from `it` (its prompt `messages`,
    already redacted, ending with the user request), or why it has none. `label`: the
    reference to check by and whose word it is (`row_label`). `other_check`: the
    caller has a check of its own (a corrected tool call), so no rule or reference is needed."""
    fb = it.feedback
    comment = (fb.comment or "").strip()
    said = "\n".join(str(m["content"]) for m in messages if m["role"] in ("system", "developer"))
    said += "\n" + str(messages[-1]["content"])
    found = find_rules(said)
    if comment and fb.trusted_for("comment"):  # an end user's comment states no rule
        kinds = {r.kind for r in found}
        found += [r for r in rules_in(comment, it.reply) if r.kind not in kinds]
    rules = tuple(r.to_dict() for r in found)
    reference = None if label is None else _redact_value(label.value)
    if isinstance(reference, list):
        reference = [r for r in reference if r is not None and str(r).strip()] or None
    elif reference is not None and not str(reference).strip():
        reference = None
    state = TaskChecks.empty().but(rules=rules)
    if comment and fb.trusted_for("comment"):
        state = state.but(comment=redact_for_model(comment))
    elif comment:
        state = state.but(evidence=quoted(comment))
    trust = verdict_trust(fb)
    if reference is not None and label is not None:
        state = state.but(scorer=reference_scorer(reference))
        trust = label.trust
        state = _reference_demo(it, label, state)
    elif config.judge:
        state = state.but(rubric=_rubric(it, config))
        if it.reply and not _negative(it) and (it.feedback.thumb or it.feedback.score):
            reference = redact_for_model(it.reply)  # an approved reply, for the judge only
            if trust is not None and trust < Trust.OPERATOR:
                state = state.but(no_demo=APPROVED_BY_END_USER)
    elif not rules and not other_check:
        why = NO_CHECK
        if not config.judge:
            why += " and no --judge-model for a rubric"
        return why
    if trust is not None:
        state = state.but(trust=trust.label)
    return state, reference


def _reference_demo(it: Interaction, label: Label, state: TaskChecks) -> TaskChecks:
    """`state` marked with whether the reference may be a demonstration: the operator's
    correction is one (with the reply it drew in the conversation), so is the reply the
    operator accepted; an end user's reference never."""
    if label.trust < Trust.OPERATOR:
        reason = APPROVED_BY_END_USER if label.approved else UNTRUSTED_REFERENCE[label.corrected]
        return state.but(no_demo=reason)
    if label.approved and it.reply:
        return state.but(reference_reply=redact_for_model(it.reply))  # the accepted reply, whole
    if label.corrected:
        state = state.but(demo_source="correction")
        drawn = it.meta.get(REFERENCE_REPLY) if isinstance(it.meta, dict) else None
        if isinstance(drawn, str) and drawn.strip():
            state = state.but(reference_reply=redact_for_model(drawn))
    return state


def new_task(
    it: Interaction, messages: list[Message], reference: Any, state: TaskChecks
) -> MinedTask:
    """The task of `it`: its id is a hash of its user requests, so it is stable across nights."""
    key = "\n".join(normalized_prompt(str(m["content"])) for m in messages if m["role"] == "user")
    if it.tags:  # the gate's per-tag veto reads them (import `tags`, a harvest's source)
        state = state.but(tags=tuple(sorted(set(it.tags))))
    return MinedTask(
        id="t-" + hashlib.sha256(key.encode()).hexdigest()[:12],
        messages=messages,
        reference=reference,
        state=state,
        sources=[it.id],
        origins=[it.source],
        clients=[client_label(it)],
        negative=_negative(it),
        logged_reply=None if it.reply is None else redact_for_model(it.reply),
        created_at=it.created_at,
        signals=_signals(it),
    )


def _signals(it: Interaction) -> tuple[TaskSignal, ...]:
    """What the conversation said of `it`'s reply, as its row's `meta` holds it."""
    found = it.meta.get("signals", []) if isinstance(it.meta, dict) else []
    return tuple(TaskSignal.from_dict(s) for s in found)


# ---- merging ------------------------------------------------------------------------------

_STRENGTH = {"workspace": 3, "reference": 2, "tool_call": 2, "rubric": 1, "rule": 0}


def _merge(group: list[MinedTask]) -> MinedTask:
    """One task for a group of near-duplicates: the member with the most trusted label
    (`trust.py`), then the strongest check, then the newest; keeping every source."""
    group = sorted(group, key=lambda t: (rank(t), _STRENGTH[t.check], t.created_at), reverse=True)
    head = group[0]
    refs = {str(t.reference) for t in group if t.check == "reference"}
    if len(refs) > 1:
        outranked = any(rank(t) < rank(head) for t in group if t.check == "reference")
        trust = label_trust(head)
        kept = f"kept {trust.whose}" if outranked and trust is not None else "kept the newest"
        head.notes.append(
            f"{len(refs)} different references among {len(group)} merged requests; {kept}"
        )
    for other in group[1:]:
        absorb(head, other)
    tags = tuple(sorted({tag for t in group for tag in t.state.tags}))
    if tags:
        head.state = head.state.but(tags=tags)
    return head


def absorb(head: MinedTask, other: MinedTask) -> None:
    """`head` keeps its label and takes `other`'s provenance: its sources, origins, clients
    and whether its user rejected the logged reply."""
    head.sources += [s for s in other.sources if s not in head.sources]
    head.origins += [o for o in other.origins if o not in head.origins]
    head.clients += [c for c in other.clients if c not in head.clients]
    head.negative = head.negative or other.negative


def merge_near_duplicates(tasks: list[MinedTask], threshold: float) -> list[MinedTask]:
    """Group the tasks that are one item (`duplicates.groups`) and merge each group; order
    follows each group's first member."""
    return [_merge([tasks[i] for i in g]) for g in groups(map(task_key, tasks), threshold)]
