"""Reflect (≈ the gradient): an analyst model reads a bounded minibatch of trajectories with
the scorer's feedback and proposes edits as JSON. Also the merge call used by `aggregate`.

Small analysts often reply with broken JSON (measured on peers: 11 of 19 valid), so every reply
is validated, a reply that is not valid JSON gets exactly ONE repair call, and each call's
outcome (ok / repaired / invalid_json / backend_error) is recorded for the parse rate."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from selftaught import prompts
from selftaught.errors import ConfigError, InputError
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.rollout import Rollout, attempt_text
from selftaught.skill.document import Edit, EditError, normalize
from selftaught.skill.guard import EditGuard
from selftaught.tasks.extract import extract_json

CallStatus = Literal["ok", "repaired", "invalid_json", "backend_error"]


def load_prompt(name: str) -> str:
    """The analyst's template `name` as the run has it (`--prompts DIR` overrides it)."""
    return prompts.load(name)


def render(template: str, **values: Any) -> str:
    """Fill `{{name}}` placeholders (not str.format: the prompts contain JSON braces)."""
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", str(value))
    return template


def clip(text: str, limit: int) -> str:
    """Keep the head and the tail (answers and errors often sit at the end)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = int(limit * 0.7)
    tail = limit - head
    return f"{text[:head]} […{len(text) - limit} chars cut…] {text[-tail:]}"


class EditParseError(InputError):
    """An analyst reply that holds no edit we can read."""


# The prompts' example values: weak analysts echo them back as if they were edits (seen with
# SmolLM2-135M as analyst: `{"op": "append", "content": "new rule"}` was applied verbatim).
PLACEHOLDERS = frozenset(
    {"new rule", "better text", "text copied from the skill", "text copied from the memory"}
    | {"...", "…"}
)

# What the analyst is told it edits: the skill (how to solve tasks of one kind) or the memory
# (what to remember about this user and project); the same prompts serve both.
DocumentKind = Literal["skill", "memory"]
DOCUMENTS: dict[str, str] = {
    "skill": "the instructions an AI assistant reads before it solves tasks of one kind",
    "memory": "the facts, preferences and conventions an AI assistant keeps about its user and "
    "project, read before every task",
}


def parse_edits(
    text: str, *, source: str = "", max_chars: int = 2000
) -> tuple[list[Edit], list[dict[str, Any]]]:
    """Edits in an analyst reply. Accepts {"edits": [...]}, a bare list, or one edit object.
    Returns (valid edits, invalid ones with the reason); raises EditParseError when the reply
    holds no JSON of that shape at all."""
    try:
        value = extract_json(text)
    except ValueError as err:
        raise EditParseError(str(err)) from err
    if isinstance(value, dict):
        if isinstance(value.get("edits"), list):
            items = value["edits"]
        elif any(k in value for k in ("op", "type", "action", "operation")):
            items = [value]
        else:
            raise EditParseError("the JSON object has no 'edits' list")
    elif isinstance(value, list):
        items = value
    else:
        raise EditParseError(f"expected a JSON object or list, got {type(value).__name__}")
    edits: list[Edit] = []
    invalid: list[dict[str, Any]] = []
    for item in items:
        try:
            edit = Edit.from_dict(item, source=source, max_chars=max_chars)
        except EditError as err:
            invalid.append({"edit": item, "reason": str(err)})
            continue
        if normalize(edit.content) in PLACEHOLDERS or normalize(edit.target) in PLACEHOLDERS:
            invalid.append({"edit": item, "reason": "copies the prompt's example placeholder"})
            continue
        edits.append(edit)
    return edits, invalid


@dataclass
class AnalystCall:
    """One analyst reflection or merge, with everything diagnostics need."""

    kind: str  # "failure" | "success" | "contrast" | "grounded" | "merge"
    status: CallStatus = "ok"
    edits: list[Edit] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)  # not edits at all
    refused: list[dict[str, Any]] = field(default_factory=list)  # edits the guard refused
    raw_reply: str = ""
    repair_reply: str | None = None
    error: str | None = None
    example_ids: list[str] = field(default_factory=list)
    prompt_chars: int = 0
    agent: dict[str, Any] = field(default_factory=dict)  # a coding agent's run (`agent_edit`)

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"agent": self.agent} if self.agent else {}),
            "kind": self.kind,
            "status": self.status,
            "edits": [e.to_dict() for e in self.edits],
            "invalid_edits": self.invalid,
            "refused_edits": self.refused,
            "raw_reply": self.raw_reply,
            "repair_reply": self.repair_reply,
            "error": self.error,
            "example_ids": self.example_ids,
            "prompt_chars": self.prompt_chars,
        }


def _attempt(r: Rollout, limit: int) -> str:
    """The reply, or for an episode its calls, results and final answer (bounded)."""
    return clip(attempt_text(r, limit), limit) or "(empty)"


def format_rollouts(
    rollouts: list[Rollout], *, max_input_chars: int, max_reply_chars: int, max_feedback_chars: int
) -> str:
    blocks = []
    for i, r in enumerate(rollouts, 1):
        user = next(
            (str(m.get("content", "")) for m in reversed(r.messages) if m.get("role") == "user"),
            "",
        )
        score = r.score
        lines = [
            f"### Task {i}",
            f"Input:\n{clip(user, max_input_chars)}",
            f"Answer given:\n{_attempt(r, max_reply_chars)}",
        ]
        if score is not None:
            lines.append(f"Score: solved={'yes' if score.hard else 'no'}, partial={score.soft:.2f}")
            if score.feedback:
                lines.append(f"Grader feedback: {clip(score.feedback, max_feedback_chars)}")
        if r.truncated:
            lines.append("Note: the answer was cut off at the length limit.")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_contrasts(
    pairs: list[tuple[Rollout, Rollout]],
    *,
    max_input_chars: int,
    max_reply_chars: int,
    max_feedback_chars: int,
) -> str:
    """Each task once, with one solved and one failed attempt at it."""
    blocks = []
    for i, (good, bad) in enumerate(pairs, 1):
        user = next(
            (str(m.get("content", "")) for m in reversed(good.messages) if m.get("role") == "user"),
            "",
        )
        lines = [
            f"### Task {i}",
            f"Input:\n{clip(user, max_input_chars)}",
            f"Solved attempt:\n{_attempt(good, max_reply_chars)}",
            f"Failed attempt:\n{_attempt(bad, max_reply_chars)}",
        ]
        if bad.score is not None and bad.score.feedback:
            feedback = clip(bad.score.feedback, max_feedback_chars)
            lines.append(f"Grader feedback on the failed attempt: {feedback}")
        if bad.truncated:
            lines.append("Note: the failed attempt was cut off at the length limit.")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_edits(edits: list[Edit], limit: int = 300) -> str:
    rows = []
    for e in edits:
        d: dict[str, Any] = {"op": e.op}
        if e.target:
            d["target"] = clip(e.target, limit)
        if e.content:
            d["content"] = clip(e.content, limit)
        rows.append(json.dumps(d, ensure_ascii=False))
    return "\n".join(f"- {r}" for r in rows)


class Analyst:
    """The optimizer model in its analyst role: reflect on minibatches, merge patches."""

    def __init__(
        self,
        model: ChatModel,
        *,
        max_tokens: int = 768,
        temperature: float = 0.0,
        repair: bool = True,
        max_input_chars: int = 1200,
        max_reply_chars: int = 600,
        max_feedback_chars: int = 300,
        max_edit_chars: int = 800,
        timeout_s: float = 300.0,
        guard: EditGuard | None = None,
        document: DocumentKind = "skill",
        preferences: str = "",
        grounded: bool = False,
        agent: bool = False,
    ):
        if document not in DOCUMENTS:
            raise ConfigError(f"document must be one of {', '.join(DOCUMENTS)}, got {document!r}")
        self.model = model
        self.guard = guard
        self.document = document
        self.preferences = preferences.strip()  # the user's house rules, shown in every prompt
        self.params = GenerationParams(max_tokens=max_tokens, temperature=temperature)
        self.repair = repair
        self.limits = {
            "max_input_chars": max_input_chars,
            "max_reply_chars": max_reply_chars,
            "max_feedback_chars": max_feedback_chars,
        }
        self.max_edit_chars = max_edit_chars
        self.timeout_s = timeout_s
        self.prompts = {
            name: load_prompt(name)
            for name in (
                "reflect_failures",
                "reflect_successes",
                "reflect_contrast",
                "merge",
                "repair",
                "rejected",
                "preferences",
                "tried_failed",
                "slow_merge",
            )
        }
        if grounded:  # loaded only when asked for: the guard's templates are as before when off
            self.prompts["reflect_grounded"] = load_prompt("reflect_grounded")
        if agent:  # a coding agent edits the document itself (`skill.agent_edit`)
            self.prompts["agent_edit"] = load_prompt("agent_edit")
        # edits the cross-run ledger holds as rejected again and again (`skill.ledger`)
        self.tried_failed: list[Edit] = []
        self.tried_failed_min = 2

    def render_prompt(self, name: str, rejected: list[Edit], **values: Any) -> str:
        """Prompt `name` with the document's words, the user's house rules, the edits tried
        and failed and `rejected` filled in (for a prompt that shows no document)."""
        return self._render(name, "", rejected=self._rejected_block(rejected), **values)

    def _rejected_block(self, rejected: list[Edit]) -> str:
        if not rejected:
            return ""
        return render(self.prompts["rejected"], rejected=format_edits(rejected))

    def _tried_failed_block(self) -> str:
        if not self.tried_failed:
            return ""
        edits = format_edits(self.tried_failed)
        return render(self.prompts["tried_failed"], edits=edits, min=self.tried_failed_min)

    def _preferences_block(self) -> str:
        if not self.preferences:
            return ""
        return render(self.prompts["preferences"], doc=self.document, preferences=self.preferences)

    def _render(self, name: str, document: str, **values: Any) -> str:
        return render(
            self.prompts[name],
            DOC=self.document.upper(),
            doc=self.document,
            doc_description=DOCUMENTS[self.document],
            preferences=self._preferences_block(),
            tried_failed=self._tried_failed_block(),
            document=document.strip() or "(empty: nothing written yet)",
            **values,
        )

    async def reflect(
        self,
        kind: Literal["failure", "success"],
        document: str,
        rollouts: list[Rollout],
        rejected: list[Edit],
        max_edits: int,
    ) -> AnalystCall:
        """Reflect on a minibatch of failed (or of solved) trajectories."""
        prompt = self._render(
            "reflect_failures" if kind == "failure" else "reflect_successes",
            document,
            examples=format_rollouts(rollouts, **self.limits),
            rejected=self._rejected_block(rejected),
            max_edits=max_edits,
        )
        call = await self._json_call(kind, prompt)
        call.example_ids = [r.example_id for r in rollouts]
        return call

    async def reflect_contrast(
        self,
        document: str,
        pairs: list[tuple[Rollout, Rollout]],
        rejected: list[Edit],
        max_edits: int,
    ) -> AnalystCall:
        """Reflect on the contrast between a solved and a failed attempt at the same tasks."""
        prompt = self._render(
            "reflect_contrast",
            document,
            examples=format_contrasts(pairs, **self.limits),
            rejected=self._rejected_block(rejected),
            max_edits=max_edits,
        )
        call = await self._json_call("contrast", prompt)
        call.example_ids = [good.example_id for good, _ in pairs]
        return call

    async def reflect_grounded(
        self,
        document: str,
        summary: str,
        failed: list[Rollout],
        rejected: list[Edit],
        max_edits: int,
    ) -> AnalystCall:
        """An instruction proposal grounded in the train set's summary and the step's failed
        attempts (`skill.grounding`, MIPRO's data-aware proposer)."""
        examples = format_rollouts(failed, **self.limits) if failed else "(none this round)"
        prompt = self._render(
            "reflect_grounded",
            document,
            summary=summary,
            examples=examples,
            rejected=self._rejected_block(rejected),
            max_edits=max_edits,
        )
        call = await self._json_call("grounded", prompt)
        call.example_ids = [r.example_id for r in failed]
        return call

    async def merge(self, document: str, patches: list[list[Edit]], max_edits: int) -> AnalystCall:
        listing = "\n\n".join(
            f"### Proposal {i}\n{format_edits(p)}" for i, p in enumerate(patches, 1)
        )
        return await self._json_call(
            "merge", self._render("merge", document, patches=listing, max_edits=max_edits)
        )

    async def merge_overlaps(
        self, document: str, helped: list[Edit], max_edits: int
    ) -> AnalystCall:
        """The slow update's merge: overlapping rules of `document` (those listed in `helped`
        kept helping) merged into fewer; the reply is edits, as any other call's."""
        return await self._json_call(
            "slow_merge",
            self._render("slow_merge", document, helped=format_edits(helped), max_edits=max_edits),
        )

    async def _ask(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        c = await asyncio.wait_for(self.model.achat(messages, self.params), self.timeout_s)
        return c.text

    def templates(self) -> list[str]:
        """The prompt texts an edit must not echo: every template, with the document's words
        filled in for either document kind (the per-call parts left empty)."""
        return [
            render(t, DOC=kind.upper(), doc=kind, doc_description=description)
            for t in self.prompts.values()
            for kind, description in DOCUMENTS.items()
        ]

    async def _json_call(self, kind: str, prompt: str) -> AnalystCall:
        call = await self._parsed_call(kind, prompt)
        if self.guard is not None:
            call.edits, call.refused = self.guard.split(call.edits)
        return call

    async def _parsed_call(self, kind: str, prompt: str) -> AnalystCall:
        call = AnalystCall(kind=kind, prompt_chars=len(prompt))
        try:
            call.raw_reply = await self._ask(prompt)
        except FatalBackendError:
            raise
        except (TransientBackendError, asyncio.TimeoutError) as err:
            call.status, call.error = "backend_error", str(err) or "timed out"
            return call
        try:
            call.edits, call.invalid = parse_edits(
                call.raw_reply, source=kind, max_chars=self.max_edit_chars
            )
            return call
        except EditParseError as err:
            call.error = f"invalid JSON: {err}"
        if not self.repair:
            call.status = "invalid_json"
            return call
        repair_prompt = self._render(
            "repair", "", reply=clip(call.raw_reply, 3000), error=call.error
        )
        try:
            call.repair_reply = await self._ask(repair_prompt)
        except FatalBackendError:
            raise
        except (TransientBackendError, asyncio.TimeoutError) as err:
            call.status = "invalid_json"
            call.error = f"{call.error}; repair call failed: {err or 'timed out'}"
            return call
        try:
            call.edits, call.invalid = parse_edits(
                call.repair_reply, source=kind, max_chars=self.max_edit_chars
            )
            call.status = "repaired"
        except EditParseError as err:
            call.status = "invalid_json"
            call.error = f"{call.error}; after repair: {err}"
        return call
