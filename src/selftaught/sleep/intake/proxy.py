"""`selftaught proxy`: an OpenAI-compatible endpoint in front of any model that injects the
adopted skill and logs every exchange. An agent gets sleep by changing its base URL.

- `POST /v1/chat/completions` (streaming and not) and `GET /v1/models` go to the upstream;
  the client's body is forwarded untouched apart from the injected skill (and, when the
  client names no model, the model of the upstream spec; a `local` upstream serves one model,
  so its name is always filled in). Other `/v1/...` routes are passed through without logging.
- The adopted skill and memory (`paths.read_adopted`) are re-read when they change, so a new
  adoption applies from the next request, without a restart.
- Every exchange is logged in the background (`writer.LogWriter`): the messages as the client
  sent them (without the injected skill, tool turns included), the reply, tokens, latency, the
  adopted version; the request's `tools` / `tool_choice` and the reply's `tool_calls` (plain or
  streamed) in their own fields, so the night can replay it as an episode.
  A logging failure never fails or delays the client; it is printed and counted (`/health`).
- Upstream errors are passed through with their status and body, and logged as errors, never
  as tasks; an unreachable upstream is a 502 (504 on timeout), never an invented reply.
- Each response carries `x-selftaught-interaction-id`; `POST /v1/feedback` attaches feedback.
- Probation (`sleep.adoption.probation`): with `auto_rollback` (or a canary) a background
  thread recomputes each version's live record after every feedback and every
  `probation_every` requests, and `auto_rollback` rolls back a version that does worse than
  the one it replaced; `/health` shows the last verdict. `canary_share` tries the staged
  proposal on that share of requests, in shadow or serve mode (`sleep.intake.canary`).
- `require_key` makes clients send `Authorization: Bearer KEY` (any case of `Bearer`); without
  the key `/health` says only `{"status": "ok"}`. The server binds loopback only unless
  `allow_remote`, and every request passes `selftaught.http_guard` (loopback `Host`, JSON
  bodies, `max_body_bytes`). URLs are shown and logged without their `user:password@`.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime.
import asyncio
import contextlib
import hmac
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.errors import BackendError, InputError, RunError, SelftaughtError
from selftaught.http_guard import (
    DEFAULT_MAX_BODY_BYTES,
    LOOPBACK,
    bearer_token,
    install_guard,
    strip_credentials,
)
from selftaught.retrieval import RetrievalUnavailable
from selftaught.sleep.adoption.inject import inject_adopted
from selftaught.sleep.adoption.probation import STAGED, ProbationConfig
from selftaught.sleep.intake.canary import CANARY_MODES, Canary, CanaryError, Staged, start_canary
from selftaught.sleep.intake.log import Feedback, Interaction, LogError, LogUnavailable, TaskLog
from selftaught.sleep.intake.watch import ProbationWatch
from selftaught.sleep.intake.writer import LogWriter
from selftaught.sleep.paths import DEFAULT_PROJECT, check_project, read_adopted

ID_HEADER = "x-selftaught-interaction-id"
_KEEP_HEADERS = ("content-type", "openai-organization", "openai-project", "x-request-id")


class ProxyError(InputError):
    """A proxy that cannot start as configured; the message says why."""


@dataclass
class ProxyConfig:
    upstream: str  # a model spec: http://HOST:PORT/v1#MODEL, openai:NAME, local, local:PATH
    project: str = DEFAULT_PROJECT
    host: str = LOOPBACK
    port: int = 8080
    require_key: str | None = None  # clients must send `Authorization: Bearer <key>`
    allow_remote: bool = False
    log_path: Path | str | None = None  # a file or a postgresql:// URL (default $SELFTAUGHT_LOG)
    api_key: str | None = None  # the upstream's key (openai: defaults to OPENAI_API_KEY)
    timeout_s: float = 600.0  # per upstream request
    inject: bool = True  # inject the adopted skill and memory
    home: Path | None = None  # where adopted skills live (default: sleep_home())
    max_queue: int = 10_000  # log rows waiting to be written before new ones are dropped
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request is refused (413)
    lora: bool = False  # the upstream is vLLM with runtime LoRA: load and route adopted adapters
    auto_rollback: bool = False
    """Roll back to the version the adopted one replaced when probation finds it does worse on
    live traffic (checked in the background after each feedback and every --probation-every
    requests; recorded as an auto_rollback event)."""
    probation_every: int = 25
    """Recompute probation after this many completed requests (and after each feedback), when
    --auto-rollback or a canary is on."""
    probation: ProbationConfig = field(default_factory=ProbationConfig)
    canary_share: float = 0.0
    """Share of requests (0 to 1) that also get the staged proposal's answer (0: no canary)."""
    canary_mode: str = "shadow"
    """shadow: the staged answer is only logged, the client gets the adopted one; serve: the
    client gets the staged answer (feedback on it counts for the proposal)."""
    canary_night: str | None = None
    """The staged night to try (default: the newest staged one, looked up again as nights
    are staged or adopted)."""
    canary_seed: int = 0
    """Seed of the canary draw (the same interaction id is always drawn the same way)."""

    def __post_init__(self) -> None:
        try:
            check_project(self.project)
        except ValueError as err:
            raise ProxyError(str(err)) from None
        if not 0.0 <= self.canary_share <= 1.0:
            raise ProxyError(f"canary_share must be in [0, 1], got {self.canary_share}")
        if self.canary_mode not in CANARY_MODES:
            raise ProxyError(f"canary_mode must be shadow or serve, got {self.canary_mode!r}")
        if self.probation_every < 1:
            raise ProxyError(f"probation_every must be >= 1, got {self.probation_every}")

    @property
    def watched(self) -> bool:
        """Probation runs in the background (auto-rollback, or a canary to compare)."""
        return self.auto_rollback or self.canary_share > 0


