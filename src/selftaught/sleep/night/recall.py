"""Recall: a capped pool of past nights' tasks, so a quiet night still has enough to gate on.

    <home>/projects/<project>/recall.jsonl   one mined task a line, its split fixed, newest first

A night adds tonight's tasks (after mining, already redacted) to the tasks it recalls, then
splits them. A task's split is fixed the first time it is split and never changes: a recalled
task keeps it; a task mined again tonight (same id, or the same item as a recalled one,
`selftaught.duplicates`) takes the recalled task's split and replaces it, unless the recalled
task's label is the more trusted (`trust.py`: the operator's reference against tonight's end
user's correction): then the recalled question and label are kept, in the night and in the
pool, with tonight's rows added to its sources (`keep_recalled`); a task whose request an
adopted demonstration was made from is pinned to train (a deployed demo is never validated on).
After a night that used its interactions, the pool is written back (atomically), newest
first, capped at `recall_max` tasks shared fairly among kinds of request (`kinds.py`): the kinds
take a task each in turn, each its newest first, so a heavy kind cannot crowd a rare one out
and a kind that went quiet keeps its tasks, with their splits, until the others need its share;
the oldest of the kinds over their share are dropped. A task asked again keeps its kind as well
as its split. A weak-labelled or synthetic task (`split.train_only`) is never written to it.

Privacy: a task mined from a private (harvested, unreviewed) interaction is stored marked
so; a night whose models are remote recalls it only where private rows may go there.

Trust: a task stored before tasks recorded their clients was mined when every feedback comment
counted as the operator's; recalled, its comment is only evidence and the rules found in the
comment alone are dropped (`distrust_legacy`), as an end user's would be now (`mine.py`). A
task stored before tasks recorded their label's trust is read by `trust.label_trust`; one whose
label that finds an end user's (a reference an untrusted import gave) is made `no_demo`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from selftaught.demos import Demo, LeakCheck
from selftaught.duplicates import DuplicateIndex
from selftaught.errors import InputError
from selftaught.runs import RunError, iter_jsonl, write_jsonl
from selftaught.sleep.night.mine import (
    UNTRUSTED_REFERENCE,
    MinedTask,
    absorb,
    quoted,
    task_key,
)
from selftaught.sleep.night.split import train_only
from selftaught.sleep.night.trust import TRUST_KEY, Trust, label_trust, outranks
from selftaught.sleep.paths import project_dir
from selftaught.sleep.records import RecallRecord

RECALL_FILE = "recall.jsonl"


class RecallError(RunError):
    """The recall pool cannot be read (a malformed line, named)."""


def recall_path(project: str, home: Path | None = None) -> Path:
    return project_dir(project, home) / RECALL_FILE


@dataclass
class Recalled:
    """A past task and where it came from."""

    task: MinedTask
    night: str
    private: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"night": self.night, "private": self.private, "task": self.task.to_dict()}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Recalled:
        task = MinedTask.from_dict(row["task"])
        if task.split not in ("train", "val", "test"):
            raise InputError(f"task {task.id} has no split")
        if not task.clients:
            distrust_legacy(task)
        if not task.state.has(TRUST_KEY):  # stored before labels recorded their trust
            trust = label_trust(task)
            if trust is not None:
                task.state = task.state.but(trust=trust.label)
            if trust == Trust.END_USER and not task.state.has("no_demo"):
                task.state = task.state.but(no_demo=UNTRUSTED_REFERENCE[False])
        return cls(task, str(row.get("night") or ""), bool(row.get("private")))


def distrust_legacy(task: MinedTask) -> None:
    """A task mined before feedback trust was read: its comment becomes evidence, and the
    rules that only the comment states are dropped (module doc)."""
    comment = task.state.comment
    task.state = task.state.without("comment")
    if not comment:
        return
    said = "\n".join(str(m.get("content", "")) for m in task.messages)
    rules = tuple(r for r in task.state.rules if str(r.get("said")) in said)
    task.state = task.state.but(evidence=quoted(str(comment)), rules=rules)


def load(project: str, home: Path | None = None) -> list[Recalled]:
    """The project's recall pool (empty before its first night)."""
    path = recall_path(project, home)
    if not path.is_file():
        return []
    out = []
    for lineno, row in iter_jsonl(path, RecallError):
        try:
            out.append(Recalled.from_dict(row))
        except (KeyError, TypeError, ValueError) as err:
            raise RecallError(
                f"{path}:{lineno}: not a recalled task ({err}); delete the line or the file "
                "to start the pool again"
            ) from err
    return out


