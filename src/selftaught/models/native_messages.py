"""What the native provider clients (`anthropic:`, `gemini:`) share when they translate chats
in the OpenAI shape (the one every backend speaks) into their vendor's."""

from __future__ import annotations

import json
from typing import Any

from selftaught.models.base import ToolCall


def text_of(content: Any) -> str:
    """A message's text: a string as it is, the text parts of a list of OpenAI content parts
    joined (other parts, such as images, are not carried by these clients)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return str(content)


def tool_input(arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call's `arguments` (a JSON string) as the object the vendors want; what
    is not a JSON object is kept under `_raw` so that nothing the model said is lost."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {"_raw": str(arguments)}
    return value if isinstance(value, dict) else {"_raw": arguments}


def tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    """A tool call in the OpenAI shape."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
