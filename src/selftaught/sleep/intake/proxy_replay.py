"""A night's own model calls through the proxy: relayed as the night sent them, never logged.

A night pointed at the proxy (`--model http://proxy/v1#m`) would otherwise come back as new
traffic (the next night mining its own replays) and get the adopted skill injected beside
the candidate it tests. Its calls carry the night's mark (`selftaught.sleep.replay_mark`: a
MAC of the body under the sleep home's 0600 key, which no client holds), so the proxy relays
a marked call untouched: no skill, no canary, no row; `/health` counts them
(`night_replays`). The operator's upstream key goes with them (the mark proves the operator's
night sent them). An unmarked or wrongly marked request is traffic like any other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from selftaught.http_guard import strip_credentials
from selftaught.sleep.intake.proxy_access import error_response
from selftaught.sleep.intake.proxy_wire import Wire


class ReplayHost(Protocol):
    """What relaying a night's call reads of the running proxy (`ProxyState` has it; declared
    here so that this module needs nothing from the proxy's)."""

    night_replays: int

    @property
    def upstream(self) -> Any: ...

    def upstream_headers(
        self, request_headers: Any, wire: Wire | None = None, *, logged: bool = True
    ) -> dict[str, str]: ...


async def relay_night_call(
    state: ReplayHost, request: Any, wire: Wire, raw: bytes, body: dict[str, Any]
) -> Any:
    """Forward one marked call to the upstream and pass its answer back, logging nothing."""
    import httpx
    from fastapi.responses import Response, StreamingResponse

    state.night_replays += 1
    upstream = state.upstream
    out = dict(body)
    if upstream.model and (upstream.force_model or not body.get("model")):
        out["model"] = upstream.model
    stream = body.get("stream") is True
    try:
        sent = upstream.client.build_request(
            "POST",
            f"{upstream.base_url}/{wire.path}",
            params=dict(request.query_params),
            content=raw if out == body else json.dumps(out).encode(),
            headers=state.upstream_headers(request.headers, wire),
        )
        response = await upstream.client.send(sent, stream=stream)
    except Exception as err:  # noqa: BLE001 - the night reads a 502 / 504 as a failed call
        status = 504 if isinstance(err, httpx.TimeoutException) else 502
        message = strip_credentials(f"the upstream is unreachable: {type(err).__name__}: {err}")
        return error_response(status, message, "upstream_error")
    media = response.headers.get("content-type", "application/json")
    if not stream:
        return Response(response.content, status_code=response.status_code, media_type=media)
    return StreamingResponse(_chunks(response), status_code=response.status_code, media_type=media)


async def _chunks(response: Any) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()