def combine(
    tonight: list[MinedTask],
    pool: Sequence[Recalled],
    *,
    threshold: float,
    private_ok: bool,
    pinned: Sequence[Demo] = (),
) -> tuple[list[MinedTask], RecallRecord, list[Recalled]]:
    """(tonight's tasks, their splits fixed where the pool or an adopted demo says, followed
    by the pool's other tasks with their fixed splits; the night's `recall`, its `max` left
    to the caller; the pool's records that tonight did not replace, for `remember`)."""
    left = list(pool)
    by_id = {r.task.id: r for r in left}
    index: DuplicateIndex[Recalled] = DuplicateIndex(threshold)
    for r in left:
        index.add(task_key(r.task), r)
    mined_again = pinned_train = withheld_private = 0
    for task in tonight:
        hit = by_id.pop(task.id, None) or index.find(task_key(task))
        if hit is not None:
            task.split = hit.task.split
            task.kind = hit.task.kind
            left.remove(hit)
            by_id.pop(hit.task.id, None)
            index.remove(hit)
            mined_again += 1
            if outranks(hit.task, task):
                keep_recalled(task, hit.task)
    demo_ids = {d.id for d in pinned}
    check = LeakCheck(("demo", d.id, d.input_text()) for d in pinned)
    for task in tonight:
        if task.split is None and (task.id in demo_ids or check.find(_as_demo(task))):
            task.split = "train"
            pinned_train += 1
    recalled = []
    by_split: dict[str, int] = {}  # split -> recalled tasks used
    for r in left:
        if r.private and not private_ok:
            withheld_private += 1
            continue
        recalled.append(r.task)
        by_split[str(r.task.split)] = by_split.get(str(r.task.split), 0) + 1
    record = RecallRecord(
        pool=len(pool),
        recalled=by_split,
        mined_again=mined_again,  # tonight's tasks that were in the pool (kept its split)
        pinned_train=pinned_train,  # tonight's tasks an adopted demo came from: pinned to train
        withheld_private=withheld_private,  # private pool tasks kept from a remote model
    )
    return [*tonight, *recalled], record, left


ASKED_AGAIN = "asked again"


def keep_recalled(task: MinedTask, recalled: MinedTask) -> None:
    """Tonight's `task` becomes the `recalled` task, whose label outranks its own: the recalled
    question, label and checks, with tonight's rows added to its provenance (the task the
    night uses and the pool keeps)."""
    tonight = copy.deepcopy(task)
    whose = label_trust(recalled)
    for f in fields(MinedTask):
        setattr(task, f.name, copy.deepcopy(getattr(recalled, f.name)))
    absorb(task, tonight)
    task.created_at = max(task.created_at, tonight.created_at)  # asked again tonight
    if whose is not None:  # one such note, the last night's (a pool task may be asked nightly)
        task.notes = [n for n in task.notes if not n.startswith(ASKED_AGAIN)]
        task.notes.append(
            f"{ASKED_AGAIN} ({', '.join(tonight.sources)}); kept {whose.whose} label "
            "recalled over tonight's less trusted one"
        )


def _as_demo(task: MinedTask) -> Demo:
    return Demo(task.id, task.prompt, "")


def remember(
    project: str,
    home: Path | None,
    night_id: str,
    tonight: Sequence[MinedTask],
    rest: Sequence[Recalled],
    private_ids: set[str],
    recall_max: int,
) -> int:
    """Write the pool back: tonight's split tasks and the pool's records tonight did not
    replace (`combine`'s third value), newest first, at most `recall_max` shared among kinds
    (`by_kind`). Returns its size."""
    rows = [
        Recalled(t, night_id, any(s in private_ids for s in t.sources))
        for t in tonight
        if t.split is not None and not train_only(t)  # a weak label or a dream: never kept
    ]
    rows += [r for r in rest if r.task.split is not None]  # a split drops a duplicate
    rows = by_kind(rows, recall_max)
    write_jsonl(recall_path(project, home), [r.to_dict() for r in rows])
    return len(rows)


def by_kind(rows: Sequence[Recalled], cap: int) -> list[Recalled]:
    """At most `cap` of `rows`, newest first: the kinds (tasks of no kind: one more) take one
    task each in turn, each its newest first, the kind with the newest task first; a kind with
    fewer tasks than its share leaves the rest to the others."""
    newest = sorted(rows, key=lambda r: r.task.created_at, reverse=True)
    kinds: dict[str | None, list[Recalled]] = {}
    for row in newest:
        kinds.setdefault(row.task.kind, []).append(row)
    kept: list[Recalled] = []
    depth = 0
    while len(kept) < cap and any(depth < len(g) for g in kinds.values()):
        kept += [g[depth] for g in kinds.values() if depth < len(g)][: cap - len(kept)]
        depth += 1
    return sorted(kept, key=lambda r: r.task.created_at, reverse=True)
