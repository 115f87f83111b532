"""`POST /v1/feedback` on the proxy: feedback on a logged row, or on an agent session's last turn.

The body names what it is on: `{"id": FULL_ID}` (the `x-selftaught-interaction-id` of the
answer; a prefix is not enough) or `{"session_id": ID}` (the session's newest answered turn;
the operator adds `"client"`, see below),
with any of `thumb` ("up" / "down"), `score`, `reference` (the right answer, or a corrected
tool call), `comment`. Only rows of the proxy's project: a row of another project, a prefix
and a missing id get the same answer, 404, so nothing can be probed.

A session belongs to the client that sent it. With client keys (`--require-key`,
`--client-keys`: client ids are identities), an end user's feedback goes only on their own
rows: another client's row, by id or by session, gets the same 404. The operator's feedback
by `session_id` then names whose session it is, `{"session_id": ID, "client": LABEL}` (400
without it), so a client that sends another's session id cannot have the operator's trusted
feedback land on its own rows. Without keys a client id is only a claim: nothing binds.

An end user's feedback is stored as theirs (giver: their client id) and untrusted: the night
treats it as evidence, probation ignores it unless told otherwise. It is rate limited per
client (`feedback_per_minute`: 429 with `Retry-After`), its body capped at
`max_feedback_bytes` and its comment at `max_comment_bytes` (413). Feedback sent with the
operator's `feedback_key` is the operator's: trusted, giver `operator`, not rate limited.
When it is given is stamped by the log, never taken from the body.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from selftaught.errors import InputError
from selftaught.sleep.intake.log import OPERATOR, Feedback, LogError, LogUnavailable, TaskLog
from selftaught.sleep.intake.proxy_access import (
    Clients,
    RateLimit,
    error_response,
    read_json_body,
    retry_after,
    unauthorized,
)
from selftaught.sleep.intake.sessions import last_turn
from selftaught.sleep.intake.storable import storable
from selftaught.sleep.intake.watch import ProbationWatch
from selftaught.sleep.intake.writer import LogWriter


class FeedbackSettings(Protocol):
    @property
    def project(self) -> str: ...
    @property
    def feedback_per_minute(self) -> float: ...
    @property
    def max_feedback_bytes(self) -> int: ...
    @property
    def max_comment_bytes(self) -> int: ...


class FeedbackHost(Protocol):
    """What the feedback endpoint reads of the running proxy (`ProxyState` has it; declared
    here so that this module needs nothing from the proxy's)."""

    @property
    def config(self) -> FeedbackSettings: ...
    @property
    def clients(self) -> Clients: ...
    @property
    def feedback_limit(self) -> RateLimit: ...
    @property
    def log(self) -> TaskLog: ...
    @property
    def writer(self) -> LogWriter: ...
    @property
    def watch(self) -> ProbationWatch | None: ...


class _TooLarge(InputError):
    def __init__(self, message: str):
        super().__init__(message)
        self.status, self.message, self.kind = 413, message, "invalid_request_error"


class _NotFound(InputError, LookupError):
    """No row the feedback may go to (the message is the same whatever the reason)."""


async def take_feedback(state: FeedbackHost, request: Any) -> Any:
    """POST /v1/feedback: `{"id": FULL_ID, ...}` or `{"session_id": ID, ...}` with any of
    thumb / score / reference / comment. The operator's (with `feedback_key`) is trusted; an
    end user's is untrusted, given by their client id, rate limited."""
    config = state.config
    operator = state.clients.is_operator(request.headers)
    client = OPERATOR if operator else state.clients.identify(request.headers)
    if client is None:
        return unauthorized()
    if not operator:
        wait = state.feedback_limit.take(client)
        if wait:
            limit = f"{config.feedback_per_minute:g}"
            message = f"too much feedback from this client: at most {limit} a minute"
            return error_response(
                429, message, "rate_limit_error", **{"retry-after": retry_after(wait)}
            )
    raw, body = await read_json_body(request)
    if len(raw) > config.max_feedback_bytes:
        message = f"the feedback body is larger than {config.max_feedback_bytes} bytes"
        return error_response(413, message, "invalid_request_error")
    if not isinstance(body, str):
        body, _ = storable(body)  # a lone surrogate is stored as U+FFFD, as in a request
    try:
        target, fb = _feedback_request(body, config.max_comment_bytes)
        owner = _session_owner(state, body, target, client, operator)
        found = await asyncio.to_thread(
            _attach_feedback, state, target, fb, client, operator, owner
        )
    except _TooLarge as err:
        return error_response(err.status, err.message, err.kind)
    except _NotFound as err:
        return error_response(404, str(err), "not_found_error")
    except LogUnavailable as err:  # the log's database is down: try again later
        return error_response(503, str(err), "service_unavailable_error")
    except (ValueError, TypeError) as err:  # InputError included
        return error_response(400, str(err), "invalid_request_error")
    if state.watch is not None:
        state.watch.poke()  # probation runs in its own thread, after the answer
    return {"id": found, "status": "ok"}


def _feedback_request(
    body: dict[str, Any] | str, max_comment_bytes: int
) -> tuple[tuple[str, str], Feedback]:
    """((what the feedback is on: "id" or "session_id", its value), the feedback)."""
    if isinstance(body, str):
        raise InputError(body)
    named = [k for k in ("id", "session_id") if isinstance(body.get(k), str) and body[k]]
    if len(named) != 1:
        raise InputError(
            "the body must be a JSON object with the interaction `id` or the agent `session_id`"
        )
    fb = Feedback.coerce({k: v for k, v in body.items() if k not in ("id", "session_id", "client")})
    if fb is None or fb.empty():
        raise InputError("feedback is empty: give a thumb, a score, a reference or a comment")
    if fb.comment is not None and not isinstance(fb.comment, str):
        raise InputError("comment must be a string")
    if fb.comment and len(fb.comment.encode()) > max_comment_bytes:
        raise _TooLarge(f"the comment is longer than {max_comment_bytes} bytes")
    return (named[0], body[named[0]]), fb


def _session_owner(
    state: FeedbackHost, body: Any, target: tuple[str, str], client: str, operator: bool
) -> str | None:
    """Whose rows the feedback may go on (None: anyone's in the project). With client keys,
    an end user's own; the operator's by session, the client the body names (required)."""
    named = body.get("client") if isinstance(body, dict) else None
    if named is not None and not (isinstance(named, str) and named):
        raise InputError("client must be a client's label (a non-empty string)")
    if not operator:
        if named is not None and named != client:
            raise InputError("only the operator's feedback names a client")
        return client if state.clients.required else None
    if named is None and target[0] == "session_id" and state.clients.required:
        raise InputError(
            "with client keys, the operator's feedback by session_id names whose session it "
            'is: add "client": LABEL (a session id is its client\'s)'
        )
    return named


def _feedback_row(state: FeedbackHost, target: tuple[str, str], owner: str | None) -> str:
    """The full id of the row the feedback is on: this project's only (and `owner`'s, when
    given), the exact id only (no prefix), one message whatever the reason (no oracle)."""
    kind, value = target
    project = state.config.project
    if kind == "session_id":
        row = last_turn(state.log, project, value, owner)
        if row is None:
            raise _NotFound(f"no answered turn of session {value!r} in this proxy's project")
        return row.id
    try:
        row = state.log.get(value)
    except LogUnavailable:
        raise
    except LogError:
        row = None
    mine = owner is None or (row is not None and row.client == owner)
    if row is None or row.id != value or row.project != project or not mine:
        raise _NotFound(f"no interaction {value!r} in this proxy's project (give its full id)")
    return row.id


def _attach_feedback(
    state: FeedbackHost,
    target: tuple[str, str],
    fb: Feedback,
    client: str,
    operator: bool,
    owner: str | None,
) -> str:
    if state.writer.unreachable:  # the database is down: say so now, not after a timeout
        raise LogUnavailable(state.writer.unreachable)
    try:
        iid = _feedback_row(state, target, owner)
    except _NotFound:
        state.writer.flush(5.0)  # the interaction may still be on its way to the log
        iid = _feedback_row(state, target, owner)
    return state.log.add_feedback(iid, fb, giver=client, trusted=operator)
