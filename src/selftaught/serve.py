"""`selftaught serve`: an OpenAI-compatible HTTP endpoint around any ChatModel.

Each request awaits `model.achat` on the server's event loop, so concurrent requests reach
the model concurrently (the local model batches them into one `generate` call). Only what
an agent needs: `GET /v1/models`, `POST /v1/chat/completions` (n=1; `tools` and
`tool_choice` pass to the model, its `tool_calls` come back with finish_reason
"tool_calls"), `GET /health`. Errors use OpenAI's body, `{"error": {"message", "type",
"code"}}`, so the official client raises its usual exceptions.

`stream: true` is answered with OpenAI's server-sent events (`chat.completion.chunk`
objects, then `data: [DONE]`). The reply is generated first and then sent in chunks, so an
error is still an HTTP error status, never a half-sent stream; with
`stream_options.include_usage` a last chunk carries the usage.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations
# (e.g. `request: Request`, imported inside the route builders) at runtime.
import contextlib
import ipaddress
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from selftaught.errors import ConfigError, InputError, RunError
from selftaught.http_guard import DEFAULT_MAX_BODY_BYTES, install_guard
from selftaught.models.base import ChatModel, GenerationParams, Message
from selftaught.models.errors import BackendError, FatalBackendError, TransientBackendError
from selftaught.models.tools import check_tool_choice, check_tool_messages, check_tools

if TYPE_CHECKING:
    from fastapi import FastAPI

DEFAULT_MAX_TOKENS = 512
_ROLES = ("system", "user", "assistant", "tool", "developer")


class RequestError(InputError):
    """A request the server refuses, with its HTTP status and OpenAI error type/code."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }


@dataclass
class ChatRequest:
    """A validated `POST /v1/chat/completions` body."""

    model: str
    messages: list[Message]
    params: GenerationParams
    stream: bool = False
    include_usage: bool = False


