"""The evidence log of a night: every model call (role, messages, reply or error, tokens,
latency), one JSON line each, redacted before it is written, so a night that learned nothing
can be read back call by call. A replayed episode's call also carries the tools it was offered
(in `params`) and the reply's `tool_calls` (and malformed ones, `tool_call_errors`); its tool
results are in the next call's messages.

`EvidenceModel` wraps a model for one role and appends a line per call; lines are appended
under a lock and flushed at once, so a night killed mid-call leaves every finished call on
disk (and at worst one torn last line, which readers skip).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from selftaught.models.base import AsyncChatModel, ChatModel, Completion, GenerationParams, Message
from selftaught.redact import redact_for_model
from selftaught.runs import open_private_append


def redact_tree(value: Any) -> Any:
    """`value` with every string in it redacted (lists and dicts walked)."""
    if isinstance(value, str):
        return redact_for_model(value)
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    return value


class EvidenceLog:
    """Append-only JSONL of calls; thread-safe; text fields clipped to `max_chars`."""

    def __init__(self, path: str | Path, max_chars: int = 4000):
        self.path = Path(path)
        open_private_append(self.path).close()  # 0600: it holds every prompt and reply
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self.calls = 0
        self.errors: list[dict[str, Any]] = []  # every failed call: role, model, error

    def _clip(self, value: Any) -> Any:
        if isinstance(value, str) and len(value) > self.max_chars:
            return value[: self.max_chars] + f" […{len(value) - self.max_chars} chars cut]"
        if isinstance(value, list):
            return [self._clip(v) for v in value]
        if isinstance(value, dict):
            return {k: self._clip(v) for k, v in value.items()}
        return value

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps(self._clip(redact_tree(row)), ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self.calls += 1
            if row.get("error"):
                self.errors.append(
                    {k: redact_tree(row.get(k)) for k in ("time", "role", "model", "error")}
                )
            with open_private_append(self.path) as f:
                f.write(line)
                f.flush()


class EvidenceModel(AsyncChatModel):
    """`model` in `role`, each call written to `log`."""

    def __init__(self, model: ChatModel, log: EvidenceLog, role: str):
        self.inner = model
        self.log = log
        self.role = role
        self.name = model.name

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        t0 = time.time()
        row: dict[str, Any] = {
            "time": round(t0, 3),
            "role": self.role,
            "model": self.name,
            "messages": messages,
            "params": params.cache_key(),
        }
        try:
            c = await self.inner.achat(messages, params)
        except BaseException as err:
            if isinstance(err, asyncio.CancelledError):  # wait_for cancels what outlives it
                row["error"] = "cancelled: the call outlived its timeout, or the night stopped"
            else:
                row["error"] = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            row["latency_s"] = round(time.time() - t0, 3)
            self.log.write(row)
            raise
        row.update(
            reply=c.text,
            finish_reason=c.finish_reason,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            latency_s=round(c.latency_s or time.time() - t0, 3),
            retries=c.retries,
        )
        if c.tool_calls or c.tool_call_errors:  # a replayed episode's calls, as the model made them
            row.update(tool_calls=c.tool_calls, tool_call_errors=c.tool_call_errors)
        self.log.write(row)
        return c

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)