# ---- upstreams ----------------------------------------------------------------------------


@dataclass
class Upstream:
    """Where requests go: an httpx client (over the network or in-process) and a base URL."""

    client: Any  # httpx.AsyncClient
    base_url: str
    model: str | None  # filled into a body without `model`
    force_model: bool  # fill it in even when the client named another (a one-model server)
    key: str | None  # sent as the upstream's bearer key
    pass_client_auth: bool  # forward the client's Authorization header
    local: Any = None  # the in-process model (`FollowAdopted`): it can serve a staged adapter

    async def aclose(self) -> None:
        await self.client.aclose()


def in_process_upstream(model: Any, timeout: Any = None) -> Upstream:
    """An upstream answering from `model` in this process, through `selftaught serve`'s app
    (no socket), under the name `serve` gives it."""
    import httpx

    from selftaught.serve import create_app

    name = model.name.split(":")[-1]
    transport = httpx.ASGITransport(app=create_app(model, name))
    client = httpx.AsyncClient(transport=transport, timeout=timeout)
    return Upstream(client, "http://localhost/v1", name, True, None, False, local=model)


def follow_adopted(model: Any, project: str, home: Path | None) -> Any:
    """A local model serves the project's adopted adapter, switching on adopt / rollback."""
    from selftaught.models.local import LocalModel
    from selftaught.sleep.adoption.serving import FollowAdopted

    return FollowAdopted(model, project, home) if isinstance(model, LocalModel) else model


