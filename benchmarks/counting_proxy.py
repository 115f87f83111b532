"""A counting proxy in front of one OpenAI-compatible endpoint, so that every system in a
benchmark is counted the same way: at the endpoint, not by its own bookkeeping.

Each client is pointed at `http://127.0.0.1:PORT/<role>/v1` (role: target, optimizer, eval,
...); the proxy forwards `/<role>/v1/...` to the upstream `/v1/...` unchanged and charges
the request (`sent`), then its answer (`calls` or `errors`), its tokens (from the reply's
`usage`) and its latency to the role. One
normalisation keeps the systems' generation lengths comparable: a request that gives only
`max_completion_tokens` also gets it as `max_tokens` (llama.cpp's server ignores the former
and would generate to the context limit)."""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations
# (`request: Request`, imported inside the app factory) at runtime.

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RoleCount:
    sent: int = 0  # requests received (a client may give up on one before it is answered)
    calls: int = 0  # answered with HTTP 200
    errors: int = 0  # any other answer, or no answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class CallCounter:
    """Thread-safe per-role tally of chat calls."""

    roles: dict[str, RoleCount] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self, role: str) -> None:
        with self._lock:
            self.roles.setdefault(role, RoleCount()).sent += 1

    def record(self, role: str, status: int, body: Any, latency_s: float) -> None:
        usage = body.get("usage") if isinstance(body, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        with self._lock:
            count = self.roles.setdefault(role, RoleCount())
            count.latency_s += latency_s
            if status != 200:
                count.errors += 1
                return
            count.calls += 1
            count.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            count.completion_tokens += int(usage.get("completion_tokens") or 0)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {
                role: {**asdict(c), "latency_s": round(c.latency_s, 3), "tokens": c.tokens}
                for role, c in sorted(self.roles.items())
            }

    def take(self) -> dict[str, dict[str, Any]]:
        """The tally so far, and start again from zero (one tally per benchmarked run)."""
        with self._lock:
            roles, self.roles = self.roles, {}
        return {
            role: {**asdict(c), "latency_s": round(c.latency_s, 3), "tokens": c.tokens}
            for role, c in sorted(roles.items())
        }


def normalise_request(body: Any) -> Any:
    """Copy `max_completion_tokens` into `max_tokens` when only the former is given."""
    if isinstance(body, dict) and "max_tokens" not in body and "max_completion_tokens" in body:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    return body


def create_proxy_app(upstream: str, counter: CallCounter, *, timeout_s: float = 1800.0) -> Any:
    """A FastAPI app forwarding `/<role>/v1/<path>` to `<upstream>/<path>` (upstream ends
    with `/v1`), counting chat completions per role."""
    import httpx
    from fastapi import FastAPI, Request, Response

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    client = httpx.AsyncClient(base_url=upstream.rstrip("/"), timeout=timeout_s)
    passed = ("authorization", "content-type")

    @app.api_route("/{role}/v1/{path:path}", methods=["GET", "POST"])
    async def forward(role: str, path: str, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in passed}
        chat = request.method == "POST" and path.rstrip("/") == "chat/completions"
        t0 = time.perf_counter()
        if request.method == "GET":
            reply = await client.get(f"/{path}", headers=headers)
        elif chat:
            counter.start(role)
            body = normalise_request(await request.json())
            try:
                reply = await client.post(f"/{path}", json=body, headers=headers)
            except httpx.HTTPError:
                counter.record(role, 0, None, time.perf_counter() - t0)
                raise
        else:
            reply = await client.post(f"/{path}", content=await request.body(), headers=headers)
        if chat:
            try:
                parsed = reply.json()
            except ValueError:
                parsed = None
            counter.record(role, reply.status_code, parsed, time.perf_counter() - t0)
        return Response(
            reply.content,
            status_code=reply.status_code,
            media_type=reply.headers.get("content-type", "application/json"),
        )

    return app


@contextlib.contextmanager
def counting_proxy(
    upstream: str, counter: CallCounter, *, startup_timeout_s: float = 30.0
) -> Iterator[str]:
    """Run the proxy on a free loopback port in a thread for the block; yields its root URL
    (`http://127.0.0.1:PORT`): clients use `<root>/<role>/v1`."""
    import uvicorn

    app = create_proxy_app(upstream, counter)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="counting-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the counting proxy did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
