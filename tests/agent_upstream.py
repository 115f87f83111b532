"""A scripted model server on loopback that speaks what coding agents speak: Anthropic
Messages (Claude Code), OpenAI Responses (Codex) and OpenAI chat completions (any OpenAI-SDK
agent), streamed (SSE, the real event sequences) and not. Checked against the real CLIs
(Claude Code 2.1.328, Codex 0.169.0): both complete a turn with a tool call against it.

A *policy* scripts the model: a callable that gets a neutral view of the request
(`AgentRequest`: the system / instructions text, the turns, the tool names, the tool results
so far) and returns the reply: text (a `str`) or a tool call (`Call`). Two canned ones:

- `needs_skill(marker)`: `SOLVED` when the marker is in the request's context (the system /
  instructions text and every non-assistant turn: Claude Code puts CLAUDE.md in a user turn's
  `<system-reminder>`, Codex puts AGENTS.md in an `input` user item), else `UNSOLVED`;
- `one_tool_then_answer(command)`: first runs `command` with the agent's shell tool (Claude
  Code: `Bash {"command"}`; Codex: `exec_command {"cmd"}`; chat: a tool named `shell` /
  `bash` / `exec_command` if offered), then, once the tool's result is back, answers
  `tool said: <its output>`.

Every request is recorded (`calls`: method, path, query, headers, body; `requests`: the
`AgentRequest` of each model call); a route it does not serve is a 404, recorded in `unknown`.
`faults` (a deque) answers the next model call with that status ("401", "429", "500", ...) in
the wire format's error shape; `api_key` makes it refuse (401) a request without that key
(`x-api-key` or `Authorization: Bearer`); `chunk_delay_s` paces streamed events.

Driving it (see `tests/test_proxy_agents.py`):

    with AgentUpstream(needs_skill("MARKER-123")) as up:
        # Claude Code: ANTHROPIC_BASE_URL=up.root_url ANTHROPIC_API_KEY=anything
        #   claude -p "do it" --output-format json --model up.model
        # Codex: CODEX_HOME/config.toml with `base_url = up.base_url` (".../v1"),
        #   `wire_api = "responses"`: see `codex_config`; `codex exec --skip-git-repo-check
        #   --json "do it" </dev/null`
        # OpenAI SDK: base_url=up.base_url
        ...
    up.requests[-1].system, up.requests[-1].tool_results, up.calls[-1]["headers"]

`agent_env` / `codex_config` / `find_cli` give the environment the CLIs need offline.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fake_upstream import FakeUpstream

MODEL = "scripted-agent-model"
SHELL_TOOLS = ("Bash", "exec_command", "shell", "bash")
CLI_DIR_ENV = "SELFTAUGHT_AGENT_CLIS"
DEFAULT_CLI_DIR = Path.home() / ".cache" / "selftaught" / "agent-clis"
CLI_VERSIONS = {"claude": "2.1.328", "codex": "0.169.0"}


@dataclass
class Call:
    """A tool call the policy makes: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolResult:
    call_id: str
    name: str | None  # the tool that was called (from the matching call), when known
    output: str


@dataclass
class AgentRequest:
    """One model call, whatever its wire format."""

    api: str  # "messages" | "responses" | "chat"
    model: str | None
    system: str  # Messages `system`, Responses `instructions`, chat system messages
    turns: list[dict[str, str]]  # {"role", "text"}: user / assistant / developer turns' text
    tools: list[str]  # the names of the tools offered
    tool_results: list[ToolResult]
    stream: bool
    body: dict[str, Any] = field(repr=False)
    headers: dict[str, str] = field(repr=False)

    def context(self) -> str:
        """Everything the agent put before the model but its own answers: the system /
        instructions and each non-assistant turn (where CLAUDE.md / AGENTS.md land)."""
        texts = [self.system] + [t["text"] for t in self.turns if t["role"] != "assistant"]
        return "\n".join(texts)

    def shell_tool(self) -> str | None:
        return next((name for name in SHELL_TOOLS if name in self.tools), None)


Reply = str | Call
Policy = Callable[[AgentRequest], Reply]


def needs_skill(marker: str, solved: str = "SOLVED", unsolved: str = "UNSOLVED") -> Policy:
    def policy(request: AgentRequest) -> Reply:
        return solved if marker in request.context() else unsolved

    return policy