def build_upstream(config: ProxyConfig) -> Upstream:
    import httpx

    from selftaught.models.spec import parse_model_spec

    spec = parse_model_spec(config.upstream)
    timeout = httpx.Timeout(config.timeout_s, connect=10.0, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    if config.lora and not spec.base_url:
        raise ProxyError(
            f"--lora needs a vLLM upstream (http://HOST:PORT/v1#MODEL), not {config.upstream!r}"
        )
    if spec.backend == "local":
        from selftaught.models import load_model

        model = follow_adopted(load_model(config.upstream), config.project, config.home)
        return in_process_upstream(model, timeout)
    if spec.base_url:  # any OpenAI-compatible server
        client = httpx.AsyncClient(timeout=timeout, limits=limits)
        # Without a key of its own the proxy passes the client's on, unless the client's key
        # is the proxy's own (--require-key): that one never leaves.
        own_key = config.api_key
        pass_client = own_key is None and config.require_key is None
        return Upstream(client, spec.base_url, spec.model or None, False, own_key, pass_client)
    key = config.api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ProxyError(
            f"upstream {config.upstream!r} needs an API key: set OPENAI_API_KEY or pass --api-key"
        )
    base = (os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
    client = httpx.AsyncClient(timeout=timeout, limits=limits)
    return Upstream(client, base, spec.model, False, key, False)


# ---- reading a streamed reply as it passes ------------------------------------------------


class StreamAccumulator:
    """Collects the reply from OpenAI server-sent events while the bytes pass unchanged."""

    def __init__(self) -> None:
        self._buffer = b""
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        self.error: str | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("error"):
            self.error = _error_text(event)
        self.model = event.get("model") or self.model
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._tool_call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _tool_call_delta(self, call: dict[str, Any]) -> None:
        """One fragment of a streamed tool call. Fragments of one call share its `index`; a
        server that leaves `index` out starts a new call with each new `id`."""
        index = call.get("index")
        if not isinstance(index, int):
            last = max(self.tool_calls, default=-1)
            fresh = call.get("id") and (last < 0 or self.tool_calls[last]["id"] != call["id"])
            index = last + 1 if fresh or last < 0 else last
        slot = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        slot["id"] = call.get("id") or slot["id"]
        fn = call.get("function") or {}
        for part in ("name", "arguments"):
            if isinstance(fn.get(part), str):
                slot["function"][part] += fn[part]

    def calls(self) -> list[dict[str, Any]] | None:
        """The streamed tool calls in index order (an id the server never sent is left out)."""
        out = []
        for _, slot in sorted(self.tool_calls.items()):
            call = {k: v for k, v in slot.items() if v is not None}
            out.append(call)
        return out or None

    @property
    def text(self) -> str:
        return "".join(self.content)


def _error_text(body: Any) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return json.dumps(body)[:1000] if not isinstance(body, str) else body[:1000]


def _error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status, "param": None}}


# ---- the app ------------------------------------------------------------------------------


class ProxyState:
    """What one running proxy holds: config, upstream, log, writer and counters."""

    def __init__(
        self, config: ProxyConfig, upstream: Upstream, log: TaskLog, canary: Canary | None = None
    ):
        self.config = config
        self.upstream = upstream
        self.log = log
        self.writer = LogWriter(log, max_queue=config.max_queue, home=config.home)
        self.requests = 0
        self.upstream_errors = 0
        self.lora = None
        if config.lora:
            from selftaught.sleep.adoption.serving import LoraRoute

            self.lora = LoraRoute(config.project, config.home, upstream.model)
        self.canary = canary
        self.shadow_tasks: set[asyncio.Task[None]] = set()
        self._staged_upstream: tuple[str, Upstream] | None = None
        self._staged_lock = asyncio.Lock()
        self.watch = (
            ProbationWatch(
                config.project,
                log.path,
                config.home,
                config.probation,
                auto_rollback=config.auto_rollback,
                every=config.probation_every,
            )
            if config.watched
            else None
        )

    def adopted(self) -> Any:
        return read_adopted(self.config.project, self.config.home)

    async def upstream_for(self, staged: Staged | None) -> Upstream:
        """Where a request goes: for a canary request whose staged proposal has an adapter,
        that adapter folded into a copy of the local base (built once per staged night, in a
        worker thread: seconds); else the upstream."""
        if staged is None or staged.adapter is None:
            return self.upstream
        async with self._staged_lock:
            key = str(staged.adapter)
            if self._staged_upstream is None or self._staged_upstream[0] != key:
                from selftaught.models.adapters import with_adapter

                base = getattr(self.upstream.local, "base", self.upstream.local)
                model = await asyncio.to_thread(with_adapter, base, staged.adapter)
                timeout = self.upstream.client.timeout
                self._staged_upstream = (key, in_process_upstream(model, timeout))
            return self._staged_upstream[1]

    def authorized(self, header: str | None) -> bool:
        key = self.config.require_key
        if key is None:
            return True
        return hmac.compare_digest((bearer_token(header) or "").encode(), key.encode())

    def upstream_headers(self, request_headers: Any) -> dict[str, str]:
        headers = {k: request_headers[k] for k in _KEEP_HEADERS if k in request_headers}
        headers.setdefault("content-type", "application/json")
        if self.upstream.key:
            headers["authorization"] = f"Bearer {self.upstream.key}"
        elif self.upstream.pass_client_auth and "authorization" in request_headers:
            headers["authorization"] = request_headers["authorization"]
        return headers

    def stats(self) -> dict[str, Any]:
        adopted = self.adopted()
        return {
            "status": "ok",
            "project": self.config.project,
            "upstream": strip_credentials(self.config.upstream),
            "adopted_version": adopted.version,
            "requests": self.requests,
            "upstream_errors": self.upstream_errors,
            "log": {"path": str(self.log.path), **self.writer.snapshot()},
            "probation": self.watch.snapshot() if self.watch else None,
            "canary": self.canary.snapshot() if self.canary else None,
        }


