"""The trainable state of text-space optimization: a skill document, the edits an analyst
proposes on it, and `apply_edits`, a pure function that applies a ranked patch and says what
happened to every edit.

Edits address text by quoting it (`target`), never by line number: analysts miscount lines,
and a quote survives earlier edits in the same patch. Regions between
`<!-- protected -->` and `<!-- /protected -->` are never edited (an unclosed marker protects
to the end of the document: fail safe)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from selftaught.choices import one_of
from selftaught.errors import InputError
from selftaught.skill_package import FILE_CLOSE, FILE_OPEN, PackageError, check_blocks, file_spans

EditOp = Literal["append", "insert_after", "replace", "delete"]
EDIT_OPS: tuple[EditOp, ...] = ("append", "insert_after", "replace", "delete")

PROTECT_OPEN = "<!-- protected -->"
PROTECT_CLOSE = "<!-- /protected -->"

# Names small analysts use for the same thing; normalised before validation.
_OP_ALIASES: dict[str, EditOp] = {
    "add": "append",
    "append": "append",
    "insert": "insert_after",
    "insert_after": "insert_after",
    "insertafter": "insert_after",
    "replace": "replace",
    "update": "replace",
    "modify": "replace",
    "edit": "replace",
    "rewrite": "replace",
    "delete": "delete",
    "remove": "delete",
}
_TARGET_KEYS = ("target", "anchor", "old", "old_text", "find", "after", "match")
_CONTENT_KEYS = ("content", "text", "new", "new_text", "rule", "replacement", "value")

EditStatus = Literal[
    "applied",  # done as asked
    "fallback_append",  # insert_after target not found: appended at the end instead
    "target_not_found",  # replace / delete target not in the document: skipped
    "protected",  # would touch a protected region: refused
    "duplicate",  # the content is already in the document: skipped
    "noop",  # replace with identical text
    "over_length",  # the document would exceed its length cap: skipped
    "breaks_package",  # would leave a package's file blocks malformed: skipped
]


class EditError(InputError):
    """An analyst edit that does not have the shape of an edit (the message says why)."""


def edit_op(value: object) -> EditOp:
    """`value` as an edit's op (one of `EDIT_OPS`), else an EditError naming them."""
    op = one_of(value, EDIT_OPS)
    if op is None:
        raise EditError(f"unknown op {value!r}; valid ops: {', '.join(EDIT_OPS)}")
    return op


@dataclass
class Edit:
    """One proposed change. `target` quotes existing text (insert_after / replace / delete);
    `content` is the new text (append / insert_after / replace)."""

    op: EditOp
    content: str = ""
    target: str = ""
    rationale: str = ""
    source: str = ""  # "failure" | "success" | "merge": which reflection produced it
    support: int = 1  # how many reflected patches proposed it (a ranking signal)

    def __post_init__(self) -> None:
        self.op = edit_op(self.op)  # a caller's, unchecked until here
        self.content = self.content.strip("\n")
        self.target = self.target.strip()
        if self.op in ("append", "insert_after", "replace") and not self.content.strip():
            raise EditError(f"{self.op} needs a non-empty 'content'")
        if self.op in ("insert_after", "replace", "delete") and not self.target:
            raise EditError(f"{self.op} needs a 'target' quoting text of the skill")

    def key(self) -> tuple[str, str, str]:
        """Identity for de-duplication and the rejected buffer (whitespace/case-insensitive)."""
        return (self.op, normalize(self.target), normalize(self.content))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "", max_chars: int = 2000) -> Edit:
        """Validate one analyst edit, accepting the aliases small models use for keys and ops."""
        if not isinstance(d, dict):
            raise EditError(f"an edit must be a JSON object, got {type(d).__name__}")
        raw_op = d.get("op", d.get("type", d.get("action", d.get("operation"))))
        if not isinstance(raw_op, str):
            raise EditError("edit has no 'op'")
        op = _OP_ALIASES.get(raw_op.strip().lower().replace("-", "_").replace(" ", "_"))
        if op is None:
            raise EditError(f"unknown op {raw_op!r}; valid ops: {', '.join(EDIT_OPS)}")
        target = _first_str(d, _TARGET_KEYS)
        content = _first_str(d, _CONTENT_KEYS)
        for name, value in (("target", target), ("content", content)):
            if len(value) > max_chars:
                raise EditError(f"{name} is {len(value)} chars, over the {max_chars} cap")
        if PROTECT_OPEN in content or PROTECT_CLOSE in content:
            raise EditError("content may not contain protection markers")
        if FILE_OPEN in content or FILE_CLOSE in content:
            raise EditError("content may not contain a package file's markers")
        rationale = d.get("rationale", d.get("reason", d.get("why", "")))
        support = d.get("support", 1)
        return cls(
            op=op,
            content=content,
            target=target,
            rationale=str(rationale)[:500] if rationale else "",
            source=source or str(d.get("source", "")),
            support=support if isinstance(support, int) and support > 0 else 1,
        )


