"""A tiny OpenAI-compatible server on loopback for proxy tests: plain and streamed chat
completions, `/v1/models`, injected errors, a slow stream on demand. Records every request.

Every request, whatever its route, is recorded in `calls` (method, path, query, headers, body);
a route it does not serve is answered 404 and recorded in `unknown` too. `routes` adds POST
routes (path without the query → `fn(handler, body)`; `tests.agent_upstream` serves the
Anthropic Messages and OpenAI Responses APIs that way). `answer(messages)` gives the chat
reply (or `chat_reply(body, headers)`, which sees the whole request): a string, or a dict
`{"content": ..., "tool_calls": [...]}` (OpenAI shape); a request for `n` choices gets `n`.

It speaks vLLM's runtime LoRA API as vLLM does (`vllm/entrypoints/openai/models/serving.py`):
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` answers 200 and a plain-text success,
or 400 "has already been loaded" for a name it holds; `POST /v1/unload_lora_adapter
{"lora_name"}` answers 404 for a name it does not hold; `/v1/models` lists each adapter (`id`
its name, `root` its path, `parent` the base model), and a reply names the model asked for.
`strict_models` answers 404 to a chat for a model it does not serve, as vLLM does; off, any
name is answered (the proxy tests send clients' names). Hooks make it lie
as a stale server would: `listed_root(name, path)` is the path `/v1/models` gives, and
`reply_model(asked)` the model a reply names."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


def echo(messages: list[dict[str, Any]]) -> str:
    return "echo: " + str(messages[-1].get("content"))


def quoted_keys(headers: Any) -> str:
    """The key headers of a request, quoted back as an upstream that echoes them would: each
    key bare (no pattern knows it), then each header as it came."""
    sent = [
        (n, headers[n]) for n in ("Authorization", "x-api-key", "x-goog-api-key") if headers.get(n)
    ]
    bare = ", ".join(value.removeprefix("Bearer ") for _, value in sent)
    return f"{bare} (you sent {', '.join(f'{n}: {v}' for n, v in sent)})"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # many clients connect at once


Route = Callable[[Any, dict[str, Any]], None]


class FakeUpstream:
    """`faults` queue: "500", "429", "401", "400" answer that status with an OpenAI error body;
    "echo-401" answers 401 quoting the request's key headers (as some servers do); "broken"
    starts a stream and cuts it. `chunk_delay_s` paces streamed chunks."""

    def __init__(
        self,
        answer: Callable[[list[dict[str, Any]]], str | dict[str, Any]] = echo,
        *,
        model: str = "fake-model",
        chunk_delay_s: float = 0.0,
        routes: dict[str, Route] | None = None,
        chat_reply: Callable[[dict[str, Any], dict[str, str]], str | dict[str, Any]] | None = None,
        port: int = 0,  # 0: a free one
        strict_models: bool = False,
        listed_root: Callable[[str, str], str] | None = None,
        reply_model: Callable[[str], str] | None = None,
    ):
        self.answer = answer
        self.strict_models = strict_models
        self.listed_root = listed_root or (lambda name, path: path)
        self.reply_model = reply_model or (lambda asked: asked)
        self.adapters: dict[str, str] = {}  # LoRA adapters loaded: name -> path
        self.chat_reply = chat_reply  # (body, headers) -> reply; overrides `answer`
        self.model = model
        self.chunk_delay_s = chunk_delay_s
        self.routes = dict(routes or {})
        self.faults: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []  # chat completion bodies
        self.headers: list[dict[str, str]] = []  # their headers
        self.raw: list[bytes] = []  # their bytes
        self.calls: list[dict[str, Any]] = []  # every request, any route
        self.unknown: list[tuple[str, str]] = []  # (method, path) answered 404
        self.lora_loads: list[dict[str, Any]] = []  # vLLM's POST /v1/load_lora_adapter bodies
        self.lora_unloads: list[str] = []  # names POST /v1/unload_lora_adapter dropped
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def _record(self, body: Any) -> str:
                url = urlsplit(self.path)
                path = url.path.rstrip("/") or "/"
                with outer.lock:
                    outer.calls.append(
                        {
                            "method": self.command,
                            "path": path,
                            "query": url.query,
                            "headers": dict(self.headers),
                            "body": body,
                        }
                    )
                return path

            def _not_found(self, path: str) -> None:
                with outer.lock:
                    outer.unknown.append((self.command, path))
                self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

            def do_GET(self) -> None:  # noqa: N802
                path = self._record(None)
                if path.endswith("/models"):
                    card = {"id": outer.model, "object": "model", "owned_by": "test"}
                    with outer.lock:
                        loras = [
                            {"id": name, "object": "model", "owned_by": "test",
                             "root": outer.listed_root(name, root), "parent": outer.model}
                            for name, root in outer.adapters.items()
                        ]  # fmt: skip
                    return self._json(200, {"object": "list", "data": [card, *loras]})
                self._not_found(path)

            def do_DELETE(self) -> None:  # noqa: N802
                self._not_found(self._record(None))

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"_not_json": raw.decode("utf-8", "replace")}
                path = self._record(body)
                if path in outer.routes:
                    return outer.routes[path](self, body)
                if path.endswith("/load_lora_adapter"):
                    return self._load_lora(body)
                if path.endswith("/unload_lora_adapter"):
                    return self._unload_lora(body)
                if not path.endswith("/chat/completions"):
                    return self._not_found(path)
                asked = body.get("model")
                if outer.strict_models and asked != outer.model and asked not in outer.adapters:
                    message = f"The model `{asked}` does not exist."
                    return self._json(404, {"error": {"message": message, "type": "NotFoundError"}})
                with outer.lock:
                    outer.raw.append(raw)
                    outer.requests.append(body)
                    outer.headers.append(dict(self.headers))
                    fault = outer.faults.popleft() if outer.faults else "ok"
                if fault == "echo-401":
                    message = f"Incorrect API key provided: {quoted_keys(self.headers)}"
                    return self._json(401, {"error": {"message": message, "type": "auth"}})
                if fault.isdigit():
                    message = f"injected {fault}"
                    return self._json(int(fault), {"error": {"message": message, "type": "test"}})
                if outer.chat_reply is not None:
                    out = outer.chat_reply(body, dict(self.headers))
                else:
                    out = outer.answer(body["messages"])
                text = out if isinstance(out, str) else str(out.get("content") or "")
                calls = None if isinstance(out, str) else out.get("tool_calls")
                usage = {"prompt_tokens": 7, "completion_tokens": len(text.split())}
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                if not body.get("stream"):
                    message: dict[str, Any] = {"role": "assistant", "content": text}
                    if calls:
                        message["tool_calls"] = calls
                    n = body.get("n")
                    n = n if isinstance(n, int) and 1 <= n <= 64 else 1
                    choice = {
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                    return self._json(
                        200,
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": outer.reply_model(body.get("model", outer.model)),
                            "choices": [{"index": i, **choice} for i in range(n)],
                            "usage": usage,
                        },
                    )
                self._stream(body, text, calls, usage, broken=fault == "broken")

            def _load_lora(self, body: dict) -> None:
                """vLLM's runtime LoRA loading: 200 and a plain-text success, 400 for a name
                already loaded (a queued fault status refuses it)."""
                name, path = body.get("lora_name"), body.get("lora_path")
                with outer.lock:
                    outer.lora_loads.append(body)
                    fault = outer.faults.popleft() if outer.faults else "ok"
                    held = name in outer.adapters
                    if not fault.isdigit() and not held:
                        outer.adapters[name] = path
                if fault.isdigit():
                    return self._text(int(fault), "injected refusal")
                if held:
                    message = (
                        f"The lora adapter '{name}' has already been loaded. If you want to "
                        "load the adapter in place, set 'load_inplace' to True."
                    )
                    error = {"message": message, "type": "InvalidUserInput", "code": 400}
                    return self._json(400, {"error": error})
                self._text(200, f"Success: LoRA adapter '{name}' added successfully.")

            def _unload_lora(self, body: dict) -> None:
                name = body.get("lora_name")
                with outer.lock:
                    held = outer.adapters.pop(name, None) is not None
                    if held:
                        outer.lora_unloads.append(name)
                if not held:
                    message = f"The lora adapter '{name}' cannot be found."
                    error = {"message": message, "type": "NotFoundError", "code": 404}
                    return self._json(404, {"error": error})
                self._text(200, f"Success: LoRA adapter '{name}' removed successfully.")

            def _text(self, status: int, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(
                self, body: dict, text: str, calls: list | None, usage: dict, broken: bool
            ) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                base = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model", outer.model),
                }
                pieces = [w + " " for w in text.split(" ")]
                pieces[-1] = pieces[-1][:-1]
                events = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
                for i, call in enumerate(calls or []):
                    events.append({"tool_calls": [{"index": i, **call}]})
                try:
                    for i, delta in enumerate(events):
                        if broken and i == 2:
                            return
                        choice = {"index": 0, "delta": delta, "finish_reason": None}
                        self._event({**base, "choices": [choice]})
                        time.sleep(outer.chunk_delay_s)
                    finish = "tool_calls" if calls else "stop"
                    self._event(
                        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
                    )
                    if (body.get("stream_options") or {}).get("include_usage"):
                        self._event({**base, "choices": [], "usage": usage})
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    return

            def _event(self, obj: dict, name: str | None = None) -> None:
                head = f"event: {name}\n" if name else ""
                self.wfile.write(f"{head}data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()

        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def health(url: str) -> dict[str, Any]:
    """The proxy's /health (`url`: its /v1 URL)."""
    from tests import loopback

    return loopback.get(url.removesuffix("/v1") + "/health", timeout=30).json()


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """`check()`'s first true value, asked every 0.1 s (fails past `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def asker(url: str) -> Callable[[str], str]:
    """`ask(text)` through the proxy at `url` (a FakeUpstream behind it echoes): checks the
    echo, returns the row id the proxy logged it under."""
    import openai

    from selftaught.sleep.intake.proxy import ID_HEADER

    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)

    def ask(text: str) -> str:
        reply = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": text}]
        )
        assert reply.parse().choices[0].message.content == f"echo: {text}"
        return str(reply.headers[ID_HEADER])

    return ask


@contextlib.contextmanager
def fake_proxy(home: Any, log_at: Any, **config: Any) -> Iterator[tuple[str, Any, FakeUpstream]]:
    """`selftaught proxy` for project `demo` (sleep home `home`) in front of a FakeUpstream
    serving `fake-model`; (the proxy's /v1 URL, its app, the upstream). `config`: more
    ProxyConfig fields."""
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background

    with FakeUpstream() as upstream:
        proxy = ProxyConfig(
            upstream=f"{upstream.base_url}#fake-model",
            project="demo",
            port=0,
            log_path=log_at,
            home=home,
            **config,
        )
        with proxy_in_background(proxy) as (url, app):
            yield url, app, upstream
