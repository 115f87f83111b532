"""The adopted skill and memory in a client's system prompt, marked so they can be told apart
and stripped again:

    <!-- selftaught:skill version=3 -->
    ...the skill...
    <!-- /selftaught:skill -->
    <!-- selftaught:memory version=3 -->
    ...the memory...
    <!-- /selftaught:memory -->

    ...the client's own system message...

They are prepended to the client's first system (or developer) message, or sent as a new
system message when the client has none. The client's messages are never modified in place.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from selftaught.models.base import Message
from selftaught.sleep.paths import Adopted

_BLOCK = re.compile(
    r"<!-- selftaught:(skill|memory)(?: version=[^>]*)? -->\n.*?\n<!-- /selftaught:\1 -->\n*",
    re.DOTALL,
)


def adopted_block(adopted: Adopted) -> str:
    """The marked text injected for `adopted` ("" when nothing is adopted)."""
    version = f" version={adopted.version}" if adopted.version else ""
    parts = []
    for kind, text in (("skill", adopted.skill), ("memory", adopted.memory)):
        if text.strip():
            parts.append(
                f"<!-- selftaught:{kind}{version} -->\n{text.strip()}\n<!-- /selftaught:{kind} -->"
            )
    return "\n".join(parts)


def inject_adopted(messages: Any, adopted: Adopted) -> Any:
    """A copy of `messages` with the adopted skill and memory in the system prompt; `messages`
    itself unchanged (and returned as is when nothing is adopted or it is not a chat list)."""
    block = adopted_block(adopted)
    if not block or not isinstance(messages, list):
        return messages
    out = list(messages)
    first = out[0] if out else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        first = copy.copy(first)
        content = first.get("content")
        if isinstance(content, list):
            first["content"] = [{"type": "text", "text": block + "\n\n"}, *content]
        elif isinstance(content, str) and content:
            first["content"] = f"{block}\n\n{content}"
        else:
            first["content"] = block
        out[0] = first
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def strip_injected(text: str) -> str:
    """`text` without any injected skill or memory block."""
    return _BLOCK.sub("", text)


def strip_injected_messages(messages: list[Message]) -> list[Message]:
    """Messages as the client wrote them: blocks removed, an injected-only system message
    dropped."""
    out: list[Message] = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, str) and "<!-- selftaught:" in content:
            stripped = strip_injected(content)
            if not stripped and msg.get("role") == "system":
                continue
            msg = {**msg, "content": stripped}
        out.append(msg)
    return out