def _first_str(d: dict[str, Any], keys: tuple[str, ...]) -> str:
    for k in keys:
        v = d.get(k)
        if isinstance(v, str) and v.strip():
            return v
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return "\n".join(v)
    return ""


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


@dataclass
class EditReport:
    """What happened to one edit of a patch."""

    edit: Edit
    status: EditStatus
    detail: str = ""

    @property
    def changed(self) -> bool:
        return self.status in ("applied", "fallback_append")

    def to_dict(self) -> dict[str, Any]:
        return {"edit": self.edit.to_dict(), "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class SkillDocument:
    """A skill: the markdown text the frozen model reads as its system prompt."""

    text: str = ""

    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    def protected_spans(self) -> list[tuple[int, int]]:
        return protected_spans(self.text)

    def apply(
        self, edits: list[Edit], *, max_chars: int | None = None, fallback_append: bool = True
    ) -> tuple[SkillDocument, list[EditReport]]:
        text, reports = apply_edits(
            self.text, edits, max_chars=max_chars, fallback_append=fallback_append
        )
        return SkillDocument(text), reports


def protected_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) spans of protected regions, markers included."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = text.find(PROTECT_OPEN, pos)
        if start < 0:
            return spans
        close = text.find(PROTECT_CLOSE, start + len(PROTECT_OPEN))
        end = len(text) if close < 0 else close + len(PROTECT_CLOSE)
        spans.append((start, end))
        pos = end


def find_target(text: str, target: str) -> tuple[int, int] | None:
    """Span of the first occurrence of `target`: exact, else ignoring whitespace and case,
    else without a leading list bullet / heading mark (analysts often drop or add one)."""
    if not target:
        return None
    i = text.find(target)
    if i >= 0:
        return i, i + len(target)
    for candidate in (target, target.lstrip("-*#> \t").rstrip(".")):
        words = candidate.split()
        if not words:
            continue
        pattern = r"\s+".join(re.escape(w) for w in words)
        m = re.search(pattern, text, re.IGNORECASE)
        if m:
            return m.start(), m.end()
    return None


_BULLET = " \t\n-*+#>.:;,"  # what may remain of a line whose words were all deleted


