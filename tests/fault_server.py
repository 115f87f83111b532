"""A real OpenAI-compatible HTTP server on loopback that injects faults on demand.

`faults` is a queue of what the next chat requests get: "ok", "timeout" (sleeps past the
client's timeout), "429", "500", "503", "401", "empty". When the queue is empty every
request is answered "ok". Answers come from `answer(messages)`: a text, or a message dict
(with "tool_calls", or an explicit "finish_reason"). A request for n > 1
choices gets n answers (`n_mode="support"`), a 500 as llama.cpp's server answers it
("reject"), or one answer ("ignore"). (vLLM's runtime LoRA API: `tests.fake_upstream`.)"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers JSON (`_send`); the scripted servers' handlers build on it."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)


def _choice(index: int, answer: str | dict[str, Any]) -> dict[str, Any]:
    """A choice for an answer: a text, or a message dict (e.g. with "tool_calls"; its
    "finish_reason" key, default "tool_calls" when it has calls, sets the choice's)."""
    if isinstance(answer, str):
        return {
            "index": index,
            "message": {"role": "assistant", "content": answer},
            "finish_reason": "stop",
        }
    message = dict(answer)
    finish = message.pop("finish_reason", "tool_calls" if message.get("tool_calls") else "stop")
    return {
        "index": index,
        "message": {"role": "assistant", "content": None, **message},
        "finish_reason": finish,
    }


class FaultServer:
    def __init__(
        self,
        answer: Callable[[list[dict[str, Any]]], str | dict[str, Any]] = lambda m: "42",
        *,
        models: tuple[str, ...] = ("fake-model",),
        require_key: str | None = None,
        timeout_sleep_s: float = 1.5,
        n_mode: str = "support",
    ):
        self.answer = answer
        self.models = models
        self.require_key = require_key
        self.timeout_sleep_s = timeout_sleep_s
        self.n_mode = n_mode
        self.faults: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(JsonHandler):
            def _authorized(self) -> bool:
                if server.require_key is None:
                    return True
                return self.headers.get("Authorization") == f"Bearer {server.require_key}"

            def _error(self, status: int, message: str) -> None:
                self._send(status, {"error": {"message": message, "type": "test", "code": status}})

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized():
                    return self._error(401, "Incorrect API key provided")
                if self.path.rstrip("/").endswith("/models"):
                    data = [{"id": m, "object": "model", "owned_by": "test"} for m in server.models]
                    return self._send(200, {"object": "list", "data": data})
                self._error(404, "not found")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append(body)
                    fault = server.faults.popleft() if server.faults else "ok"
                if not self._authorized() or fault == "401":
                    return self._error(401, "Incorrect API key provided")
                if body.get("model") not in server.models:
                    return self._error(404, f"model {body.get('model')} does not exist")
                if fault == "timeout":
                    time.sleep(server.timeout_sleep_s)
                    return self._error(504, "too late")
                if fault in ("429", "500", "503"):
                    return self._error(int(fault), f"injected {fault}")
                n = int(body.get("n") or 1)
                if n > 1 and server.n_mode == "reject":
                    return self._error(500, "Only one completion choice is allowed")
                if server.n_mode == "ignore":
                    n = 1
                answers = [
                    "" if fault == "empty" else server.answer(body["messages"]) for _ in range(n)
                ]
                self._send(
                    200,
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [_choice(i, a) for i, a in enumerate(answers)],
                        "usage": {
                            "prompt_tokens": 10,
                            "completion_tokens": 2 * n,
                            "total_tokens": 10 + 2 * n,
                        },
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def chat_requests(self) -> int:
        return len(self.requests)

    def __enter__(self) -> FaultServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
