"""Scripted loopback servers speaking the vendors' own wire formats: Anthropic's Messages API
(`POST /v1/messages`) and Google's Gemini API (`POST /v1beta/models/MODEL:generateContent`).

`faults` is a queue of what the next requests get: "ok", "429", "500", "503", "529", "401",
"400", "timeout" (sleeps past the client's timeout), "echo-401" (a 401 quoting the key
headers). Answers come from `answer(body)`: a text, or `{"tool": NAME, "args": {...}}` for one
tool call. Each server keeps a prompt cache the way
its vendor does: Anthropic caches the prefix up to a block marked `cache_control` (the first
request writes it, the next ones read it); Gemini caches a system instruction it has seen
before by itself. Token counts are characters // 4."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fake_upstream import quoted_keys
from tests.fault_server import JsonHandler

Answer = Callable[[dict[str, Any]], "str | dict[str, Any]"]

ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    529: "UNAVAILABLE",
}


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


class NativeServer:
    """One scripted server; `wire` is "anthropic" or "gemini"."""

    def __init__(
        self,
        wire: str,
        answer: Answer = lambda body: "42",
        *,
        require_key: str | None = None,
        timeout_sleep_s: float = 1.5,
        n_mode: str = "support",
    ):
        self.wire = wire
        self.answer = answer
        self.require_key = require_key
        self.timeout_sleep_s = timeout_sleep_s
        self.n_mode = n_mode  # gemini's candidateCount: "support" or "reject" (a 400)
        self.faults: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.cache: set[str] = set()
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    server.paths.append(self.path)
                    fault = server.faults.popleft() if server.faults else "ok"
                if fault == "timeout":
                    time.sleep(server.timeout_sleep_s)
                    fault = "503"
                if fault == "echo-401":
                    return self._send(*server.error(401, f"bad key: {quoted_keys(self.headers)}"))
                if not server.authorized(self.headers) or fault == "401":
                    return self._send(*server.error(401, "invalid x-api-key"))
                if fault != "ok":
                    return self._send(*server.error(int(fault), f"injected {fault}"))
                reply = server.reply(self.path, body)
                self._send(*reply)

        return Handler

    def authorized(self, headers: Any) -> bool:
        if self.require_key is None:
            return True
        sent = {
            headers.get("x-api-key"),
            headers.get("x-goog-api-key"),
            (headers.get("Authorization") or "").removeprefix("Bearer "),
        }
        return self.require_key in sent

    def error(self, status: int, message: str) -> tuple[int, dict[str, Any]]:
        if self.wire == "anthropic":
            kind = ANTHROPIC_ERRORS.get(status, "api_error")
            return status, {"type": "error", "error": {"type": kind, "message": message}}
        status_name = GEMINI_STATUS.get(status, "UNKNOWN")
        return status, {"error": {"code": status, "message": message, "status": status_name}}

    def reply(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.wire == "anthropic":
            if not path.endswith("/v1/messages"):
                return self.error(404, f"no route {path}")
            return 200, self.anthropic_reply(body)
        if not path.split("?")[0].endswith(":generateContent"):
            return self.error(404, f"no route {path}")
        return self.gemini_reply(path, body)

    def _cached(self, key: str) -> bool:
        """Whether `key` was cached already (and cache it)."""
        with self.lock:
            seen = key in self.cache
            self.cache.add(key)
        return seen

    def anthropic_reply(self, body: dict[str, Any]) -> dict[str, Any]:
        system = body.get("system") or []
        prefix = "".join(json.dumps(t) for t in body.get("tools") or [])
        marked = ""  # the prefix up to the last block marked for the cache
        for block in system:
            prefix += block["text"]
            if block.get("cache_control"):
                marked = prefix
        if not marked and any(t.get("cache_control") for t in body.get("tools") or []):
            marked = "".join(json.dumps(t) for t in body["tools"])
        rest = json.dumps(body["messages"]) + prefix[len(marked) :]
        read = write = 0
        if marked:
            read, write = (tokens(marked), 0) if self._cached(marked) else (0, tokens(marked))
        answer = self.answer(body)
        if isinstance(answer, str):
            content = [{"type": "text", "text": answer}]
            stop = "end_turn"
        else:
            tool = {"type": "tool_use", "id": "toolu_1", "name": answer["tool"]}
            content = [{**tool, "input": answer["args"]}]
            stop = "tool_use"
        return {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": tokens(rest),
                "output_tokens": 2,
                "cache_creation_input_tokens": write,
                "cache_read_input_tokens": read,
            },
        }

    def gemini_reply(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        config = body.get("generationConfig") or {}
        n = int(config.get("candidateCount") or 1)
        if n > 1 and self.n_mode == "reject":
            return self.error(400, "candidateCount is not supported by this model")
        parts = (body.get("systemInstruction") or {}).get("parts", [])
        system = "".join(p.get("text", "") for p in parts)
        read = tokens(system) if system and self._cached(system) else 0
        prompt = tokens(system + json.dumps(body.get("contents")))
        candidates = []
        for i in range(n):
            answer = self.answer(body)
            if isinstance(answer, str):
                part: dict[str, Any] = {"text": answer}
            else:
                part = {"functionCall": {"name": answer["tool"], "args": answer["args"]}}
            content = {"role": "model", "parts": [part]}
            candidates.append({"content": content, "finishReason": "STOP", "index": i})
        model = path.split("/models/")[-1].split(":")[0]
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": 2 * n,
            "totalTokenCount": prompt + 2 * n,
            "cachedContentTokenCount": read,
        }
        return 200, {"candidates": candidates, "usageMetadata": usage, "modelVersion": model}

    def __enter__(self) -> NativeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