def parse_chat_request(
    body: Any, served_name: str, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> ChatRequest:
    """Validate an OpenAI chat-completions body; raise RequestError with a clear message."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean", param="stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    model = body.get("model", served_name)
    if not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    if model != served_name:
        raise RequestError(
            f"The model '{model}' does not exist; this server serves '{served_name}'",
            status=404,
            code="model_not_found",
            param="model",
        )
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise RequestError("only n=1 is supported", param="n")
    messages = _parse_messages(body.get("messages"))

    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not _is_int(max_tokens) or max_tokens < 1:
        raise RequestError("'max_tokens' must be a positive integer", param="max_tokens")
    temperature = _number(body, "temperature", 1.0)  # OpenAI's default
    if not 0 <= temperature <= 2:
        raise RequestError("'temperature' must be between 0 and 2", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError("'top_p' must be in (0, 1]", param="top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestError("'seed' must be an integer", param="seed")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
    ):
        raise RequestError(
            "'stop' must be a non-empty string or a list of non-empty strings", param="stop"
        )
    tools, tool_choice = _parse_tools(body)
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        seed=seed,
        stop=stop or None,
        tools=tools,
        tool_choice=tool_choice,
    )
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        include_usage=stream and bool(stream_options.get("include_usage")),
    )


def _parse_tools(body: dict[str, Any]) -> tuple[Any, Any]:
    """The body's `tools` and `tool_choice`, checked (None when absent)."""
    tools, tool_choice = body.get("tools"), body.get("tool_choice")
    try:
        if tools is not None:
            check_tools(tools)
    except ValueError as err:
        raise RequestError(str(err), param="tools") from err
    try:
        check_tool_choice(tool_choice, tools)
    except ValueError as err:
        raise RequestError(str(err), param="tool_choice") from err
    return tools or None, tool_choice


def _finish_reason(completion: Any) -> str:
    if completion.tool_calls:
        return "tool_calls"
    return "length" if completion.truncated else "stop"


def _reply_message(completion: Any) -> dict[str, Any]:
    """The assistant message: with tool calls, OpenAI's shape (content null when empty)."""
    if not completion.tool_calls:
        return {"role": "assistant", "content": completion.text}
    return {
        "role": "assistant",
        "content": completion.text or None,
        "tool_calls": completion.tool_calls,
    }


def completion_body(completion: Any, model_name: str) -> dict[str, Any]:
    """A `chat.completion` object for one reply."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": _reply_message(completion),
                "finish_reason": _finish_reason(completion),
                "logprobs": None,
            }
        ],
        "usage": _usage(completion),
    }


def _usage(completion: Any) -> dict[str, int]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


_PIECES = re.compile(r"\S+\s*|\s+")


def stream_events(completion: Any, model_name: str, include_usage: bool) -> Iterator[str]:
    """The reply as OpenAI server-sent events: a role chunk, one chunk per word, two chunks
    per tool call (its id and name, then its arguments), a chunk with the finish reason, the
    usage chunk when asked for, then `[DONE]`."""
    common = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model_name,
    }

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return f"data: {json.dumps({**common, 'choices': [choice], **extra})}\n\n"

    yield event({"role": "assistant", "content": ""})
    for piece in _PIECES.findall(completion.text):
        yield event({"content": piece})
    for index, call in enumerate(completion.tool_calls or []):
        fn = call["function"]
        head = {"name": fn["name"], "arguments": ""}
        yield event(
            {
                "tool_calls": [
                    {"index": index, "id": call["id"], "type": "function", "function": head}
                ]
            }
        )
        yield event({"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]})
    yield event({}, _finish_reason(completion))
    if include_usage:
        usage = {**common, "choices": [], "usage": _usage(completion)}
        yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number", param=key)
    return float(value)


def _parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    messages: list[Message] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in _ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}",
                param="messages",
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise RequestError(
                        f"messages[{i}].content: only text parts are supported",
                        param="messages",
                    )
                texts.append(str(part.get("text", "")))
            content = "".join(texts)
        elif content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(
                f"messages[{i}].content must be a string or a list of text parts",
                param="messages",
            )
        # Chat templates know system/user/assistant; OpenAI's "developer" is a system prompt.
        message = {"role": "system" if role == "developer" else role, "content": content}
        message.update(_tool_fields(m, i))
        messages.append(message)
    return messages


def _tool_fields(m: dict[str, Any], i: int) -> dict[str, Any]:
    """An assistant turn's `tool_calls` and a tool turn's `tool_call_id`, checked."""
    fields: dict[str, Any] = {}
    if m.get("tool_calls") is not None:
        fields["tool_calls"] = m["tool_calls"]
        try:
            check_tool_messages([{"role": m.get("role"), **fields}])
        except ValueError as err:
            message = str(err).replace("message 0", f"messages[{i}]", 1)
            raise RequestError(message, param="messages") from err
    if m.get("role") == "tool" and m.get("tool_call_id") is not None:
        if not isinstance(m["tool_call_id"], str):
            raise RequestError(f"messages[{i}].tool_call_id must be a string", param="messages")
        fields["tool_call_id"] = m["tool_call_id"]
    return fields


def create_app(
    model: ChatModel,
    model_name: str,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    allow_remote: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Any:
    """A FastAPI app serving `model` under the name `model_name`. Requests pass
    `selftaught.http_guard` first (loopback Host, JSON bodies, size cap)."""
    from fastapi import FastAPI

    if not model_name:
        raise ConfigError("model_name must be a non-empty string")
    app = FastAPI(title="selftaught", docs_url=None, redoc_url=None, openapi_url=None)
    install_guard(app, allow_remote=allow_remote, max_body_bytes=max_body_bytes)
    _add_error_handlers(app)
    _add_model_routes(app, model_name, created=int(time.time()))
    _add_chat_route(app, model, model_name, default_max_tokens)
    return app


def _add_error_handlers(app: "FastAPI") -> None:
    """Every error leaves as an OpenAI-shaped JSON body."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def error_response(err: RequestError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, err: RequestError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return error_response(RequestError(str(err.detail), status=err.status_code, type=kind))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(RequestError(f"invalid request: {err.errors()}"))


def _add_model_routes(app: "FastAPI", model_name: str, created: int) -> None:
    """/health and the model list (one model)."""

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "selftaught"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict[str, Any]:
        if name != model_name:
            raise RequestError(
                f"The model '{name}' does not exist; this server serves '{model_name}'",
                status=404,
                code="model_not_found",
            )
        return model_card()


def _add_chat_route(
    app: "FastAPI", model: ChatModel, model_name: str, default_max_tokens: int
) -> None:
    """POST /v1/chat/completions, streamed or not; backend failures map to 5xx."""
    from fastapi import Request
    from fastapi.responses import StreamingResponse

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError as err:
            raise RequestError(f"the request body is not valid JSON: {err}") from err
        parsed = parse_chat_request(body, model_name, default_max_tokens)
        try:
            completion = await model.achat(parsed.messages, parsed.params)
        except ValueError as err:  # the backend's own input checks
            raise RequestError(str(err)) from err
        except TransientBackendError as err:
            raise RequestError(str(err), status=503, type="server_error") from err
        except (FatalBackendError, BackendError) as err:
            raise RequestError(str(err), status=500, type="server_error") from err
        if parsed.stream:
            return StreamingResponse(
                stream_events(completion, model_name, parsed.include_usage),
                media_type="text/event-stream",
            )
        return completion_body(completion, model_name)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> None:
    if not allow_remote and not is_loopback(host):
        raise ConfigError(
            f"refusing to bind {host}: the server has no authentication, so it listens on "
            "loopback only unless you pass allow_remote=True (--allow-remote)"
        )


def run_server(
    model: ChatModel,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    allow_remote: bool = False,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve `model` at http://host:port/v1 until interrupted."""
    check_host(host, allow_remote)
    app = create_app(
        model,
        model_name,
        default_max_tokens=default_max_tokens,
        allow_remote=allow_remote,
        max_body_bytes=max_body_bytes,
    )
    run_uvicorn(app, host, port)


def run_uvicorn(app: Any, host: str, port: int, *, server: Any = None) -> None:
    """`uvicorn.run` until interrupted (or `server.run()`: a `uvicorn.Server` of the caller's
    for this app, host and port); its startup failure (the port is taken, the address is not
    this machine's) is a `RunError`, not uvicorn's own exit code 3 (which reads as "another
    night is running" in selftaught's table)."""
    import uvicorn

    try:
        if server is None:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        else:
            with contextlib.suppress(KeyboardInterrupt):
                server.run()
            if not server.started:
                raise SystemExit(3)
    except SystemExit as stop:
        if stop.code in (0, None):
            raise
        raise RunError(
            f"could not listen on {host}:{port} (is the port taken? pick another with --port)"
        ) from None


@contextlib.contextmanager
def serve_in_background(
    model: ChatModel,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allow_remote: bool = False,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    startup_timeout_s: float = 30.0,
) -> Iterator[str]:
    """Run the server in a thread for the block; yields its base URL (`http://host:port/v1`).
    `port=0` picks a free port. For tests and benchmarks that need a real endpoint."""
    import uvicorn

    check_host(host, allow_remote)
    app = create_app(
        model,
        model_name,
        default_max_tokens=default_max_tokens,
        allow_remote=allow_remote,
        max_body_bytes=max_body_bytes,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="selftaught-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RunError(f"the server failed to start on {host}:{port}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RunError(f"the server did not start within {startup_timeout_s:.0f}s")
        time.sleep(0.02)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{url_host}:{bound_port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