def create_proxy_app(config: ProxyConfig, *, upstream: Upstream | None = None) -> Any:
    """The FastAPI app; `upstream` defaults to `build_upstream(config)`."""
    from fastapi import FastAPI

    upstream = upstream or build_upstream(config)  # a local model loads on first use
    try:  # a staged adapter on a remote upstream: refused here
        canary = start_canary(config, local=upstream.local is not None)
    except CanaryError as err:
        raise ProxyError(str(err)) from None
    log = TaskLog(config.log_path)  # opening fails loudly at startup, not per request
    state = ProxyState(config, upstream, log, canary)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        if state.shadow_tasks:  # shadow answers still on their way: a few seconds to log them
            await asyncio.wait(set(state.shadow_tasks), timeout=10)
        await state.upstream.aclose()
        await asyncio.to_thread(state.writer.close)
        if state.watch is not None:
            await asyncio.to_thread(state.watch.close)

    app = FastAPI(
        title="selftaught proxy", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.proxy = state
    install_guard(app, allow_remote=config.allow_remote, max_body_bytes=config.max_body_bytes)
    _add_own_routes(app, state)
    _add_forwarding_routes(app, state)
    return app


def _error(status: int, message: str, kind: str, iid: str | None = None) -> Any:
    from fastapi.responses import JSONResponse

    headers = {ID_HEADER: iid} if iid else None
    return JSONResponse(_error_body(message, kind, status), status_code=status, headers=headers)


def _unauthorized() -> Any:
    return _error(
        401, "missing or wrong API key for this proxy (--require-key)", "invalid_request_error"
    )


def _add_own_routes(app: Any, state: ProxyState) -> None:
    """What the proxy answers itself: health, stats, feedback on a logged interaction."""
    from fastapi import Request

    @app.get("/health")
    async def health(request: Request) -> Any:
        if not state.authorized(request.headers.get("authorization")):
            return {"status": "ok"}  # --require-key: the rest is for key holders
        return state.stats()

    @app.get("/v1/selftaught/stats")
    async def stats(request: Request) -> Any:
        if not state.authorized(request.headers.get("authorization")):
            return _unauthorized()
        return state.stats()

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        if not state.authorized(request.headers.get("authorization")):
            return _unauthorized()
        try:
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("id"), str):
                raise InputError("the body must be a JSON object with the interaction `id`")
            fb = Feedback.coerce({k: v for k, v in body.items() if k != "id"})
            full_id = await asyncio.to_thread(_attach_feedback, state, body["id"], fb)
        except LogUnavailable as err:  # the database is down: try again later
            return _error(503, str(err), "service_unavailable_error")
        except LogError as err:
            return _error(404, str(err), "not_found_error")
        except (ValueError, TypeError) as err:
            return _error(400, str(err), "invalid_request_error")
        if state.watch is not None:
            state.watch.poke()  # probation runs in its own thread, after the answer
        return {"id": full_id, "status": "ok"}


def _add_forwarding_routes(app: Any, state: ProxyState) -> None:
    """What goes upstream: chat completions (logged) and every other /v1 route (as is)."""
    from fastapi import Request
    from fastapi.responses import Response

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        if not state.authorized(request.headers.get("authorization")):
            return _unauthorized()
        return await forward_chat(state, request)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def passthrough(path: str, request: Request) -> Any:
        """Everything else (models, embeddings, ...) goes upstream as is, not logged."""
        if not state.authorized(request.headers.get("authorization")):
            return _unauthorized()
        try:
            response = await state.upstream.client.request(
                request.method,
                f"{state.upstream.base_url}/{path}",
                params=dict(request.query_params),
                content=await request.body(),
                headers=state.upstream_headers(request.headers),
            )
        except Exception as err:  # noqa: BLE001
            status, message = _network_error(err)
            return _error(status, message, "upstream_error")
        return Response(
            response.content,
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
        )


