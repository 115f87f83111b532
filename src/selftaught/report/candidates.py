"""What an optimize run tried at each step and which worked examples it shipped, read from
history.jsonl (`candidates`, `demos`), best_skill.md and demo_pool.json.

A step proposes several candidates (new rules, a demo set, a merge of two pool members); all
are screened on a val subset, the best go on to full val, and the best there meets the gate.
Each candidate's fate says where it stopped and why. Rows written before candidates existed
have none: the page then says so and shows the step's single candidate as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selftaught.demos import Demo, Leak, split_skill
from selftaught.gate import GateResult
from selftaught.runs import RunError

# a candidate's fate: the gate's outcome for the chosen one, else where it was stopped
FATE_TEXT = {
    "accepted_new_best": "kept · new best",
    "accepted": "kept · passed the gate, not best",
    "rejected": "rejected by the gate",
    "outscored": "lost on full val",
    "screened_out": "screened out",
    "not_scored": "not scored",
}
_GATE_FATE = {"accept_new_best": "accepted_new_best", "accept": "accepted", "reject": "rejected"}


@dataclass(frozen=True)
class DemoView:
    """A demonstration as the page shows it (chat inputs flattened to their user turns)."""

    id: str
    source: str
    input: str
    reply: str

    @property
    def label(self) -> str:
        return f"{self.id} ({self.source})"


@dataclass
class CandidateView:
    step: int
    version: str
    kind: str  # rules | demos | merge
    why: str  # what the trainer did to build it
    demos: list[str]  # "id (source)", as the history row names them
    screen: float | None  # mean metric on the screening val subset
    val: float | None  # hard accuracy on full val (None: it did not get there)
    chosen: bool
    fate: str  # a key of FATE_TEXT
    reason: str

    @property
    def demo_ids(self) -> list[str]:
        return [d.split(" (", 1)[0] for d in self.demos]


def demo_view(d: Demo) -> DemoView:
    return DemoView(d.id, d.source, d.input_text(), d.reply)


def _fate(
    c: dict[str, Any], chosen: dict[str, Any] | None, gate: GateResult | None
) -> tuple[str, str]:
    decision = gate.decision if gate is not None else ""
    reason = gate.reason if gate is not None else ""
    if c.get("chosen"):
        return _GATE_FATE.get(decision, "rejected"), reason
    val, screen = c.get("val"), c.get("screen")
    if isinstance(val, (int, float)):
        if chosen is None:
            return "outscored", f"full val {val:.3f}; no candidate was chosen"
        cv = chosen.get("val")
        cv_text = f" ({cv:.3f})" if isinstance(cv, (int, float)) else ""
        return "outscored", f"full val {val:.3f}, below {chosen.get('version')}{cv_text}"
    if isinstance(screen, (int, float)):
        if reason.startswith("screening:"):
            return "screened_out", reason
        return (
            "screened_out",
            f"{screen:.3f} on the val subset; only the best there, and none below its "
            "parent, went on to full val",
        )
    return "not_scored", "never scored (stopped before val)"


def read_candidates(
    step: int, candidates: list[dict[str, Any]], gate: GateResult | None
) -> list[CandidateView]:
    """A history row's candidates with their fate (`gate`: the row's decision); [] for a row
    written before candidates."""
    raw = [c for c in candidates or [] if isinstance(c, dict)]
    chosen = next((c for c in raw if c.get("chosen")), None)
    out = []
    for c in raw:
        fate, reason = _fate(c, chosen, gate)
        screen, val = c.get("screen"), c.get("val")
        out.append(
            CandidateView(
                step=step,
                version=str(c.get("version") or "?"),
                kind=str(c.get("kind") or "?"),
                why=str(c.get("why") or ""),
                demos=[str(d) for d in c.get("demos") or []],
                screen=float(screen) if isinstance(screen, (int, float)) else None,
                val=float(val) if isinstance(val, (int, float)) else None,
                chosen=bool(c.get("chosen")),
                fate=fate,
                reason=reason,
            )
        )
    return out


def rules_candidate(candidates: list[CandidateView]) -> CandidateView | None:
    """The candidate the diagnostics' edit reports belong to: the chosen one when it is a
    rules candidate, else the first proposal's (the trainer reports that proposal's edits)."""
    chosen = next((c for c in candidates if c.chosen), None)
    if chosen is not None and chosen.kind == "rules":
        return chosen
    return next(
        (c for c in candidates if c.kind == "rules" and c.why.startswith("proposal 1:")), None
    )


def split_or_note(text: str, name: str, notes: list[str]) -> tuple[str, list[DemoView], str]:
    """(rules, demos, placement) of a skill file; an unreadable demos block is a note and
    the whole text is then shown as rules."""
    try:
        parts = split_skill(text)
    except RunError as err:
        notes.append(f"{name}: the demos block cannot be read ({err}); shown as plain text.")
        return text, [], "turns"
    return parts.rules, [demo_view(d) for d in parts.demos], parts.placement


def read_demo_pool(data: Any, notes: list[str]) -> tuple[list[DemoView], list[Leak]]:
    """demo_pool.json: the demo candidates found so far and the leaks refused."""
    if not isinstance(data, dict):
        return [], []
    demos = []
    for d in data.get("demos") or []:
        try:
            demos.append(demo_view(Demo.from_dict(d)))
        except (KeyError, TypeError, AttributeError):
            notes.append(f"demo_pool.json: an entry is not a demo ({str(d)[:80]}); left out.")
    leaks = [
        Leak(str(x.get("demo_id", "?")), str(x.get("held_out_id", "?")), str(x.get("split", "?")))
        for x in data.get("leaks") or []
        if isinstance(x, dict)
    ]
    return demos, leaks
