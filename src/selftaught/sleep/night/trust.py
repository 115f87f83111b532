"""One trust order for labels: where two labels for one question meet, the more trusted wins.

A label is what says which reply is right: a reference (logged with the row, or a correction
given after the fact), a verdict (a thumb, a score) and the rules a comment states. Its trust is
whose word it is, in this order:

- `OPERATOR`: the operator's (the CLI, the Python API, feedback sent with the proxy's feedback
  key) and the words of a client the operator declared theirs (`proxy --trusted-clients`, a
  file imported with `sleep import --trust-fields`, the operator's own harvested transcripts);
- `END_USER`: an app's end user (a proxy client, a row naming none) and whatever a file
  imported without `--trust-fields` says, its references included (`logged_trust`);
- `MODEL`: what the night made up itself: a weak label its samples agreed on (`weak.py`), a
  dreamt variant (`dream.py`).

Wherever two labels for one question meet, the more trusted one is kept and the other set
aside; at equal trust the newest is kept. That is a row's logged reference against its
correction (`row_reference`), near-duplicates merged in one night (`mine.merge_near_duplicates`),
a recalled task mined again (`recall.combine`, and so the recall pool written back), a weak
label or a dream asking what a checked task asks (never kept beside it). And an end user's
label checks its task but is never a demonstration: the task is marked `no_demo` (no demo,
adapter sample, teacher prompt or grounding example carries it or a reply that passed it).

A mined task records its label's trust in `state["trust"]` (`TRUST_KEY`); a task with no label
(a rubric or rules from its request alone) has none and ranks below every label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

from selftaught.sleep.intake.log import IMPORTED_CLIENT, Feedback, Interaction
from selftaught.sleep.records import TaskChecks


class LabelledTask(Protocol):
    """What the trust order reads of a task (`mine.MinedTask`; a protocol, so that this module
    stays below `mine`, which applies it)."""

    @property
    def reference(self) -> Any: ...
    @property
    def state(self) -> TaskChecks: ...
    @property
    def clients(self) -> Sequence[str]: ...


class Trust(IntEnum):
    """Whose word a label is, least trusted first (module doc)."""

    MODEL = 0
    END_USER = 1
    OPERATOR = 2

    @property
    def label(self) -> str:
        """The name `state["trust"]` and tasks.jsonl hold."""
        return self.name.lower()

    @property
    def whose(self) -> str:
        """In words, for a note: "the operator's", "an end user's", "the model's"."""
        return {"OPERATOR": "the operator's", "END_USER": "an end user's"}.get(
            self.name, "the model's"
        )


TRUST_KEY = "trust"
"""A mined task's `state` key: its label's trust (`Trust.label`); absent for no label."""
VERDICT_FIELDS = ("thumb", "score", "comment")


@dataclass(frozen=True)
class Label:
    """A reference and whose word it is; `corrected`: given after the fact (feedback), not
    logged with the row; `approved`: the answer of a reply the user accepted
    (`mine.row_label`)."""

    value: Any
    trust: Trust
    corrected: bool = False
    approved: bool = False


def field_trust(fb: Feedback, name: str) -> Trust:
    """The trust of feedback field `name`'s value (`Feedback.trusted_for`)."""
    return Trust.OPERATOR if fb.trusted_for(name) else Trust.END_USER


def logged_trust(it: Interaction) -> Trust:
    """The trust of the reference `it` was logged with: an end user's for a row of a file
    imported without `--trust-fields` (its client is `import:<file>`, set by the import), the
    operator's for every other (the Python API, an import the operator vouched for)."""
    return Trust.END_USER if (it.client or "").startswith(IMPORTED_CLIENT) else Trust.OPERATOR


def row_reference(it: Interaction) -> Label | None:
    """The reference `it` is checked by: its correction, unless that is less trusted than the
    reference the row was logged with (then the logged one); None without either."""
    fb = it.feedback
    logged = None if it.reference is None else Label(it.reference, logged_trust(it))
    if fb.reference is None:
        return logged
    corrected = Label(fb.reference, field_trust(fb, "reference"), corrected=True)
    return logged if logged is not None and logged.trust > corrected.trust else corrected


def verdict_trust(fb: Feedback) -> Trust | None:
    """The trust of the verdict fields set (the least trusted of them); None with none set."""
    given = [n for n in VERDICT_FIELDS if getattr(fb, n) not in (None, "")]
    return min((field_trust(fb, n) for n in given), default=None)


def label_trust(task: LabelledTask) -> Trust | None:
    """The trust of `task`'s label (None: it has none). A task stored before labels recorded
    their trust (an older recall pool) is read by what it holds: a weak or dreamt label is the
    model's, a `no_demo` task or a reference an untrusted import gave an end user's, any other
    reference the operator's."""
    name = task.state.trust
    if isinstance(name, str) and name.upper() in Trust.__members__:
        return Trust[name.upper()]
    if task.state.weak is not None or task.state.synthetic is not None:
        return Trust.MODEL
    if task.state.no_demo:
        return Trust.END_USER
    if task.reference is None:
        return None
    imported = any(c.startswith(IMPORTED_CLIENT) for c in task.clients)
    if imported and task.state.demo_source != "correction":
        return Trust.END_USER
    return Trust.OPERATOR


def rank(task: LabelledTask) -> int:
    """`label_trust` as a number to sort by: a task with no label below every label."""
    trust = label_trust(task)
    return -1 if trust is None else int(trust)


def outranks(a: LabelledTask, b: LabelledTask) -> bool:
    """Whether `a`'s label is more trusted than `b`'s (equal: it is not)."""
    return rank(a) > rank(b)