def _upstream_body(state: ProxyState, body: dict[str, Any], record: Interaction) -> dict[str, Any]:
    """The client's body with the adopted skill injected (recorded on `record`) and the model
    filled in where the upstream needs it."""
    out = dict(body)
    if state.config.inject:
        staged = state.canary.pick(record.id, "serve") if state.canary else None
        adopted = staged.documents if staged else state.adopted()
        if not adopted.empty:
            out["messages"] = inject_adopted(body.get("messages"), adopted)
        if adopted.version not in (None, "0"):  # an adapter-only version serves it too
            record.skill_version = adopted.version  # probation tallies by it
        if staged is not None and state.canary is not None:
            state.canary.counts["served"] += 1
    upstream = state.upstream
    if upstream.model and (upstream.force_model or not body.get("model")):
        out["model"] = upstream.model
    return out


async def _route_adapter(
    state: ProxyState, request: Any, body: dict[str, Any], upstream_body: dict[str, Any]
) -> dict[str, Any]:
    """With `--lora`, send the request to the adopted adapter's name in vLLM (loading it
    there on first use); a version without an adapter goes to the base model."""
    if state.lora is None:
        return upstream_body
    headers = state.upstream_headers(request.headers)
    routed = await state.lora.model_for(state.upstream.client, state.upstream.base_url, headers)
    return {**upstream_body, "model": routed or body.get("model")}