def one_tool_then_answer(command: str = "echo agent-upstream-ok") -> Policy:
    def policy(request: AgentRequest) -> Reply:
        if request.tool_results:
            return "tool said: " + request.tool_results[-1].output.strip()
        tool = request.shell_tool()
        if tool is None:
            return "no shell tool was offered"
        return Call(tool, shell_arguments(tool, command))

    return policy


def shell_arguments(tool: str, command: str) -> dict[str, Any]:
    """What the agent's shell tool takes (read off the real CLIs' tool schemas)."""
    if tool == "Bash":  # Claude Code
        return {"command": command, "description": "Run the command"}
    if tool == "exec_command":  # Codex 0.169.0
        return {"cmd": command}
    if tool == "shell":  # older Codex: argv
        return {"command": ["bash", "-lc", command]}
    return {"command": command}


# ---- reading the request --------------------------------------------------------------------


def _text(content: Any) -> str:
    """The text of a content: a string, or the text parts of a list of blocks / parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _messages_view(body: dict[str, Any]) -> tuple[str, list, list[ToolResult]]:
    """(system, turns, tool results) of an Anthropic Messages body."""
    system = _text(body.get("system"))
    turns: list[dict[str, str]] = []
    results: list[ToolResult] = []
    names: dict[str, str] = {}
    for msg in body.get("messages") or []:
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text") or ""))
            elif kind == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
            elif kind == "tool_result":
                call_id = str(block.get("tool_use_id"))
                results.append(ToolResult(call_id, names.get(call_id), _text(block.get("content"))))
        if text:
            turns.append({"role": str(msg.get("role")), "text": "\n".join(text)})
    return system, turns, results


def _responses_view(body: dict[str, Any]) -> tuple[str, list, list[ToolResult]]:
    """(instructions, turns, tool results) of an OpenAI Responses body."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    turns: list[dict[str, str]] = []
    results: list[ToolResult] = []
    names: dict[str, str] = {}
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            turns.append({"role": str(item.get("role")), "text": _text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            names[str(item.get("call_id"))] = str(item.get("name"))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = str(item.get("call_id"))
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output) or json.dumps(output)
            results.append(ToolResult(call_id, names.get(call_id), text))
    return str(body.get("instructions") or ""), turns, results


def _chat_view(body: dict[str, Any]) -> tuple[str, list, list[ToolResult]]:
    system, turns, results, names = [], [], [], {}
    for msg in body.get("messages") or []:
        role = msg.get("role")
        for call in msg.get("tool_calls") or []:
            names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
        if role == "system":
            system.append(_text(msg.get("content")))
        elif role == "tool":
            call_id = str(msg.get("tool_call_id"))
            results.append(ToolResult(call_id, names.get(call_id), _text(msg.get("content"))))
        else:
            turns.append({"role": str(role), "text": _text(msg.get("content"))})
    return "\n".join(system), turns, results


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


_VIEWS = {"messages": _messages_view, "responses": _responses_view, "chat": _chat_view}


def view(api: str, body: dict[str, Any], headers: dict[str, str]) -> AgentRequest:
    system, turns, results = _VIEWS[api](body)
    return AgentRequest(
        api=api,
        model=body.get("model"),
        system=system,
        turns=turns,
        tools=_tool_names(body.get("tools")),
        tool_results=results,
        stream=body.get("stream") is True,
        body=body,
        headers=headers,
    )


# ---- the server -----------------------------------------------------------------------------


class AgentUpstream(FakeUpstream):
    """The scripted server (see the module docstring). `root_url` is what Claude Code's
    `ANTHROPIC_BASE_URL` takes; `base_url` (`.../v1`) what Codex and the OpenAI SDK take."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        model: str = MODEL,
        chunk_delay_s: float = 0.0,
        api_key: str | None = None,
        port: int = 0,
    ):
        self.policy = policy or one_tool_then_answer()
        self.api_key = api_key
        self.requests_seen: list[AgentRequest] = []
        self._ids = itertools.count(1)
        super().__init__(
            chat_reply=self._chat_answer,
            model=model,
            chunk_delay_s=chunk_delay_s,
            routes={"/v1/messages": self._messages, "/v1/responses": self._responses},
            port=port,
        )

    @property
    def agent_requests(self) -> list[AgentRequest]:
        return self.requests_seen

    # -- shared steps
    def _decide(self, api: str, handler: Any, body: dict[str, Any]) -> Reply | None:
        """The policy's reply, or None when a fault or a refused key was answered."""
        headers = dict(handler.headers)
        request = view(api, body, headers)
        with self.lock:
            self.requests_seen.append(request)
            fault = self.faults.popleft() if self.faults else None
        refused = self.api_key is not None and self.api_key not in (
            handler.headers.get("x-api-key"),
            (handler.headers.get("authorization") or "").removeprefix("Bearer "),
        )
        if refused or (fault and fault.isdigit()):
            status = 401 if refused else int(fault)
            handler._json(status, _error_body(api, status))
            return None
        return self.policy(request)

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    def _sse(self, handler: Any, events: list[tuple[str | None, dict]]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        try:
            for name, data in events:
                handler._event(data, name)
                if self.chunk_delay_s:
                    time.sleep(self.chunk_delay_s)
        except (BrokenPipeError, ConnectionResetError):
            return

    # -- Anthropic Messages
    def _messages(self, handler: Any, body: dict[str, Any]) -> None:
        reply = self._decide("messages", handler, body)
        if reply is None:
            return
        model = body.get("model") or self.model
        block = self._message_block(reply)
        stop = "tool_use" if isinstance(reply, Call) else "end_turn"
        usage = {"input_tokens": _tokens(body), "output_tokens": _tokens(block)}
        message = {
            "id": self._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if body.get("stream") is not True:
            return handler._json(200, message)
        self._sse(handler, list(messages_events(message)))

    def _message_block(self, reply: Reply) -> dict[str, Any]:
        if isinstance(reply, Call):
            return {
                "type": "tool_use",
                "id": self._next_id("toolu"),
                "name": reply.name,
                "input": reply.arguments,
            }
        return {"type": "text", "text": reply}

    # -- OpenAI Responses
    def _responses(self, handler: Any, body: dict[str, Any]) -> None:
        reply = self._decide("responses", handler, body)
        if reply is None:
            return
        item = self._response_item(reply)
        usage = {
            "input_tokens": _tokens(body),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": _tokens(item),
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        response = {
            "id": self._next_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model") or self.model,
            "output": [item],
            "usage": usage,
        }
        if body.get("stream") is not True:
            return handler._json(200, response)
        self._sse(handler, list(responses_events(response)))

    def _response_item(self, reply: Reply) -> dict[str, Any]:
        if isinstance(reply, Call):
            return {
                "type": "function_call",
                "id": self._next_id("fc"),
                "call_id": self._next_id("call"),
                "name": reply.name,
                "arguments": json.dumps(reply.arguments),
                "status": "completed",
            }
        return {
            "type": "message",
            "id": self._next_id("msg"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": reply, "annotations": []}],
        }

    # -- chat completions (served by FakeUpstream)
    def _chat_answer(self, body: dict[str, Any], headers: dict[str, str]) -> str | dict[str, Any]:
        request = view("chat", body, headers)
        with self.lock:
            self.requests_seen.append(request)
        reply = self.policy(request)
        if isinstance(reply, str):
            return reply
        call = {
            "id": self._next_id("call"),
            "type": "function",
            "function": {"name": reply.name, "arguments": json.dumps(reply.arguments)},
        }
        return {"content": None, "tool_calls": [call]}


def _tokens(value: Any) -> int:
    """A stand-in token count: words of the JSON."""
    return max(1, len(json.dumps(value).split()) // 2)


def _error_body(api: str, status: int) -> dict[str, Any]:
    message = f"injected {status}"
    if api == "messages":
        kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": "test", "code": status, "param": None}}


def messages_events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Anthropic's stream of `message`: message_start, for each block content_block_start /
    delta(s) / stop, message_delta (stop_reason, usage), message_stop."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            empty, pieces = {"type": "text", "text": ""}, _pieces(block["text"])
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
        else:
            empty, pieces = {**block, "input": {}}, _pieces(json.dumps(block["input"]), 3)
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        start = {"type": "content_block_start", "index": index, "content_block": empty}
        yield "content_block_start", start
        for delta in deltas:
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def responses_events(response: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """OpenAI's Responses stream of `response` (each event with its `sequence_number`)."""
    seq = itertools.count()

    def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **data}

    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        yield from _item_events(event, index, item)
    yield event("response.completed", response=response)


def _item_events(event: Callable, index: int, item: dict[str, Any]) -> Iterator[tuple]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        yield event(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        for piece in _pieces(item["arguments"], 3):
            yield event("response.function_call_arguments.delta", **at, delta=piece)
        yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
        return
    text = item["content"][0]["text"]
    yield event(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "content": []},
    )
    part = {"type": "output_text", "text": "", "annotations": []}
    yield event("response.content_part.added", **at, content_index=0, part=part)
    for piece in _pieces(text):
        yield event("response.output_text.delta", **at, content_index=0, delta=piece)
    yield event("response.output_text.done", **at, content_index=0, text=text)
    yield event("response.content_part.done", **at, content_index=0, part=item["content"][0])
    yield event("response.output_item.done", output_index=index, item=item)


def _pieces(text: str, n: int = 0) -> list[str]:
    """`text` cut into a few deltas (words, or `n` equal parts): a stream, not one chunk."""
    if n:
        step = max(1, -(-len(text) // n))
        return [text[i : i + step] for i in range(0, len(text), step)] or [""]
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


# ---- running the real CLIs --------------------------------------------------------------------


def cli_dir() -> Path:
    return Path(os.environ.get(CLI_DIR_ENV) or DEFAULT_CLI_DIR).expanduser()


def find_cli(name: str) -> str | None:
    """The pinned CLI (`claude`, `codex`) installed by `scripts/install-agent-clis.sh`; None
    when it is not there (or node, which starts it, is not)."""
    path = cli_dir() / "node_modules" / ".bin" / name
    return str(path) if path.exists() and shutil.which("node") else None


AGENTS = ("claude-code", "codex")


def needs_cli(kind: str) -> Any:
    """A mark that skips a test of `kind` (`claude-code`, `codex`) when its CLI is not
    installed."""
    import pytest

    program = {"claude-code": "claude", "codex": "codex"}[kind]
    return pytest.mark.skipif(
        find_cli(program) is None,
        reason=f"{program} not installed (scripts/install-agent-clis.sh)",
    )


def with_cli(kinds: tuple[str, ...] = AGENTS) -> list[Any]:
    """`kinds` as parameters, each skipped when its CLI is not installed."""
    import pytest

    return [pytest.param(k, marks=needs_cli(k)) for k in kinds]


def sandbox_ready() -> bool:
    """The agents' own sandboxes can run: bubblewrap, and socat for Claude Code's."""
    from selftaught.tasks.sandbox import find_bwrap

    return find_bwrap() is not None and shutil.which("socat") is not None


def point_clis(monkeypatch: Any, tmp_path: Path, key: str) -> Callable[..., None]:
    """Both CLIs made ready for a scripted upstream (no key or base URL of the caller's, the
    pinned CLIs, Claude Code's sandbox off where its tools are missing); the function it
    returns, `point(up, key=key)`, points them at `up` with `key` as their API key."""
    for var in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(CLI_DIR_ENV, str(cli_dir()))
    if not sandbox_ready():  # Claude Code refuses to start without its sandbox's tools
        monkeypatch.setenv("SELFTAUGHT_CLAUDE_SANDBOX", "0")

    def point(up: AgentUpstream, key: str = key) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", up.root_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
        codex_home = tmp_path / "user-codex-home"
        codex_config(codex_home, up.base_url, model=up.model, key_env="X_KEY")
        monkeypatch.setenv("CODEX_HOME", str(codex_home))
        monkeypatch.setenv("X_KEY", key)

    return point


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for running a CLI offline in a throwaway HOME: no telemetry, no
    non-essential traffic, no retries, no proxy settings or keys from the caller."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_MAX_RETRIES="0",  # a refused key fails at once (else ~7 tries, 40 s+)
        CODEX_HOME=str(home / ".codex"),
        NO_COLOR="1",
    )
    env.update(extra)
    return env


def codex_config(codex_home: Path, base_url: str, *, model: str = MODEL, key_env: str = "X_KEY"):
    """Write Codex's `config.toml`: one provider at `base_url` (`http://HOST:PORT/v1`) over
    the Responses API, the key read from `key_env`, no approvals asked."""
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "scripted"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "[model_providers.scripted]\n"
        'name = "scripted"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        f'env_key = "{key_env}"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
