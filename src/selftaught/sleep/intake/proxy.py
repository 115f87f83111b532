"""`selftaught proxy`: an endpoint in front of any model that injects the adopted skill and logs
every exchange. An agent gets sleep by changing its base URL.

- It speaks the APIs agents speak (`sleep.intake.proxy_wire`): OpenAI chat completions
  (`POST /v1/chat/completions`), Anthropic Messages (`POST /v1/messages`, Claude Code) and
  OpenAI Responses (`POST /v1/responses`, Codex), streamed and not. Each goes to the same
  path of the upstream; the client's body is forwarded untouched apart from the injected
  skill (and, when the client names no model, the model of the upstream spec; a `local`
  upstream serves one model, so its name is always filled in).
- Only exact routes are relayed (`sleep.intake.proxy_access`): those three, `GET /v1/models`
  and, with `forward_embeddings`, `POST /v1/embeddings`. Anything else is a 404 from the
  proxy. The operator's upstream key goes only with the requests the proxy logs.
- The adopted skill and memory (`paths.read_adopted`) are re-read when they change, so a new
  adoption applies from the next request, without a restart.
- Every exchange is logged in the background (`writer.LogWriter`) in one shape whatever the
  wire format: the messages as the client sent them (without the injected skill, tool turns
  included), the reply, tokens, latency, the adopted version, the client (`client`: a key id
  or label, never the key) and the agent session (`session_id`); the request's `tools` /
  `tool_choice` and the reply's `tool_calls` (plain or streamed) in their own fields, so the
  night can replay it as an episode (a session's turns become one: `sleep.intake.sessions`).
  A logging failure never fails or delays the client; it is printed and counted (`/health`).
  A log that cannot be written now (a Postgres server down, a SQLite file locked for more
  than `LOG_LOCK_WAIT_S`, read-only or on a full disk) is spooled meanwhile (`writer.py`).
  Whatever its bytes, an answered request leaves a row (`sleep.intake.storable`): what the log
  cannot store is replaced where the body or reply is parsed, and a request or reply the proxy
  cannot read is logged as an error row saying why.
- Streams pass through as they arrive: each upstream chunk is yielded at once while an
  accumulator reads the events for the log.
- Upstream errors are passed through with their status and body, and logged as errors, never
  as tasks; an unreachable upstream is a 502 (504 on timeout), never an invented reply.
- Each response carries `x-selftaught-interaction-id`; `POST /v1/feedback` attaches feedback
  to a row (its full id) or to an agent session's last turn (`session_id`): an end user's,
  untrusted, rate limited per client; the operator's with `feedback_key`.
- Probation (`sleep.intake.probation`): with `auto_rollback` (or a canary) a background
  thread recomputes each version's live record after every feedback and every
  `probation_every` requests, and `auto_rollback` rolls back a version that does worse than
  the one it replaced; `/health` shows the last verdict. `canary_share` tries the staged
  proposal on that share of requests, in shadow or serve mode (`sleep.intake.canary`).
- `require_key` / `client_keys` make clients send a key (`Authorization: Bearer KEY` or
  `x-api-key: KEY`); without one `/health` says only `{"status": "ok"}`. The server binds
  loopback only unless `allow_remote`, and every request passes `selftaught.http_guard`
  (loopback `Host`, JSON bodies, `max_body_bytes`, exact routes). URLs are shown and logged
  without their `user:password@`.
- Left running (docs/operations.md): `GET /ready` answers 200 while a new row can be stored
  (in the log, or in the spool while the log is away) and the proxy is not stopping, else 503
  with a fixed reason word; it needs no key and never calls the upstream. A stop (SIGTERM,
  Ctrl-C) closes the port, lets the answers in flight finish for up to `drain_timeout_s`,
  logs any it cut (as errors saying so), then flushes the log.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime.
import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from selftaught.errors import BackendError, InputError, RunError, SelftaughtError
from selftaught.given_keys import MARK, MIN_SECRET_CHARS, add_secret
from selftaught.http_guard import DEFAULT_MAX_BODY_BYTES, LOOPBACK, install_guard, strip_credentials
from selftaught.retrieval import RetrievalUnavailable
from selftaught.sleep.intake.canary import CANARY_MODES, Canary, CanaryError, Staged, start_canary
from selftaught.sleep.intake.log import TRUSTED_WORDS, Interaction, TaskLog
from selftaught.sleep.intake.probation import STAGED, ProbationConfig, auto_rollback_on
from selftaught.sleep.intake.proxy_access import (
    EMBEDDINGS,
    LOGGED_ROUTES,
    AccessError,
    Clients,
    RateLimit,
    error_response,
    presented_keys,
    read_client_keys,
    read_json_body,
    relayed_routes,
    unauthorized,
)
from selftaught.sleep.intake.proxy_feedback import take_feedback
from selftaught.sleep.intake.proxy_replay import relay_night_call
from selftaught.sleep.intake.proxy_wire import (
    ID_HEADER,
    SESSION_HEADERS,
    WIRES,
    Logged,
    Reply,
    Wire,
    error_text,
    session_id,
)
from selftaught.sleep.intake.storable import LOG_ERROR, REPLACED, storable
from selftaught.sleep.intake.watch import ProbationWatch
from selftaught.sleep.intake.writer import LogWriter
from selftaught.sleep.paths import DEFAULT_PROJECT, check_project, read_adopted
from selftaught.sleep.replay_mark import MarkChecker, replay_key

if TYPE_CHECKING:
    from fastapi import FastAPI

    from selftaught.sleep.adoption.inject import RoutedSkill

_KEEP_HEADERS = ("content-type", "accept", "user-agent", "x-request-id", *SESSION_HEADERS)
_WIRE_HEADERS = {"messages": ("anthropic-version", "anthropic-beta"), "responses": ("openai-beta",)}
_ORG_HEADERS = ("openai-organization", "openai-project")
ANTHROPIC_VERSION = "2023-06-01"  # sent to an Anthropic upstream when the client sends none
SHORTCUTS = {
    "anthropic": ("https://api.anthropic.com/v1", "ANTHROPIC_API_KEY"),
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
}
"""`--upstream anthropic` / `openai`: the vendor's API, its key from the environment (or
`--api-key`); without one the client's own key is passed on. The client's model passes."""
LOG_LOCK_WAIT_S = 2.0
"""How long a write to a SQLite log waits for another process's lock (a night, a forget, a
backup) before its rows go to the spool; opening the log waits as long as any command."""
SHUTDOWN_CUT = "the proxy stopped before the stream ended (drain timeout)"


class ProxyError(InputError):
    """A proxy that cannot start as configured; the message says why."""


@dataclass
class ProxyConfig:
    upstream: str
    """A model spec (http://HOST:PORT/v1#MODEL, openai:NAME, local, local:PATH), a server
    root that gets the client's model (http://HOST:PORT), or `anthropic` / `openai`."""
    project: str = DEFAULT_PROJECT
    host: str = LOOPBACK
    port: int = 8080
    require_key: str | None = None  # clients must send this key (Bearer or x-api-key)
    client_keys: Path | None = None
    """A JSON or TOML file mapping client labels to keys (`alice = "KEY"`): each key is
    accepted, and the rows of its requests record the label as their client."""
    trusted_clients: tuple[str, ...] | None = None
    """Clients whose own words count as the operator's (labels of --client-keys; `*`: every
    client, for a one-person deployment): a correction they make in the next turn of a
    conversation may then become a demonstration, a rule they restate a check. Name only
    clients whose every end user is the operator."""
    feedback_key: str | None = None
    """The operator's key for POST /v1/feedback: feedback sent with it is trusted (giver
    `operator`) and not rate limited. It opens nothing else."""
    feedback_per_minute: float = 30.0
    """Feedback each client may send per minute (a token bucket as large; 429 beyond)."""
    max_feedback_bytes: int = 16_384  # a larger POST /v1/feedback body is refused (413)
    max_comment_bytes: int = 4096  # a longer feedback comment is refused (413)
    forward_embeddings: bool = False
    """Relay POST /v1/embeddings to the upstream (with the client's own key, never the
    operator's; not logged)."""
    forward_org_headers: bool = False
    """Pass the client's openai-organization / openai-project headers to the upstream."""
    allow_remote: bool = False
    log_path: Path | str | None = None  # a file or a postgresql:// URL (default $SELFTAUGHT_LOG)
    api_key: str | None = None  # the upstream's key (else ANTHROPIC_ / OPENAI_API_KEY: SHORTCUTS)
    timeout_s: float = 600.0  # per upstream request
    inject: bool = True  # inject the adopted skill and memory
    home: Path | None = None  # where adopted skills live (default: sleep_home())
    max_queue: int = 10_000  # log rows waiting to be written before new ones are dropped
    drain_timeout_s: int = 60
    """On a stop (SIGTERM, Ctrl-C): seconds the answers in flight get to finish once the port
    is closed; past it they are cut and logged as errors. Set a service manager's stop timeout
    above it (`--print-systemd` does)."""
    log_wait_s: float = 5.0
    """How long an answer's last byte waits for its row to be stored (or spooled): a proxy
    killed at any moment then leaves no answered request out of the log. Past it the answer
    goes out anyway and /health counts it (`answered_before_logged`)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request is refused (413)
    lora: bool = False  # the upstream is vLLM with runtime LoRA: load and route adopted adapters
    max_adapters: int = 4
    """A local upstream: adapters kept merged and resident at once (the project's, each
    routed skill's, a canary's), each a copy of the base weights; the least recently used
    goes first and is merged again when next asked for."""
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
        if not self.log_wait_s > 0:
            raise ProxyError(f"log_wait_s must be > 0, got {self.log_wait_s}")
        if not self.drain_timeout_s >= 0:
            raise ProxyError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.max_adapters < 1:
            raise ProxyError(f"max_adapters must be >= 1, got {self.max_adapters}")
        self.trusted_clients = tuple(self.trusted_clients or ())
        named = [c for c in self.trusted_clients if c != "*"]
        if named and self.client_keys is None:
            raise ProxyError(
                "--trusted-clients names clients, which only --client-keys can tell apart "
                "(without keys a client id is a claim); use '*' for a one-person deployment"
            )
        if not self.feedback_per_minute > 0:
            raise ProxyError(f"feedback_per_minute must be > 0, got {self.feedback_per_minute}")
        if self.feedback_key is not None and self.feedback_key == self.require_key:
            raise ProxyError("the feedback key must differ from the clients' key")

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
    local: Any = None  # the in-process model (`FollowAdopted`): its shelf serves other adapters

    async def aclose(self) -> None:
        await self.client.aclose()


def in_process_upstream(model: Any, timeout: Any = None, name: str | None = None) -> Upstream:
    """An upstream answering from `model` in this process, through `selftaught serve`'s app
    (no socket), under `name` (default: the name `serve` gives it)."""
    import httpx

    from selftaught.serve import create_app

    name = name or model.name.split(":")[-1]
    transport = httpx.ASGITransport(app=create_app(model, name))
    client = httpx.AsyncClient(transport=transport, timeout=timeout)
    return Upstream(client, "http://localhost/v1", name, True, None, False, local=model)


def follow_adopted(model: Any, project: str, home: Path | None, max_adapters: int = 4) -> Any:
    """A local model serves the project's adopted adapter, switching on adopt / rollback."""
    from selftaught.models.local import LocalModel
    from selftaught.sleep.adoption.serving import FollowAdopted

    if not isinstance(model, LocalModel):
        return model
    return FollowAdopted(model, project, home, max_adapters)


def build_upstream(config: ProxyConfig) -> Upstream:
    import httpx

    from selftaught.models.spec import parse_model_spec

    timeout = httpx.Timeout(config.timeout_s, connect=10.0, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    # Without a key of its own the proxy passes the client's on, unless the client's key is
    # one of the proxy's own (--require-key, --client-keys): those never leave.
    keyed = config.require_key is not None or config.client_keys is not None
    if config.upstream.strip() in SHORTCUTS:
        base, env = SHORTCUTS[config.upstream.strip()]
        key = config.api_key or os.environ.get(env) or None
        add_secret(key)  # cut from every row the proxy logs
        client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return Upstream(client, base, None, False, key, key is None and not keyed)
    spec = parse_model_spec(config.upstream)
    if spec.backend in ("anthropic", "gemini"):  # clients of a vendor's SDK, not a wire to relay
        raise ProxyError(
            f"upstream {config.upstream!r} is a client spec (eval, optimize, nights); the proxy "
            "relays a wire: use --upstream anthropic (the Messages API, the client's model) or "
            "an OpenAI-compatible URL"
        )
    if config.lora and not spec.base_url:
        raise ProxyError(
            f"--lora needs a vLLM upstream (http://HOST:PORT/v1#MODEL), not {config.upstream!r}"
        )
    if spec.backend == "local":
        from selftaught.models import load_model

        loaded = load_model(config.upstream)
        model = follow_adopted(loaded, config.project, config.home, config.max_adapters)
        return in_process_upstream(model, timeout)
    if spec.base_url:  # any OpenAI-compatible server; a bare http://HOST:PORT serves /v1/...
        base = spec.base_url
        if not urlsplit(base).path.strip("/"):
            base += "/v1"
        client = httpx.AsyncClient(timeout=timeout, limits=limits)
        own_key = config.api_key
        add_secret(own_key)
        return Upstream(
            client, base, spec.model or None, False, own_key, own_key is None and not keyed
        )
    key = config.api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ProxyError(
            f"upstream {config.upstream!r} needs an API key: set OPENAI_API_KEY or pass --api-key"
        )
    add_secret(key)
    base = (os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
    client = httpx.AsyncClient(timeout=timeout, limits=limits)
    return Upstream(client, base, spec.model, False, key, False)


# ---- the app ------------------------------------------------------------------------------


class ProxyState:
    """What one running proxy holds: config, upstream, log, writer and counters."""

    def __init__(
        self,
        config: ProxyConfig,
        upstream: Upstream,
        log: TaskLog,
        canary: Canary | None = None,
        clients: Clients | None = None,
    ):
        self.config = config
        self.upstream = upstream
        self.log = log
        self.clients = clients or Clients(config.require_key, None, config.feedback_key)
        self.feedback_limit = RateLimit(config.feedback_per_minute)
        self.writer = LogWriter(log, max_queue=config.max_queue, home=config.home)
        self.requests = 0
        self.upstream_errors = 0
        self.answered_before_logged = 0  # answers that outwaited `log_wait_s`
        # the night's mark: relayed, never logged
        self.night_marks = MarkChecker(_replay_key(config.home), config.project)
        self.night_replays = 0
        self.replaced_chars = 0  # characters `storable` replaced in requests and replies
        self.malformed_events = 0  # stream events of no shape the API has (skipped)
        self.rows_not_read = 0  # rows logged as errors: the request or reply was unreadable
        self.draining = False  # a stop began: the port is closed, answers in flight finish
        self.in_flight = 0  # streams whose row is not handed to the writer yet
        self.lora = None
        if config.lora:
            from selftaught.sleep.adoption.serving import LoraRoute

            self.lora = LoraRoute(config.project, config.home, upstream.model)
        self.canary = canary
        self.shadow_tasks: set[asyncio.Task[None]] = set()
        self.shelf = _shelf(upstream.local, config.max_adapters)
        self._adapter_upstreams: dict[str, tuple[Any, Upstream]] = {}
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
        self._probed: int | None = None  # the version `probation_watch` last looked up

    def adopted(self) -> Any:
        return read_adopted(self.config.project, self.config.home)

    def probation_watch(self) -> ProbationWatch | None:
        """The watch, started on the first request a version on probation with
        auto-rollback by default serves (adopted from a `--no-val` night) when neither
        --auto-rollback nor a canary started it; looked up once per adopted version. The
        version is the one served (`adopted`: cached, polled with a Postgres log), never a
        fresh read: this runs on every request, and a database that does not answer must
        not hold each one for the pool's timeout."""
        if self.watch is not None:
            return self.watch
        config = self.config
        version = self.adopted().number
        if version != self._probed:
            self._probed = version
            if auto_rollback_on(config.project, version, config.home):
                self.watch = ProbationWatch(config.project, self.log.path, config.home,
                                            config.probation, auto_rollback=False,
                                            every=config.probation_every)  # fmt: skip
        return self.watch

    async def upstream_for(self, adapter: Path | None) -> Upstream:
        """Where a request served with `adapter` goes (a routed skill's or a canary's): that
        adapter's copy of the local base from the shelf (merged once, in a worker thread:
        seconds), behind an in-process upstream of its own; None, or no local model: the
        upstream (a local one follows the project's adopted adapter)."""
        if adapter is None or self.shelf is None:
            return self.upstream
        model = await self.shelf.aget(adapter)
        key = self.shelf.key(adapter)
        found = self._adapter_upstreams.get(key)
        if found is None or found[0] is not model:  # served under the upstream's own name
            made = in_process_upstream(model, self.upstream.client.timeout, self.upstream.model)
            found = self._adapter_upstreams[key] = (model, made)
        for gone in set(self._adapter_upstreams) - {key, *self.shelf.keys()}:
            del self._adapter_upstreams[gone]  # evicted from the shelf: let its copy go
        return found[1]

    def upstream_headers(
        self, request_headers: Any, wire: Wire | None = None, *, logged: bool = True
    ) -> dict[str, str]:
        """What goes upstream: a few of the client's headers (the wire format's own, the org
        headers only with `forward_org_headers`) and a key: the operator's with the requests
        the proxy logs (`logged`), else the client's own where the proxy passes it on."""
        names = _KEEP_HEADERS + _WIRE_HEADERS.get(wire.name if wire else "", ())
        if self.config.forward_org_headers:
            names += _ORG_HEADERS
        headers = {k: request_headers[k] for k in names if k in request_headers}
        headers.setdefault("content-type", "application/json")
        headers["accept-encoding"] = "identity"  # relayed bytes are read as they pass
        anthropic = wire is not None and wire.name == "messages"
        if self.upstream.key and logged:
            if anthropic:
                headers["x-api-key"] = self.upstream.key
                headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
            else:
                headers["authorization"] = f"Bearer {self.upstream.key}"
        elif self.upstream.pass_client_auth:
            for name in ("authorization", "x-api-key"):
                value = request_headers.get(name)
                if value and not any(
                    self.clients.own_key(k) for k in presented_keys({name: value})
                ):
                    headers[name] = value
        return headers

    def not_ready(self) -> str | None:
        """Why a load balancer should send nothing here now, as one fixed word (None: ready):
        the proxy is stopping, or a new row could be stored neither in the log nor in the
        spool. The upstream is not called (its failures are each request's 502)."""
        return "draining" if self.draining else self.writer.not_ready()

    def stats(self) -> dict[str, Any]:
        adopted = self.adopted()
        not_ready = self.not_ready()
        return {
            "status": "ok",
            "ready": not_ready is None,
            "not_ready": not_ready,
            "project": self.config.project,
            "upstream": strip_credentials(self.config.upstream),
            "adopted_version": adopted.version,
            "requests": self.requests,
            "upstream_errors": self.upstream_errors,
            "answered_before_logged": self.answered_before_logged,
            "night_replays": self.night_replays,
            "replaced_chars": self.replaced_chars,
            "malformed_events": self.malformed_events,
            "rows_not_read": self.rows_not_read,
            "log": {"path": str(self.log.path), **self.writer.snapshot()},
            "probation": self.watch.snapshot() if self.watch else None,
            "canary": self.canary.snapshot() if self.canary else None,
        }


def _shelf(local: Any, max_adapters: int) -> Any:
    """The shelf of adapters a local upstream serves from (its `FollowAdopted`'s); None for
    an upstream elsewhere (vLLM serves adapters with --lora, others none)."""
    if local is None:
        return None
    found = getattr(local, "shelf", None)
    if found is not None:
        return found
    from selftaught.sleep.adoption.serving import AdapterShelf

    return AdapterShelf(local, max_adapters)


def _replay_key(home: Path | None) -> bytes | None:
    """The home's replay key; None (every request is traffic) when it cannot be had."""
    try:
        return replay_key(home)
    except (OSError, SelftaughtError) as err:
        print(f"selftaught proxy: no replay key, a night's calls will be logged: {err}")
        return None


def create_proxy_app(config: ProxyConfig, *, upstream: Upstream | None = None) -> Any:
    """The FastAPI app; `upstream` defaults to `build_upstream(config)`."""
    from fastapi import FastAPI

    try:
        keys = read_client_keys(config.client_keys) if config.client_keys else None
    except AccessError as err:
        raise ProxyError(str(err)) from None
    clients = Clients(config.require_key, keys, config.feedback_key)
    if config.feedback_key and clients.labels.get(config.feedback_key):
        raise ProxyError("the feedback key must differ from every client key")
    upstream = upstream or build_upstream(config)  # a local model loads on first use
    try:  # a staged adapter on a remote upstream: refused here
        canary = start_canary(config, local=upstream.local is not None)
    except CanaryError as err:
        raise ProxyError(str(err)) from None
    # opening fails loudly at startup, not per request; later writes wait briefly for a lock
    log = TaskLog(config.log_path, write_timeout_s=LOG_LOCK_WAIT_S)
    state = ProxyState(config, upstream, log, canary, clients)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        state.draining = True
        for _ in range(50):  # answers cut at the drain timeout: their rows are on their way
            if not state.in_flight:
                break
            await asyncio.sleep(0.02)
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
    install_guard(
        app,
        allow_remote=config.allow_remote,
        max_body_bytes=config.max_body_bytes,
        routes=relayed_routes(config.forward_embeddings),
    )
    _add_own_routes(app, state)
    _add_forwarding_routes(app, state)
    return app


def _add_own_routes(app: "FastAPI", state: ProxyState) -> None:
    """What the proxy answers itself: health, stats, feedback on a logged interaction."""
    from fastapi import Request

    def key_holder(request: Request) -> bool:
        if state.clients.is_operator(request.headers):
            return True
        return state.clients.identify(request.headers) is not None

    @app.get("/health")
    async def health(request: Request) -> Any:
        if not key_holder(request):
            return {"status": "ok"}  # a key is required: the rest is for key holders
        return state.stats()

    @app.get("/ready")
    async def ready() -> Any:
        from fastapi.responses import JSONResponse

        reason = state.not_ready()
        if reason is None:
            return {"status": "ready"}
        return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)

    @app.get("/v1/selftaught/stats")
    async def stats(request: Request) -> Any:
        if not key_holder(request):
            return unauthorized()
        return state.stats()

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        return await take_feedback(state, request)


def _add_forwarding_routes(app: "FastAPI", state: ProxyState) -> None:
    """What goes upstream: the model APIs (logged), the models list and, when the operator
    asks, embeddings (as is, with the client's own key)."""
    from fastapi import Request

    def endpoint(wire: Wire) -> Any:
        async def model_call(request: Request) -> Any:
            client = state.clients.identify(request.headers)
            if client is None:
                return unauthorized()
            return await forward(state, request, wire, client)

        return model_call

    for path, wire_name in LOGGED_ROUTES.items():
        app.add_api_route(path, endpoint(WIRES[wire_name]), methods=["POST"], name=wire_name)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if state.clients.identify(request.headers) is None:
            return unauthorized()
        upstream = state.upstream
        if upstream.model and upstream.key:  # the pinned model: the operator's key stays home
            card = {"id": upstream.model, "object": "model", "owned_by": "selftaught"}
            return {"object": "list", "data": [card]}
        return await _pass_through(state, request, "models")

    if state.config.forward_embeddings:

        @app.post(EMBEDDINGS[1])
        async def embeddings(request: Request) -> Any:
            if state.clients.identify(request.headers) is None:
                return unauthorized()
            return await _pass_through(state, request, "embeddings")


async def _pass_through(state: ProxyState, request: Any, path: str) -> Any:
    """A route the proxy relays without logging: never with the operator's key."""
    from fastapi.responses import Response

    try:
        response = await state.upstream.client.request(
            request.method,
            f"{state.upstream.base_url}/{path}",
            params=dict(request.query_params),
            content=await request.body(),
            headers=state.upstream_headers(request.headers, logged=False),
        )
    except Exception as err:  # noqa: BLE001
        status, message = _networkerror_response(err)
        return error_response(status, message, "upstream_error")
    return Response(
        response.content,
        status_code=response.status_code,
        media_type=response.headers.get("content-type"),
    )


def _upstream_body(
    state: ProxyState, wire: Wire, body: dict[str, Any], record: Interaction
) -> tuple[dict[str, Any], "RoutedSkill | None"]:
    """The client's body with the adopted skill injected (recorded on `record`) and the model
    filled in where the upstream needs it; the skill the request was routed to (None: none)."""
    out = dict(body)
    routed = None
    if state.config.inject:
        staged = state.canary.pick(record.id, "serve") if state.canary else None
        adopted = staged.documents if staged else state.adopted()
        routed = _route_skill(state, record)
        if not adopted.empty or routed is not None:
            out = wire.inject(out, adopted, routed)
        if adopted.version not in (None, "0"):  # an adapter-only version serves it too
            record.skill_version = adopted.version  # probation tallies by it
        if staged is not None and state.canary is not None:
            state.canary.counts["served"] += 1
    upstream = state.upstream
    if upstream.model and (upstream.force_model or not body.get("model")):
        out["model"] = upstream.model
    return out, routed


def _route_skill(state: ProxyState, record: Interaction) -> "RoutedSkill | None":
    """Many skills: the project's adopted skill the request routes to (None: none fits, or
    none is adopted), the decision logged on the row (`meta["skill_route"]`)."""
    from selftaught.sleep.adoption.skill_units import route_request

    routed, decision = route_request(state.config.project, state.config.home, record.messages)
    if decision is not None:
        record.meta["skill_route"] = decision.to_dict()
    return routed


async def _route_adapter(
    state: ProxyState,
    request: Any,
    body: dict[str, Any],
    upstream_body: dict[str, Any],
    skill: "RoutedSkill | None",
) -> dict[str, Any]:
    """With `--lora`, send the request to its adapter's name in vLLM (loading it there on
    first use): the routed skill's, else the project's adopted one; a version without an
    adapter goes to the base model."""
    if state.lora is None:
        return upstream_body
    headers = state.upstream_headers(request.headers)
    upstream = state.upstream
    named = await state.lora.model_for(upstream.client, upstream.base_url, headers, skill)
    return {**upstream_body, "model": named or body.get("model")}


class _Refused(SelftaughtError):
    """A request the proxy answers itself with an error status (never leaves the proxy)."""

    def __init__(self, status: int, message: str, kind: str = "upstream_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


async def _prepare(
    state: ProxyState, request: Any, wire: Wire, body: dict[str, Any], record: Interaction
) -> tuple[Upstream, dict[str, Any]]:
    """Where the request goes and what it says: the skill of the version serving it injected
    (the adopted one, or a canary's staged one) and its routed skill's, sent to its adapter:
    the routed skill's when that skill's version has one, else the project's (a canary's
    staged one, else the adopted one)."""
    try:
        upstream_body, routed = _upstream_body(state, wire, body, record)
    except RetrievalUnavailable as err:  # the adopted skill retrieves demos; bm25s missing
        raise _Refused(500, str(err), "server_error") from None
    except Exception as err:  # noqa: BLE001 - fields of types no API has: refused, logged
        why = f"the proxy could not read the request: {type(err).__name__}: {err}"
        raise _Refused(400, why, "invalid_request_error") from None
    try:
        upstream_body = await _route_adapter(state, request, body, upstream_body, routed)
    except BackendError as err:  # vLLM refused the adopted adapter
        raise _Refused(502, str(err)) from None
    adapter, whose = (routed.adapter, f"skill {routed.name}'s") if routed else (None, "")
    canary = (record.skill_version or "").startswith(STAGED)
    if adapter is None and state.canary is not None and canary:
        staged = state.canary.current()
        adapter, whose = (staged.adapter if staged else None), "the staged proposal's"
    try:
        return await state.upstream_for(adapter), upstream_body
    except Exception as err:  # noqa: BLE001 - an adapter that cannot be served
        raise _Refused(500, f"{whose} adapter: {type(err).__name__}: {err}") from None


async def forward(state: ProxyState, request: Any, wire: Wire, client: str) -> Any:
    """One model call in `wire`'s format: forward, answer the client (streaming as it
    arrives), log."""
    from fastapi.responses import Response, StreamingResponse

    state.requests += 1
    started = time.time()
    raw, body = await read_json_body(request)
    if isinstance(body, str):
        return error_response(400, body, "invalid_request_error")
    if state.night_marks.accepts(request.headers, request.url.path, raw):  # the night's own
        return await relay_night_call(state, request, wire, raw, body)
    body, replaced = storable(body)  # what the log cannot store, replaced before any reads it
    record = _new_record(state, wire, body, started, client, request.headers)
    _count_replaced(state, record, replaced)
    try:
        upstream, upstream_body = await _prepare(state, request, wire, body, record)
    except _Refused as err:
        if err.kind != "server_error":
            await _stored(
                state, _finish(state, record, started, error=err.message, status=err.status)
            )
        return error_response(err.status, err.message, err.kind, record.id)
    content = raw if upstream_body == body else json.dumps(upstream_body).encode()
    stream = body.get("stream") is True
    headers = state.upstream_headers(request.headers, wire)
    shadow = state.canary.pick(record.id, "shadow") if state.canary else None
    if shadow is not None:  # the client's own body, routed to the same model / adapter
        routed = {**body, "model": upstream_body.get("model")}
        _start_shadow(state, wire, routed, record, shadow, headers)
    try:
        upstream_request = upstream.client.build_request(
            "POST",
            f"{upstream.base_url}/{wire.path}",
            params=dict(request.query_params),
            content=content,
            headers=headers,
        )
        response = await upstream.client.send(upstream_request, stream=stream)
    except Exception as err:  # noqa: BLE001 - network errors become a 502 / 504, logged
        status, message = _networkerror_response(err)
        await _stored(state, _finish(state, record, started, error=message, status=status))
        return error_response(status, message, "upstream_error", record.id)
    if response.status_code >= 400 or not stream:
        answer = await response.aread() if stream else response.content
        answer = without_keys(answer, presented_keys(headers))
        await response.aclose()
        await _stored(
            state, _finish_plain(state, wire, record, started, response.status_code, answer)
        )
        return Response(
            answer,
            status_code=response.status_code,
            media_type=response.headers.get("content-type", "application/json"),
            headers={ID_HEADER: record.id},
        )
    return StreamingResponse(
        _relay(state, wire, record, started, response),
        status_code=response.status_code,
        media_type=response.headers.get("content-type", "text/event-stream"),
        headers={ID_HEADER: record.id, "cache-control": "no-cache"},
    )


# ---- logging ----------------------------------------------------------------------------------


def _new_record(
    state: ProxyState, wire: Wire, body: dict[str, Any], started: float, client: str, headers: Any
) -> Interaction:
    """The row of a request, its reply still to come. A body the log cannot read (fields of
    types no API has) still gets a row: without its messages, an error row saying why."""
    try:
        logged, session = wire.logged(body), session_id(headers, body)
        unread = None
    except Exception as err:  # noqa: BLE001 - the request is still answered and logged
        logged, session = Logged([], None, None, {}), None
        unread = f"the proxy could not read the request: {type(err).__name__}: {err}"
    meta: dict[str, Any] = {
        "request": logged.request,
        "upstream": strip_credentials(state.config.upstream),
    }
    if wire.name != "chat":
        meta["wire"] = wire.name
    if logged.hosted_tools:
        meta["hosted_tools"] = logged.hosted_tools
    trusted = state.config.trusted_clients or ()
    if "*" in trusted or client in trusted:
        meta[TRUSTED_WORDS] = True
    if unread:
        meta[LOG_ERROR] = unread
    return Interaction(
        messages=logged.messages,
        project=state.config.project,
        source="proxy",
        created_at=started,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        meta=meta,
        tools=logged.tools,
        tool_choice=logged.tool_choice,
        client=client,
        session_id=session,
    )


def _count_replaced(state: ProxyState, record: Interaction, replaced: int) -> None:
    """Characters `storable` replaced in what this row logs: on the row and on /health."""
    if replaced:
        record.meta[REPLACED] = int(record.meta.get(REPLACED) or 0) + replaced
        state.replaced_chars += replaced


def without_keys(content: bytes, keys: list[str]) -> bytes:
    """An upstream's answer with the keys it was sent cut out: a server may quote the key in
    a 401, and the operator's key must never reach a client (nor either key the log)."""
    for key in keys:
        if len(key) >= MIN_SECRET_CHARS and key.encode() in content:
            content = content.replace(key.encode(), MARK.format("api_key").encode())
    return content


def _networkerror_response(err: Exception) -> tuple[int, str]:
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
) -> Future[str]:
    """Complete the row and hand it to the writer; the future says when it is stored. The one
    path every row takes; it never raises: a row whose request or reply the log could not
    read goes in as an error row saying why (`meta["log_error"]`)."""
    record.latency_s = time.time() - started
    record.reply = reply
    record.tool_calls = tool_calls if isinstance(tool_calls, list) and tool_calls else None
    record.error = error
    record.error_status = status if error else None
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")
    record.model = model or record.model
    record.meta.update({k: v for k, v in meta.items() if v is not None})
    if record.shadow_of is None:  # a shadow answer is not a request the proxy served
        state.upstream_errors += bool(error)
        with contextlib.suppress(Exception):  # probation never costs a row
            if (watch := state.probation_watch()) is not None:
                watch.request_done()
    if record.error is None and record.meta.get(LOG_ERROR):
        record.error = str(record.meta[LOG_ERROR])
        state.rows_not_read += 1
    return state.writer.submit(record)


def _unread(
    state: ProxyState, record: Interaction, started: float, what: str, err: Exception, **kw: Any
) -> Future[str]:
    """The row of an exchange whose `what` the log could not read: an error row saying why
    (the client's answer is not touched)."""
    record.meta[LOG_ERROR] = f"the proxy could not read {what}: {type(err).__name__}: {err}"
    return _finish(state, record, started, **kw)


async def _stored(state: ProxyState, outcome: Future[str]) -> None:
    """Wait until the row is in the log (or the spool) before the answer completes."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(outcome), state.config.log_wait_s)
    except asyncio.TimeoutError:
        state.answered_before_logged += 1


def _finish_reply(
    state: ProxyState, record: Interaction, started: float, reply: Reply, **meta: Any
) -> Future[str]:
    return _finish(
        state,
        record,
        started,
        reply=reply.text,
        usage=reply.usage,
        model=reply.model,
        finish_reason=reply.finish_reason,
        tool_calls=reply.tool_calls,
        **meta,
    )


def _finish_plain(
    state: ProxyState, wire: Wire, record: Interaction, started: float, status: int, content: bytes
) -> Future[str]:
    try:
        body: Any = json.loads(content)
    except (ValueError, RecursionError):
        body = content.decode("utf-8", "replace")
    try:
        body, replaced = storable(body)
        _count_replaced(state, record, replaced)
        if status >= 400:
            why = f"HTTP {status}: {error_text(body)}"
            return _finish(state, record, started, error=why, status=status)
        reply = wire.reply(body)
    except Exception as err:  # noqa: BLE001 - a reply of no shape the API has
        failed = f"HTTP {status}" if status >= 400 else None
        return _unread(
            state, record, started, "the upstream reply", err, error=failed, status=status
        )
    if reply.error is not None:
        return _finish(state, record, started, error=reply.error, status=status)
    return _finish_reply(state, record, started, reply)


async def _relay(
    state: ProxyState, wire: Wire, record: Interaction, started: float, response: Any
) -> AsyncIterator[bytes]:
    """Pass the upstream's bytes through unchanged, each chunk as it arrives. The reply is
    stored before the answer completes: before the chunk with the stream's end event leaves
    (or, for a server that sends none, before the response ends). A stream that breaks is
    logged with what arrived before it broke, as an error."""
    acc = wire.stream()
    failure: str | None = None
    logged = False
    state.in_flight += 1  # a stop's lifespan waits for this row (`create_proxy_app`)
    try:
        async for chunk in response.aiter_raw():
            acc.feed(chunk)  # never raises: a malformed event is counted, the bytes pass
            if acc.done and not logged:
                outcome = _finish_stream(state, record, started, acc, None)  # never raises
                logged = True
                await _stored(state, outcome)
            yield chunk
        if not logged:
            outcome = _finish_stream(state, record, started, acc, None)
            logged = True
            await _stored(state, outcome)
    except (asyncio.CancelledError, GeneratorExit):
        cut = state.draining
        failure = SHUTDOWN_CUT if cut else "the client disconnected before the stream ended"
        raise
    except Exception as err:  # noqa: BLE001 - the upstream broke off
        failure = f"the upstream stream broke: {type(err).__name__}: {err}"
    finally:
        if not logged:
            _finish_stream(state, record, started, acc, failure)
        state.in_flight -= 1
        with contextlib.suppress(Exception):  # logged first: closing may be cancelled
            await response.aclose()


def _finish_stream(
    state: ProxyState, record: Interaction, started: float, acc: Any, failure: str | None
) -> Future[str]:
    """Log a stream: its reply, or as an error what arrived before it failed."""
    _count_replaced(state, record, acc.replaced)
    if acc.malformed:
        record.meta["malformed_events"] = acc.malformed
        state.malformed_events += acc.malformed
    try:
        reply = acc.result()
    except Exception as err:  # noqa: BLE001 - events of no shape the API has
        return _unread(
            state,
            record,
            started,
            "the upstream stream",
            err,
            error=failure,
            status=502 if failure else None,
            stream=True,
        )
    if failure is None and reply.error:
        failure = f"the upstream sent an error in the stream: {reply.error}"
    if failure is None and not acc.finished:
        failure = "the upstream stream ended without a finish"
    if failure is None:
        return _finish_reply(state, record, started, reply, stream=True)
    return _finish(
        state,
        record,
        started,
        reply=reply.text or None,
        error=failure,
        status=502,
        usage=reply.usage,
        model=reply.model,
        finish_reason=reply.finish_reason,
        stream=True,
        tool_calls=reply.tool_calls,
    )


# ---- canary: the staged proposal's shadow answer -----------------------------------------


def _start_shadow(
    state: ProxyState,
    wire: Wire,
    body: dict[str, Any],
    served: Interaction,
    staged: Staged,
    headers: dict[str, str],
) -> None:
    """Ask for the staged proposal's answer to the same request beside the served one, as a
    task the client never waits for; logged as a shadow row linked to the served one. `body`
    is the client's request as routed upstream (its model)."""
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
        client=served.client,
        session_id=served.session_id,
    )
    task = asyncio.get_running_loop().create_task(
        _shadow(state, wire, body, record, staged, headers)
    )
    state.shadow_tasks.add(task)
    task.add_done_callback(state.shadow_tasks.discard)


async def _shadow(
    state: ProxyState,
    wire: Wire,
    body: dict[str, Any],
    record: Interaction,
    staged: Staged,
    headers: dict[str, str],
) -> None:
    started = time.time()
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        upstream = await state.upstream_for(staged.adapter)
        out = wire.inject(out, staged.documents)
        response = await upstream.client.post(
            f"{upstream.base_url}/{wire.path}", json=out, headers=headers
        )
    except RetrievalUnavailable as err:
        _finish(state, record, started, error=f"the staged proposal: {err}", status=500)
    except Exception as err:  # noqa: BLE001 - logged on the shadow row, never raised
        status, message = _networkerror_response(err)
        _finish(state, record, started, error=message, status=status)
    else:
        _finish_plain(state, wire, record, started, response.status_code, response.content)
    if state.canary is not None:
        state.canary.counts["shadow"] += 1
        state.canary.counts["shadow_errors"] += record.error is not None


# ---- running --------------------------------------------------------------------------------


def proxy_server(app: Any, host: str, port: int) -> Any:
    """The uvicorn server of a proxy app: a stop marks the proxy draining before it closes the
    port, and cuts what is still in flight after `drain_timeout_s`."""
    import uvicorn

    state: ProxyState = app.state.proxy

    class ProxyServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            state.draining = True  # /ready says so; a stream cut from here on says why
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=state.config.drain_timeout_s,
    )
    return ProxyServer(config)


def run_proxy(config: ProxyConfig) -> None:
    """Serve until interrupted (SIGTERM or Ctrl-C: drained, see the module docstring)."""
    from selftaught.serve import check_host, run_uvicorn

    check_host(config.host, config.allow_remote)
    app = create_proxy_app(config)
    run_uvicorn(app, config.host, config.port, server=proxy_server(app, config.host, config.port))


@contextlib.contextmanager
def proxy_in_background(
    config: ProxyConfig, *, upstream: Upstream | None = None, startup_timeout_s: float = 30.0
) -> Iterator[tuple[str, Any]]:
    """Run the proxy in a thread for the block; yields (base URL `http://host:port/v1`, app).
    `config.port = 0` picks a free port. For tests and benchmarks."""
    from selftaught.serve import check_host

    check_host(config.host, config.allow_remote)
    app = create_proxy_app(config, upstream=upstream)
    server = proxy_server(app, config.host, config.port)
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