class _Refused(SelftaughtError):
    """A request the proxy answers itself with an error status (never leaves the proxy)."""

    def __init__(self, status: int, message: str, kind: str = "upstream_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


async def _prepare(
    state: ProxyState, request: Any, body: dict[str, Any], record: Interaction
) -> tuple[Upstream, dict[str, Any]]:
    """Where the request goes and what it says: the skill of the version serving it injected
    (the adopted one, or a canary's staged one), routed to its adapter."""
    try:
        upstream_body = _upstream_body(state, body, record)
    except RetrievalUnavailable as err:  # the adopted skill retrieves demos; bm25s missing
        raise _Refused(500, str(err), "server_error") from None
    try:
        upstream_body = await _route_adapter(state, request, body, upstream_body)
    except BackendError as err:  # vLLM refused the adopted adapter
        raise _Refused(502, str(err)) from None
    staged = None
    if state.canary is not None and (record.skill_version or "").startswith(STAGED):
        staged = state.canary.current()
    try:
        return await state.upstream_for(staged), upstream_body
    except Exception as err:  # noqa: BLE001 - a staged adapter that cannot be served
        raise _Refused(500, f"the staged proposal's adapter: {type(err).__name__}: {err}") from None


async def forward_chat(state: ProxyState, request: Any) -> Any:
    """One chat completion: forward, answer the client (streaming as it arrives), log."""
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    state.requests += 1
    started = time.time()
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        body = f"the request body is not valid JSON: {err}"
    if not isinstance(body, dict):
        message = body if isinstance(body, str) else "the request body must be a JSON object"
        return JSONResponse(_error_body(message, "invalid_request_error", 400), status_code=400)
    record = _new_record(state, body, started)
    try:
        upstream, upstream_body = await _prepare(state, request, body, record)
    except _Refused as err:
        if err.kind != "server_error":
            _finish(state, record, started, error=err.message, status=err.status)
        return JSONResponse(
            _error_body(err.message, err.kind, err.status),
            status_code=err.status,
            headers={ID_HEADER: record.id},
        )
    content = raw if upstream_body == body else json.dumps(upstream_body).encode()
    stream = body.get("stream") is True
    shadow = state.canary.pick(record.id, "shadow") if state.canary else None
    if shadow is not None:
        routed = {**upstream_body, "messages": body.get("messages")}  # the same model / adapter
        _start_shadow(state, routed, record, shadow, state.upstream_headers(request.headers))
    try:
        upstream_request = upstream.client.build_request(
            "POST",
            f"{upstream.base_url}/chat/completions",
            content=content,
            headers=state.upstream_headers(request.headers),
        )
        response = await upstream.client.send(upstream_request, stream=stream)
    except Exception as err:  # noqa: BLE001 - network errors become a 502 / 504, logged
        status, message = _network_error(err)
        _finish(state, record, started, error=message, status=status)
        return JSONResponse(
            _error_body(message, "upstream_error", status),
            status_code=status,
            headers={ID_HEADER: record.id},
        )
    if response.status_code >= 400 or not stream:
        answer = await response.aread() if stream else response.content
        await response.aclose()
        _finish_plain(state, record, started, response.status_code, answer)
        return Response(
            answer,
            status_code=response.status_code,
            media_type=response.headers.get("content-type", "application/json"),
            headers={ID_HEADER: record.id},
        )
    return StreamingResponse(
        _relay(state, record, started, response),
        status_code=response.status_code,
        media_type=response.headers.get("content-type", "text/event-stream"),
        headers={ID_HEADER: record.id, "cache-control": "no-cache"},
    )


def _attach_feedback(state: ProxyState, iid: str, fb: Feedback | None) -> str:
    if fb is None or fb.empty():
        raise InputError("feedback is empty: give a thumb, a score, a reference or a comment")
    # An end user's feedback: never the operator's word (probation and the night tell them
    # apart; the operator gives trusted feedback with `selftaught sleep feedback`).
    if state.writer.unreachable:  # the database is down: say so now, not after a timeout
        raise LogUnavailable(state.writer.unreachable)
    try:
        return state.log.add_feedback(iid, fb, giver="proxy-client", trusted=False)
    except LogUnavailable:
        raise
    except LogError:
        state.writer.flush(5.0)  # the interaction may still be on its way to the log
        return state.log.add_feedback(iid, fb, giver="proxy-client", trusted=False)


def _new_record(state: ProxyState, body: dict[str, Any], started: float) -> Interaction:
    messages = body.get("messages")
    request = {k: v for k, v in body.items() if k not in ("messages", "tools", "tool_choice")}
    tools = body.get("tools")
    return Interaction(
        messages=messages if isinstance(messages, list) else [],
        project=state.config.project,
        source="proxy",
        created_at=started,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        meta={"request": request, "upstream": strip_credentials(state.config.upstream)},
        tools=tools if isinstance(tools, list) and tools else None,
        tool_choice=body.get("tool_choice"),
    )


def _network_error(err: Exception) -> tuple[int, str]:
    import httpx

    if isinstance(err, httpx.TimeoutException):
        return 504, f"the upstream timed out ({type(err).__name__})"
    return 502, strip_credentials(f"the upstream is unreachable: {type(err).__name__}: {err}")


def _finish(
    state: ProxyState,
    record: Interaction,
    started: float,
    *,
    reply: str | None = None,
    error: str | None = None,
    status: int | None = None,
    usage: dict[str, Any] | None = None,
    model: str | None = None,
    tool_calls: Any = None,
    **meta: Any,
) -> None:
    record.latency_s = time.time() - started
    record.reply = reply
    record.tool_calls = tool_calls if isinstance(tool_calls, list) and tool_calls else None
    record.error = error
    record.error_status = status if error else None
    if record.shadow_of is None:  # a shadow answer is not a request the proxy served
        state.upstream_errors += bool(error)
        if state.watch is not None:
            state.watch.request_done()
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")
    record.model = model or record.model
    record.meta.update({k: v for k, v in meta.items() if v is not None})
    state.writer.submit(record)


def _finish_plain(
    state: ProxyState, record: Interaction, started: float, status: int, content: bytes
) -> None:
    try:
        body = json.loads(content)
    except ValueError:
        body = content.decode("utf-8", "replace")
    if status >= 400:
        _finish(state, record, started, error=f"HTTP {status}: {_error_text(body)}", status=status)
        return
    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError):
        _finish(state, record, started, error="the upstream reply has no choices", status=status)
        return
    _finish(
        state,
        record,
        started,
        reply=message.get("content") or "",
        usage=body.get("usage"),
        model=body.get("model"),
        finish_reason=choice.get("finish_reason"),
        tool_calls=message.get("tool_calls") or None,
    )


