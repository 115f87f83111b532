"""SQLite cache of temperature-0 replies, keyed by (model fingerprint, messages, params).

The fingerprint names the weights, not the model: every trained model is named after its
folder (`best`), so a key on the name would serve one model's replies to another."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from selftaught.models.base import (
    AsyncChatModel,
    ChatModel,
    Completion,
    GenerationParams,
    Message,
    check_n,
)


def cache_key(fingerprint: str, messages: list[Message], params: GenerationParams) -> str:
    blob = json.dumps(
        [fingerprint, messages, params.cache_key()], sort_keys=True, ensure_ascii=False
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class ResponseCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, completion TEXT NOT NULL)"
        )
        self._db.commit()

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT completion FROM replies WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        data: dict[str, Any] = json.loads(row[0])
        return Completion(**{**data, "cached": True, "latency_s": 0.0, "retries": 0})

    def put(self, key: str, c: Completion) -> None:
        data: dict[str, Any] = {
            "text": c.text,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "finish_reason": c.finish_reason,
            "model": c.model,
        }
        if c.tool_calls is not None:  # plain replies keep the rows they always had
            data["tool_calls"] = c.tool_calls
        if c.tool_call_errors is not None:
            data["tool_call_errors"] = c.tool_call_errors
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO replies (key, completion) VALUES (?, ?)",
                (key, json.dumps(data)),
            )
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedModel(AsyncChatModel):
    """Serves temperature-0 calls from the cache; other calls pass through."""

    def __init__(self, model: ChatModel, cache: ResponseCache):
        self.inner = model
        self.cache = cache
        self.name = model.name

    @property
    def fingerprint(self) -> str:
        return str(getattr(self.inner, "fingerprint", self.inner.name))

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        if params.temperature > 0:
            return await self.inner.achat(messages, params)
        key = cache_key(self.fingerprint, messages, params)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        c = await self.inner.achat(messages, params)
        if c.text.strip() or c.tool_calls:  # a reply of tool calls alone has no text
            self.cache.put(key, c)
        return c

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """Sampled calls pass through; n greedy replies are one (cached) call and n-1 copies."""
        check_n(n)
        if params.temperature > 0:
            return await self.inner.achat_n(messages, params, n)
        first = await self.achat(messages, params)
        copies = [
            dataclasses.replace(
                first,
                cached=True,
                extra={**first.extra, "prompt_shared": True},
                tool_calls=copy.deepcopy(first.tool_calls),  # each copy's own calls
            )
            for _ in range(n - 1)
        ]
        return [first, *copies]

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)
