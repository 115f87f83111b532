"""Text the task log can store, whatever bytes a client or an upstream sent.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`) and a NUL (`"\\u0000"`); Python parses
both into a `str` that neither backend stores: UTF-8 has no encoding for a lone surrogate
(SQLite, PostgreSQL and the spool all refuse the row) and a PostgreSQL text column refuses
NUL. `storable` replaces each such character with U+FFFD (in every string, dict keys
included) and counts them; the proxy calls it once where it parses a request body or an
upstream reply, before anything else reads it.

`salvaged` is the last resort of the writer and the spool replay: the row a log refused,
made storable field by field, or failing that a minimal error row saying why, so that an
answered request always leaves a row.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from typing import Any

from selftaught.sleep.intake.log import Interaction

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
LOG_ERROR = "log_error"
"""meta key: why the normal row could not be built or stored (the row is an error row)."""
REPLACED = "replaced_chars"
"""meta key: how many characters of the request and reply `storable` replaced."""


def storable_text(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate and NUL replaced by U+FFFD; (text, how many)."""
    if "\x00" not in text:
        if text.isascii():
            return text, 0
        try:
            text.encode("utf-8")
            return text, 0
        except UnicodeEncodeError:
            pass
    return _UNSTORABLE.subn(REPLACEMENT, text)


def storable(value: Any) -> tuple[Any, int]:
    """Make every string inside a JSON value storable (see the module doc); (value, how many
    characters were replaced). Lists and dicts are changed IN PLACE (call it on what a parser
    just returned); walked with a stack, so no nesting depth the parser accepted is too deep."""
    if isinstance(value, str):
        return storable_text(value)
    count = 0
    stack, seen = [value], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    fixed, n = storable_text(item)
                    if n:
                        node[i], count = fixed, count + n
                elif isinstance(item, (list, dict)):
                    stack.append(item)
        elif isinstance(node, dict):
            entries, changed = [], False
            for key, item in node.items():
                if isinstance(key, str):
                    key, n = storable_text(key)
                    count, changed = count + n, changed or n > 0
                if isinstance(item, str):
                    item, n = storable_text(item)
                    count, changed = count + n, changed or n > 0
                elif isinstance(item, (list, dict)):
                    stack.append(item)
                entries.append((key, item))
            if changed:  # two keys that differ only in what was replaced keep the last
                node.clear()
                node.update(entries)
    return value, count


_JSON_FIELDS = ("messages", "reference", "meta", "tools", "tool_choice", "tool_calls", "tags")


def salvaged(row: Interaction, why: BaseException) -> list[Interaction]:
    """What to store instead of a row the log refused (`why`), best first: the row with every
    field made storable, then a minimal error row (its id, provenance and the reason, none of
    its content). Never raises."""
    out: list[Interaction] = []
    try:
        copy = Interaction(**{f.name: getattr(row, f.name) for f in fields(row)})
        count = 0
        for name in _JSON_FIELDS:  # a copy through JSON: the original may be shared
            value = getattr(row, name)
            value = json.loads(json.dumps(value, default=str)) if value is not None else None
            value, n = storable(value)
            setattr(copy, name, value)
            count += n
        for name in ("reply", "error", "model", "client", "session_id", "skill_version"):
            value = getattr(row, name)
            if value is not None:
                value, n = storable_text(str(value))
                setattr(copy, name, value)
                count += n
        if count and isinstance(copy.meta, dict):
            copy.meta[REPLACED] = count + int(copy.meta.get(REPLACED) or 0)
        out.append(copy)
    except Exception:  # noqa: BLE001 - the minimal row below still goes in
        pass
    out.append(minimal_row(row, why))
    return out


def minimal_row(row: Interaction, why: BaseException) -> Interaction:
    """An error row for `row`: its id, project, provenance and the reason it could not be
    stored as it was."""

    def text(value: Any) -> str | None:
        return None if value is None else storable_text(str(value))[0]

    reason = text(f"the log could not store this exchange: {type(why).__name__}: {why}"[:2000])
    return Interaction(
        messages=[],
        project=row.project,
        source=row.source,
        id=row.id,
        created_at=row.created_at,
        model=text(row.model),
        latency_s=row.latency_s,
        error=reason,
        meta={LOG_ERROR: reason},
        skill_version=text(row.skill_version),
        shadow_of=text(row.shadow_of),
        client=text(row.client),
        session_id=text(row.session_id),
    )