async def _relay(
    state: ProxyState, record: Interaction, started: float, response: Any
) -> AsyncIterator[bytes]:
    """Pass the upstream's bytes through unchanged; log the accumulated reply at the end, or
    what arrived before the stream broke, as an error."""
    acc = StreamAccumulator()
    failure: str | None = None
    try:
        async for chunk in response.aiter_raw():
            acc.feed(chunk)
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        failure = "the client disconnected before the stream ended"
        raise
    except Exception as err:  # noqa: BLE001 - the upstream broke off
        failure = f"the upstream stream broke: {type(err).__name__}: {err}"
    finally:
        if failure is None and acc.error:
            failure = f"the upstream sent an error in the stream: {acc.error}"
        if failure is None and not acc.done and acc.finish_reason is None:
            failure = "the upstream stream ended without a finish"
        _finish(
            state,
            record,
            started,
            reply=acc.text if failure is None else (acc.text or None),
            error=failure,
            status=response.status_code if failure is None else 502,
            usage=acc.usage,
            model=acc.model,
            finish_reason=acc.finish_reason,
            stream=True,
            tool_calls=acc.calls(),
        )
        with contextlib.suppress(Exception):  # logged first: closing may be cancelled
            await response.aclose()


# ---- canary: the staged proposal's shadow answer -----------------------------------------


def _start_shadow(
    state: ProxyState,
    body: dict[str, Any],
    served: Interaction,
    staged: Staged,
    headers: dict[str, str],
) -> None:
    """Ask for the staged proposal's answer to the same request beside the served one, as a
    task the client never waits for; logged as a shadow row linked to the served one. `body`
    is the served request as routed upstream (its model), with the client's own messages."""
    record = Interaction(
        messages=served.messages,
        project=served.project,
        source=served.source,
        created_at=served.created_at,
        model=served.model,
        meta={**served.meta, "shadow": True},
        tools=served.tools,
        tool_choice=served.tool_choice,
        skill_version=staged.label,
        shadow_of=served.id,
    )
    task = asyncio.get_running_loop().create_task(_shadow(state, body, record, staged, headers))
    state.shadow_tasks.add(task)
    task.add_done_callback(state.shadow_tasks.discard)


async def _shadow(
    state: ProxyState,
    body: dict[str, Any],
    record: Interaction,
    staged: Staged,
    headers: dict[str, str],
) -> None:
    started = time.time()
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        upstream = await state.upstream_for(staged)
        out["messages"] = inject_adopted(body.get("messages"), staged.documents)
        response = await upstream.client.post(
            f"{upstream.base_url}/chat/completions", json=out, headers=headers
        )
    except RetrievalUnavailable as err:
        _finish(state, record, started, error=f"the staged proposal: {err}", status=500)
    except Exception as err:  # noqa: BLE001 - logged on the shadow row, never raised
        status, message = _network_error(err)
        _finish(state, record, started, error=message, status=status)
    else:
        _finish_plain(state, record, started, response.status_code, response.content)
    if state.canary is not None:
        state.canary.counts["shadow"] += 1
        state.canary.counts["shadow_errors"] += record.error is not None


# ---- running --------------------------------------------------------------------------------


def run_proxy(config: ProxyConfig) -> None:
    """Serve until interrupted."""
    from selftaught.serve import check_host, run_uvicorn

    check_host(config.host, config.allow_remote)
    app = create_proxy_app(config)
    run_uvicorn(app, config.host, config.port)


@contextlib.contextmanager
def proxy_in_background(
    config: ProxyConfig, *, upstream: Upstream | None = None, startup_timeout_s: float = 30.0
) -> Iterator[tuple[str, Any]]:
    """Run the proxy in a thread for the block; yields (base URL `http://host:port/v1`, app).
    `config.port = 0` picks a free port. For tests and benchmarks."""
    import uvicorn

    from selftaught.serve import check_host

    check_host(config.host, config.allow_remote)
    app = create_proxy_app(config, upstream=upstream)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="selftaught-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RunError(f"the proxy did not start on {config.host}:{config.port}")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{config.host}:{port}/v1", app
    finally:
        server.should_exit = True
        thread.join(timeout=15)