def _overlaps(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(span[0] < e and s < span[1] for s, e in spans)


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(s < pos < e for s, e in spans)


def _ends_unclosed(text: str, spans: list[tuple[int, int]]) -> bool:
    return bool(spans) and PROTECT_CLOSE not in text[spans[-1][0] :]


def _append(text: str, content: str) -> str:
    body = text.rstrip("\n")
    return f"{body}\n{content}\n" if body else f"{content}\n"


def tidy(text: str) -> str:
    """Runs of blank lines made one, outside a package's file blocks (a file keeps its own)."""
    out, pos = [], 0
    for start, end, _path in file_spans(text):
        out += [re.sub(r"\n{3,}", "\n\n", text[pos:start]), text[start:end]]
        pos = end
    return "".join([*out, re.sub(r"\n{3,}", "\n\n", text[pos:])])


def apply_edits(
    text: str,
    edits: list[Edit],
    *,
    max_chars: int | None = None,
    fallback_append: bool = True,
) -> tuple[str, list[EditReport]]:
    """Apply `edits` in order to `text`. Pure: returns the new text and one report per edit.
    An edit that cannot be applied is skipped (never raises), and the report says why."""
    reports: list[EditReport] = []
    for edit in edits:
        new, status, detail = _apply_one(text, edit, fallback_append)
        if status in ("applied", "fallback_append"):
            new = tidy(new)
            broken = _breaks_package(new) if FILE_OPEN in new or FILE_CLOSE in new else None
            if max_chars is not None and len(new) > max_chars:
                status, detail = "over_length", f"{len(new)} chars > cap {max_chars}"
            elif broken is not None:
                status, detail = "breaks_package", broken
            else:
                text = new
        reports.append(EditReport(edit, status, detail))
    return text, reports


def _whole_lines(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) grown to the start and end of its lines when only blanks lie between."""
    line_start = text.rfind("\n", 0, start) + 1
    nl = text.find("\n", end)
    line_end = len(text) if nl < 0 else nl
    if not text[line_start:start].strip():
        start = line_start
    if not text[end:line_end].strip():
        end = line_end
    return start, end


def _breaks_package(text: str) -> str | None:
    try:
        check_blocks(text)
    except PackageError as err:
        return str(err)
    return None


def _apply_one(text: str, edit: Edit, fallback_append: bool) -> tuple[str, EditStatus, str]:
    spans = protected_spans(text)
    # a coding agent's change is its diff (`skill.agent_edit`): a line it repeats is meant
    fresh = edit.source == "agent" or normalize(edit.content) not in normalize(text)
    if edit.op in ("append", "insert_after") and not fresh:
        return text, "duplicate", "the content is already in the skill"
    if edit.op == "append":
        if _ends_unclosed(text, spans):
            return text, "protected", "the skill ends inside an unclosed protected region"
        return _append(text, edit.content), "applied", ""
    if edit.source == "agent":  # a hunk quotes the text exactly: no near place will do
        i = text.find(edit.target)
        found = (i, i + len(edit.target)) if i >= 0 else None
    else:
        found = find_target(text, edit.target)
    if found is None:
        if edit.op == "insert_after" and fallback_append:
            if _ends_unclosed(text, spans):
                return text, "protected", "target not found and the end is protected"
            return _append(text, edit.content), "fallback_append", "target not found; appended"
        return text, "target_not_found", f"no text matching {edit.target[:80]!r}"
    start, end = found
    if edit.op == "insert_after":
        nl = text.find("\n", end)
        pos = len(text) if nl < 0 else nl
        if _inside(pos, spans):
            return text, "protected", "the insertion point is inside a protected region"
        new = f"{text[:pos]}\n{edit.content}{text[pos:]}"
        if pos == len(text):
            new += "\n"
        return new, "applied", ""
    if _overlaps((start, end), spans):
        return text, "protected", "the target overlaps a protected region"
    if edit.op == "replace":
        if edit.source == "agent":  # a hunk: whole lines, their indentation included
            start, end = _whole_lines(text, start, end)
        if text[start:end] == edit.content:
            return text, "noop", "replacement equals the target"
        return text[:start] + edit.content + text[end:], "applied", ""
    # delete: drop whole lines when the target covers them, so no empty bullets remain
    line_start = text.rfind("\n", 0, start) + 1
    nl = text.find("\n", end)
    line_end = len(text) if nl < 0 else nl + 1
    if not text[line_start:start].strip(_BULLET) and not text[end:line_end].strip(_BULLET):
        start, end = line_start, line_end
    return text[:start] + text[end:], "applied", ""


@dataclass
class Patch:
    """A ranked list of edits, with where it came from (for diagnostics)."""

    edits: list[Edit] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.edits)
