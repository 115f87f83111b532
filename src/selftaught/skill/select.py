"""Select: rank the merged edits and keep at most the step's edit budget. Pure.

Ranking (best first): edits proposed by more reflected patches (`support`), then
failure-driven before success-driven (failures carry the signal the skill lacks), then the
analyst's own order. Edits already rejected by the gate are dropped, so a proposal the val
split refused is not tried again, and duplicates collapse into one with their support summed.
An edit whose operation the run does not allow (`SkillOptConfig.edit_ops`, e.g. append only:
a playbook that only grows) is dropped, saying so."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from selftaught.skill.document import EDIT_OPS, Edit

_SOURCE_RANK = {"user": 0, "failure": 0, "contrast": 0, "merge": 0, "success": 1}


def dedupe_edits(edits: Iterable[Edit]) -> list[Edit]:
    """Collapse edits with the same (op, target, content), summing their support; keeps the
    first occurrence's position."""
    out: dict[tuple[str, str, str], Edit] = {}
    for e in edits:
        k = e.key()
        if k in out:
            out[k] = replace(out[k], support=out[k].support + e.support)
        else:
            out[k] = replace(e)
    return list(out.values())


def rank_edits(edits: list[Edit]) -> list[Edit]:
    order = {id(e): i for i, e in enumerate(edits)}
    return sorted(edits, key=lambda e: (-e.support, _SOURCE_RANK.get(e.source, 1), order[id(e)]))


@dataclass
class Selection:
    kept: list[Edit] = field(default_factory=list)
    dropped: list[tuple[Edit, str]] = field(default_factory=list)  # (edit, why)


def select_edits(
    edits: list[Edit],
    budget: int,
    rejected: Iterable[Edit] = (),
    ops: Iterable[str] = EDIT_OPS,
) -> Selection:
    """Keep at most `budget` edits of the allowed `ops`, best-ranked first; say why each other
    edit was dropped."""
    banned = {e.key() for e in rejected}
    allowed = tuple(ops)
    sel = Selection()
    for e in rank_edits(dedupe_edits(edits)):
        if e.op not in allowed:
            sel.dropped.append((e, f"{e.op} is not allowed (edit_ops: {', '.join(allowed)})"))
        elif e.key() in banned:
            sel.dropped.append((e, "rejected by the gate before"))
        elif len(sel.kept) >= budget:
            sel.dropped.append((e, f"over the edit budget ({budget})"))
        else:
            sel.kept.append(e)
    return sel
