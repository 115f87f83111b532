"""The task log: one row per real interaction of the deployed agent.

One interface, two backends (`selftaught.sleep.store`): a SQLite file (the default; WAL mode,
file mode 0600, safe for many processes writing at once) or a PostgreSQL database named by a
`postgresql://` URL, which proxies and nights on several hosts share. Both keep the same schema,
versioned by the ordered `MIGRATIONS` below and applied on open; a log written by a newer
selftaught is refused rather than guessed at. Every SQL difference lives in `store/dialect.py`.

Everything stored is redacted first (`selftaught.redact`); the number of redactions is
kept per row. A row with `error` set is a failed call: it is kept for diagnostics and is never
a task. Rows harvested from agent transcripts are `private` (they hold private code): part 2
never sends them to a remote model unless the row is `reviewed` or the user allows it.
Feedback (thumbs, score, corrected reference, comment) is attached later, any number of times;
a row reads the latest value of each field. `TaskLog.forget` deletes rows on purpose and
keeps only their ids and dedupe keys, so that what was forgotten is never stored again.

A tool-using exchange keeps what replay needs (`selftaught.sleep.night.replay`): the request's
`tools` (OpenAI schema) and `tool_choice`, the reply's `tool_calls` (OpenAI shape), and the
tool turns (`role: "tool"`) in the messages, as the client sent them.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from selftaught.choices import one_of
from selftaught.errors import InputError, writing_to
from selftaught.models.base import Message
from selftaught.redact import Redactor, default_redactor
from selftaught.sleep.paths import DEFAULT_PROJECT, check_project, log_location

# LogError and LogUnavailable live beside the backends that raise them; callers import them
# from here.
from selftaught.sleep.store import LogError as LogError
from selftaught.sleep.store import LogUnavailable as LogUnavailable
from selftaught.sleep.store import LogUrl
from selftaught.sleep.store import sqlite as sqlite_store

if TYPE_CHECKING:
    from selftaught.sleep.store.dialect import Dialect
    from selftaught.sleep.store.postgres import PostgresBackend

SOURCES = ("proxy", "api", "import", "claude-code", "codex")
Thumb = Literal["up", "down"]
THUMBS: tuple[Thumb, ...] = ("up", "down")


def as_thumb(value: object) -> Thumb | None:
    """`value` as a thumb (None stays None); anything but 'up' or 'down' is an InputError."""
    thumb = one_of(value, THUMBS)
    if thumb is None and value is not None:
        raise InputError(f"thumb must be 'up' or 'down', got {value!r}")
    return thumb


# ---- records ------------------------------------------------------------------------------


MAX_ROWS = 2**31 - 1  # the most rows a query may ask for (a larger integer is no column's)
USER_FIELDS = ("thumb", "score", "reference", "comment")
"""What a giver of feedback may set; when it was given, by whom and whether that giver is
trusted are set by the code that stores it, never taken from the giver."""
OPERATOR = "operator"
IMPORTED_CLIENT = "import:"
"""The client of a row imported without `--trust-fields` is `import:<file name>`: what such a
file says, its references included, is an end user's (`sleep.night.trust.logged_trust`)."""
TRUSTED_WORDS = "trusted_words"
"""`meta` key set by the proxy (`--trusted-clients`) and `sleep import --trust-fields` on a row
whose client's own words are the operator's (`sleep.night.signals.words_trusted`); never taken
from what a client or an untrusted file sends."""


@dataclass
class Feedback:
    """What was said about an interaction, after the fact. All user fields optional.

    `giver` is who said it (`operator` for the CLI and the Python API, a client id for an end
    user through the proxy); `trusted` is whether that giver is the operator. Read from the
    log, a row's feedback is merged: trusted entries override untrusted ones, later entries
    earlier ones; `untrusted_fields` then names the values an untrusted giver set, and
    `trusted` says whether there are none. Ask `trusted_for(field)` before taking a value as
    the operator's word."""

    thumb: Thumb | None = None
    score: float | None = None
    reference: Any = None  # the corrected answer (a string, or a list of acceptable ones)
    comment: str | None = None
    created_at: float | None = None
    giver: str | None = None
    trusted: bool = True
    untrusted_fields: tuple[str, ...] = ()

    def trusted_for(self, name: str) -> bool:
        """Whether the value of user field `name` is the operator's word: for merged feedback,
        per field; for feedback as one giver gave it, that giver's trust."""
        return name not in self.untrusted_fields if self.untrusted_fields else self.trusted

    def __post_init__(self) -> None:
        self.untrusted_fields = tuple(self.untrusted_fields)
        self.thumb = as_thumb(self.thumb)  # a caller's or a row's, unchecked until here
        if self.score is not None:
            self.score = _score(self.score)

    def empty(self) -> bool:
        return (
            self.thumb is None
            and self.score is None
            and self.reference is None
            and (not self.comment)
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ()}

    @classmethod
    def coerce(cls, value: Feedback | dict[str, Any] | str | float | None) -> Feedback | None:
        """Feedback from what a caller may pass: a Feedback, a dict of `USER_FIELDS`,
        'up'/'down', a score."""
        if value is None or isinstance(value, Feedback):
            return value
        if isinstance(value, str):
            return cls(thumb=as_thumb(value))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls(score=float(value))
        if isinstance(value, dict):
            unknown = set(value) - set(USER_FIELDS)
            if unknown:
                raise InputError(
                    f"unknown feedback field(s): {', '.join(sorted(unknown))} "
                    f"(give {', '.join(USER_FIELDS)})"
                )
            return cls(**value)
        raise InputError(f"feedback must be a dict, 'up'/'down' or a score, got {value!r}")


def _score(value: Any) -> float:
    """A feedback score: a finite number from 0 to 1 (NaN fails both comparisons)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and 0 <= value <= 1:
        return float(value)
    got = (
        repr(value)
        if isinstance(value, float)
        else "an integer"
        if number
        else type(value).__name__
    )
    raise InputError(f"score must be a number from 0 to 1, got {got}")


@dataclass
class Interaction:
    """One exchange: the messages the client sent (without any injected skill), the reply."""

    messages: list[Message]
    reply: str | None = None
    project: str = DEFAULT_PROJECT
    source: str = "api"
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created_at: float = field(default_factory=time.time)
    model: str | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None  # the call failed: kept for diagnostics, never a task
    error_status: int | None = None
    reference: Any = None  # a reference known when logged (e.g. an evals `ideal`)
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    skill_version: str | None = None  # the adopted skill the proxy injected
    private: bool = False  # holds private code: never sent to a remote model unless reviewed
    reviewed: bool = False
    dedupe_key: str | None = None  # one row per source message: re-harvesting adds nothing
    redactions: int = 0
    feedback: Feedback = field(default_factory=Feedback)  # merged; read from the log
    tools: list[dict[str, Any]] | None = None  # the request's OpenAI `tools` schema
    tool_choice: Any = None  # the request's `tool_choice`
    tool_calls: list[dict[str, Any]] | None = None
    """The reply's tool calls (OpenAI shape); for a harvested transcript turn, every call the
    agent made in it (their results in `meta["tool_results"]`)."""
    shadow_of: str | None = None
    """A shadow answer (`selftaught proxy --canary-mode shadow`): the id of the served row whose
    request it answered with the staged proposal; never returned to the client, never a task."""
    client: str | None = None
    """Who sent it: `operator` (CLI, Python API), a proxy client's key id (`key:<hash>`, never
    the key) or a label the operator assigned; None for rows logged before provenance."""
    session_id: str | None = None
    """The agent session the turn belongs to (Claude Code, Codex), chaining turns into one
    episode; None for a one-off request."""

    def prompt_head(self, chars: int = 60) -> str:
        """The last user message, on one line, cut to `chars`."""
        for msg in reversed(self.messages):
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, list):
                    content = " ".join(
                        str(p.get("text", "")) for p in content if isinstance(p, dict)
                    )
                text = " ".join(str(content or "").split())
                return text if len(text) <= chars else text[: chars - 1] + "…"
        return ""

    @property
    def is_task(self) -> bool:
        return self.error is None and self.shadow_of is None

    @property
    def not_task_reason(self) -> str:
        """Why `is_task` is False, in the words a night's report uses."""
        if self.shadow_of is not None:
            return "a shadow answer of a staged proposal (never served, never a task)"
        return "failed call (an error, never a task)"

    @property
    def effective_reference(self) -> Any:
        """The user's corrected reference when there is one, else the logged one."""
        return self.feedback.reference if self.feedback.reference is not None else self.reference

    def to_dict(self) -> dict[str, Any]:
        """The export format (one JSONL line); `from_dict` reads it back."""
        return {
            "id": self.id,
            "project": self.project,
            "source": self.source,
            "timestamp": iso_utc(self.created_at),
            "model": self.model,
            "messages": self.messages,
            "reply": self.reply,
            "latency_s": self.latency_s,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "error": self.error,
            "error_status": self.error_status,
            "reference": self.reference,
            "feedback": None if self.feedback.empty() else self.feedback.to_dict(),
            "tags": self.tags,
            "meta": self.meta,
            "skill_version": self.skill_version,
            "private": self.private,
            "reviewed": self.reviewed,
            "dedupe_key": self.dedupe_key,
            "redactions": self.redactions,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "tool_calls": self.tool_calls,
            "shadow_of": self.shadow_of,
            "client": self.client,
            "session_id": self.session_id,
        }


def iso_utc(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, timezone.utc)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str | float | datetime) -> float:
    """A point in time: epoch seconds, a datetime, ISO 8601 (naive = local time), or a
    duration back from now ('30m', '12h', '7d', '2w')."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    m = _RELATIVE.match(str(value))
    if m:
        return time.time() - float(m.group(1)) * _UNIT_S[m.group(2)]
    text = str(value).strip()
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InputError(
            f"not a time: {value!r} (use ISO 8601 like 2026-05-01 or 2026-05-01T08:00, "
            "or a duration back from now like 12h, 7d)"
        ) from None


# ---- schema ------------------------------------------------------------------------------

# Ordered migrations: index i takes the schema from version i to i + 1. Never edit a shipped
# one; append a new one.
MIGRATIONS: tuple[str, ...] = (
    # 1: the interaction log and its feedback.
    """
    CREATE TABLE interactions (
        id TEXT PRIMARY KEY,
        project TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at REAL NOT NULL,
        model TEXT,
        messages TEXT NOT NULL,
        reply TEXT,
        latency_s REAL,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        error TEXT,
        reference TEXT,
        tags TEXT NOT NULL DEFAULT '[]',
        meta TEXT NOT NULL DEFAULT '{}',
        redactions INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX interactions_project_time ON interactions(project, created_at);
    CREATE TABLE feedback (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        interaction_id TEXT NOT NULL REFERENCES interactions(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        thumb TEXT,
        score REAL,
        reference TEXT,
        comment TEXT
    );
    CREATE INDEX feedback_interaction ON feedback(interaction_id);
    """,
    # 2: provenance and privacy, for the proxy and the transcript harvesters.
    """
    ALTER TABLE interactions ADD COLUMN error_status INTEGER;
    ALTER TABLE interactions ADD COLUMN skill_version TEXT;
    ALTER TABLE interactions ADD COLUMN private INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE interactions ADD COLUMN reviewed INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE interactions ADD COLUMN dedupe_key TEXT;
    CREATE UNIQUE INDEX interactions_dedupe ON interactions(dedupe_key)
        WHERE dedupe_key IS NOT NULL;
    CREATE INDEX interactions_source_time ON interactions(source, created_at);
    """,
    # 3: tool-using traffic: the request's tools and tool_choice, the reply's tool calls (JSON).
    """
    ALTER TABLE interactions ADD COLUMN tools TEXT;
    ALTER TABLE interactions ADD COLUMN tool_choice TEXT;
    ALTER TABLE interactions ADD COLUMN tool_calls TEXT;
    """,
    # 4: probation: shadow answers of a staged proposal (linked to the served row), and the
    # per-version tallies read rows by the version that served them.
    """
    ALTER TABLE interactions ADD COLUMN shadow_of TEXT;
    CREATE INDEX interactions_project_version ON interactions(project, skill_version);
    """,
    # 5: provenance: who sent each row and in which agent session; who gave each feedback and
    # whether they are trusted (feedback stored before this version was the operator's).
    """
    ALTER TABLE interactions ADD COLUMN client TEXT;
    ALTER TABLE interactions ADD COLUMN session_id TEXT;
    CREATE INDEX interactions_project_session ON interactions(project, session_id)
        WHERE session_id IS NOT NULL;
    ALTER TABLE feedback ADD COLUMN giver TEXT;
    ALTER TABLE feedback ADD COLUMN trusted INTEGER NOT NULL DEFAULT 1;
    """,
    # 6: forgetting: the id and dedupe key (never the content) of each row deleted on purpose
    # (`sleep log forget`), so that no harvest, spool or copy stores it again.
    """
    CREATE TABLE forgotten (
        id TEXT PRIMARY KEY,
        dedupe_key TEXT,
        forgotten_at REAL NOT NULL
    );
    CREATE INDEX forgotten_dedupe ON forgotten(dedupe_key) WHERE dedupe_key IS NOT NULL;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring a SQLite log's schema up to `target` in one transaction; returns the version
    found. (A Postgres log migrates itself on open: `store.postgres.migrate`.)"""
    return sqlite_store.migrate(conn, MIGRATIONS, target)


# ---- queries ------------------------------------------------------------------------------


@dataclass
class LogFilter:
    """Which rows: every field narrows; None means any."""

    project: str | None = None
    source: str | None = None
    since: float | None = None
    until: float | None = None
    has_feedback: bool | None = None
    errors: bool | None = None  # True: failed calls only; False: tasks only
    tag: str | None = None
    skill_versions: tuple[str | None, ...] | None = None  # served by these (None: no skill)
    session_id: str | None = None  # the turns of one agent session
    client: str | None = None  # sent by this client (`key:<hash>`, `operator`, ...)
    ids: tuple[str, ...] | None = None  # these rows only (full ids)
    limit: int | None = None
    newest_first: bool = True

    def __post_init__(self) -> None:
        if self.limit is not None and not 0 <= self.limit <= MAX_ROWS:
            raise InputError(f"limit must be a number of rows from 0 to {MAX_ROWS}")

    def where(self, dialect: Dialect | None = None) -> tuple[str, list[Any]]:
        """The WHERE clause (with `?` placeholders) and its arguments."""
        from selftaught.sleep.store.dialect import SQLITE

        dialect = dialect or SQLITE
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (
            ("project", self.project),
            ("source", self.source),
            ("session_id", self.session_id),
            ("client", self.client),
        ):
            if value is not None:
                clauses.append(f"i.{column} = ?")
                args.append(value)
        if self.ids is not None:
            clauses.append(f"i.id IN ({', '.join('?' * len(self.ids))})" if self.ids else "1 = 0")
            args.extend(self.ids)
        if self.since is not None:
            clauses.append("i.created_at >= ?")
            args.append(self.since)
        if self.until is not None:
            clauses.append("i.created_at < ?")
            args.append(self.until)
        if self.has_feedback is not None:
            exists = "EXISTS (SELECT 1 FROM feedback f WHERE f.interaction_id = i.id)"
            clauses.append(exists if self.has_feedback else f"NOT {exists}")
        if self.errors is not None:
            clauses.append("i.error IS NOT NULL" if self.errors else "i.error IS NULL")
        if self.tag is not None:
            clauses.append(dialect.tag_clause)
            args.append(self.tag)
        if self.skill_versions is not None:
            named = [v for v in self.skill_versions if v is not None]
            either = [f"i.skill_version IN ({', '.join('?' * len(named))})"] if named else []
            either += ["i.skill_version IS NULL"] * (None in self.skill_versions)
            clauses.append("(" + (" OR ".join(either) or "1 = 0") + ")")
            args.extend(named)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


_COLUMNS = (
    "id, project, source, created_at, model, messages, reply, latency_s, prompt_tokens, "
    "completion_tokens, error, error_status, reference, tags, meta, skill_version, private, "
    "reviewed, dedupe_key, redactions, tools, tool_choice, tool_calls, shadow_of, client, "
    "session_id"
)
_FEEDBACK = "created_at, thumb, score, reference, comment, giver, trusted"
_DEDUPE_AT = _COLUMNS.split(", ").index("dedupe_key")
_SHADOW_OF_AT = _COLUMNS.split(", ").index("shadow_of")
_ROW_VALUES = f"({', '.join('?' * (_COLUMNS.count(',') + 1))})"
_INSERT_CHUNK = 200  # rows per INSERT: 5,200 parameters, well under either backend's limit


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching what starts with `prefix` (its wildcards escaped)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class TaskLog:
    """The log at `path`: a SQLite file, or a `postgresql://` URL (default:
    `$SELFTAUGHT_LOG`, else <home>/log.db). Shareable by threads; open one per process.
    `path` is the file, or the URL as a `LogUrl` (printing it hides the password)."""

    def __init__(
        self,
        path: str | Path | LogUrl | None = None,
        *,
        redactor: Redactor | None = None,
        busy_timeout_s: float = 30.0,
        write_timeout_s: float | None = None,
    ):
        """`busy_timeout_s` / `write_timeout_s`: how long a SQLite log waits for another
        writer's lock when it opens / on each later statement (default: as long), before
        `LogUnavailable`."""
        self.path: Path | LogUrl = log_location(path)
        self.redactor = redactor or default_redactor()
        self._backend = self._open(busy_timeout_s, write_timeout_s)
        self._dialect = self._backend.dialect

    def _open(
        self, busy_timeout_s: float, write_timeout_s: float | None
    ) -> sqlite_store.SqliteBackend | PostgresBackend:
        if isinstance(self.path, LogUrl):
            from selftaught.sleep.store.postgres import PostgresBackend

            return PostgresBackend(self.path, "log", MIGRATIONS)
        return sqlite_store.SqliteBackend(
            self.path, MIGRATIONS, busy_timeout_s=busy_timeout_s, write_timeout_s=write_timeout_s
        )

    @property
    def backend(self) -> str:
        """'sqlite' or 'postgres'."""
        return self._dialect.name

    # -- lifecycle
    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> TaskLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _exec(self, conn: Any, query: str, args: Iterable[Any] = ()) -> Any:
        """Run a query written in SQLite's words (`?` placeholders) on this backend."""
        return conn.execute(self._dialect.sql(query), self._backend.params(list(args)))

    def schema_version(self) -> int:
        return self._backend.schema_version()

    def integrity_check(self) -> str:
        return self._backend.integrity_check()

    def ping(self) -> None:
        """A write transaction that writes nothing: raises `LogUnavailable` when the log
        cannot be written now (the proxy's writer probes it so while it is away)."""
        with self._backend.write():
            pass

    # -- writing
    def redacted(self, it: Interaction) -> Interaction:
        """A copy of `it` with every secret redacted (and counted), as it would be stored.
        One redaction deadline covers the whole row: a text not redacted in time is stored
        as a placeholder that says so (counted as a redaction), never as it came."""
        red = self.redactor
        deadline = red.deadline()
        messages, n1 = red.redact_value(it.messages, deadline)
        reply, n2 = red.redact(it.reply, deadline) if it.reply is not None else (None, 0)
        error, n3 = red.redact(it.error, deadline) if it.error is not None else (None, 0)
        reference, n4 = red.redact_value(it.reference, deadline)
        meta, n5 = red.redact_value(it.meta, deadline)
        # tool calls get the same redaction as the tool turns in the messages, so a logged
        # call still matches the call its recorded result answers
        tool_calls, n6 = red.redact_value(it.tool_calls, deadline)
        tools, n7 = red.redact_value(it.tools, deadline)
        out = Interaction(**{f.name: getattr(it, f.name) for f in fields(it)})
        out.messages, out.reply, out.error, out.reference, out.meta = (
            messages,
            reply,
            error,
            reference,
            meta,
        )
        out.tool_calls, out.tools = tool_calls, tools
        out.redactions = it.redactions + n1 + n2 + n3 + n4 + n5 + n6 + n7
        return out

    @staticmethod
    def _validate(it: Interaction) -> None:
        check_project(it.project)
        if not isinstance(it.messages, list):
            raise InputError("messages must be a list of chat messages")
        if not it.source or not isinstance(it.source, str):
            raise InputError("source must be a non-empty string")

    def add(self, interaction: Interaction, *, redact: bool = True) -> bool:
        """Store one interaction; False when its id or dedupe key is already stored."""
        return self.add_many([interaction], redact=redact) == 1

    def add_many(self, interactions: Iterable[Interaction], *, redact: bool = True) -> int:
        """Store interactions in ONE transaction (all or nothing); returns how many were new
        (an id or dedupe key already stored is skipped)."""
        rows = []
        feedback: dict[str, tuple[Feedback, int]] = {}
        for it in interactions:
            self._validate(it)
            rows.append(_row(self.redacted(it) if redact else it))
            if not it.feedback.empty():
                feedback[it.id] = self._redact_feedback(it.feedback)
        with self._backend.write() as conn:
            inserted = self._insert_rows(conn, rows)
            for iid, (fb, redactions) in feedback.items():
                if iid in inserted:
                    self._insert_feedback(conn, iid, fb, redactions)
        return len(inserted)

    def _insert_rows(self, conn: Any, rows: list[tuple[Any, ...]]) -> set[str]:
        """Insert rows, skipping an id or dedupe key already stored or forgotten; the ids
        inserted. One statement per chunk of rows: one round trip to a database server, not
        one per row. The forgotten are taken out after the insert, not before: the insert
        waits for a `forget` in flight (`Dialect.forget_lock`), so its check sees that one's
        ids too."""
        inserted: set[str] = set()
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            values = ", ".join([_ROW_VALUES] * len(chunk))
            cur = self._exec(
                conn,
                f"INSERT INTO interactions ({_COLUMNS}) VALUES {values} "
                "ON CONFLICT DO NOTHING RETURNING id",
                [value for row in chunk for value in row],
            )
            new = {r[0] for r in cur.fetchall()}
            kept = self._not_forgotten(conn, [r for r in chunk if r[0] in new])
            dropped = new - {r[0] for r in kept}
            if dropped:
                marks = ", ".join("?" * len(dropped))
                self._exec(conn, f"DELETE FROM interactions WHERE id IN ({marks})", list(dropped))
            inserted |= new - dropped
        return inserted

    def _not_forgotten(self, conn: Any, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """`rows` less those whose id or dedupe key `forget` recorded, and the shadow answers
        of a forgotten row (one may arrive after its row was forgotten)."""
        if not rows:
            return rows
        ids = [r[0] for r in rows] + [r[_SHADOW_OF_AT] for r in rows if r[_SHADOW_OF_AT]]
        keys = [r[_DEDUPE_AT] for r in rows if r[_DEDUPE_AT] is not None]
        query = f"SELECT id, dedupe_key FROM forgotten WHERE id IN ({', '.join('?' * len(ids))})"
        if keys:
            query += f" OR dedupe_key IN ({', '.join('?' * len(keys))})"
        gone = self._exec(conn, query, ids + keys).fetchall()
        if not gone:
            return rows
        gone_ids, gone_keys = {g[0] for g in gone}, {g[1] for g in gone if g[1] is not None}
        return [
            r
            for r in rows
            if r[0] not in gone_ids
            and r[_SHADOW_OF_AT] not in gone_ids
            and r[_DEDUPE_AT] not in gone_keys
        ]

    # -- forgetting
    def forget(self, flt: LogFilter) -> list[str]:
        """Delete every row `flt` selects (its limit ignored), their feedback and the shadow
        answers logged beside them, in ONE transaction; record each one's id and dedupe key
        (no content) so that no harvest, spool drain or copy stores it again; a SQLite log's WAL
        is then checkpointed and truncated (`checkpoint`). Returns the ids deleted. What the
        stores outside the log hold of them is `selftaught.sleep.night.forget`'s to drop."""
        where, args = replace(flt, limit=None).where(self._dialect)
        with self._backend.write() as conn:
            self._hold_out_inserts(conn)
            found = self._exec(
                conn, f"SELECT i.id, i.dedupe_key FROM interactions i{where}", args
            ).fetchall()
            found += self._shadows_of(conn, [r[0] for r in found])
            now = time.time()
            self._bury(conn, [(r[0], r[1], now) for r in found])
        if found:
            self.checkpoint()
        return [r[0] for r in found]

    def checkpoint(self) -> bool:
        """Copy a SQLite log's WAL into its file and truncate the WAL (the pages as they were
        before a delete live there until then); `forget` does it. False when another process
        reading an older snapshot kept the WAL from being truncated (its next checkpoint
        will); always True on Postgres."""
        return self._backend.checkpoint()

    def forgotten_among(self, ids: Iterable[str]) -> set[str]:
        """Those of `ids` that `forget` deleted (what a store outside the log must drop)."""
        wanted = sorted(set(ids))
        found: set[str] = set()
        with self._backend.read() as conn:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                found.update(r[0] for r in self._exec(
                    conn, f"SELECT id FROM forgotten WHERE id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ).fetchall())  # fmt: skip
        return found

    def _shadows_of(self, conn: Any, ids: list[str]) -> list[tuple[Any, ...]]:
        """(id, dedupe key) of the shadow answers linked to `ids` and not among them."""
        chosen, shadows = set(ids), []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            shadows += self._exec(
                conn,
                "SELECT id, dedupe_key FROM interactions "
                f"WHERE shadow_of IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
        return [tuple(r) for r in shadows if r[0] not in chosen]

    def forgotten_entries(self) -> list[tuple[Any, ...]]:
        """Every (id, dedupe key, time) `forget` recorded, oldest first (`sleep log migrate`)."""
        with self._backend.read() as conn:
            found = self._exec(
                conn, "SELECT id, dedupe_key, forgotten_at FROM forgotten ORDER BY forgotten_at, id"
            ).fetchall()
        return [tuple(r) for r in found]

    def add_forgotten(self, entries: list[tuple[Any, ...]]) -> int:
        """Record `forgotten_entries` of another log here (and delete any of those rows found
        here) in ONE transaction; returns how many were new."""
        with self._backend.write() as conn:
            self._hold_out_inserts(conn)
            new = self._bury(conn, entries)
        if new:
            self.checkpoint()
        return new

    def _hold_out_inserts(self, conn: Any) -> None:
        """Wait for the inserts in flight and hold new ones until this transaction ends, so
        that a row stored meanwhile is either seen here or sees what this one forgot."""
        if self._dialect.forget_lock:
            self._exec(conn, self._dialect.forget_lock)

    def _bury(self, conn: Any, entries: list[tuple[Any, ...]]) -> int:
        """Record (id, dedupe key, time) entries as forgotten and delete the rows they name,
        by id or by dedupe key, with their feedback; returns how many entries were new."""
        new = 0
        for start in range(0, len(entries), _INSERT_CHUNK):
            chunk = entries[start : start + _INSERT_CHUNK]
            cur = self._exec(
                conn,
                "INSERT INTO forgotten (id, dedupe_key, forgotten_at) VALUES "
                + ", ".join(["(?, ?, ?)"] * len(chunk))
                + " ON CONFLICT DO NOTHING RETURNING id",
                [value for entry in chunk for value in entry],
            )
            new += len(cur.fetchall())
            ids, keys = [e[0] for e in chunk], [e[1] for e in chunk if e[1] is not None]
            named = f"id IN ({', '.join('?' * len(ids))})"
            named += f" OR dedupe_key IN ({', '.join('?' * len(keys))})" if keys else ""
            doomed = [r[0] for r in self._exec(
                conn, f"SELECT id FROM interactions WHERE {named}", ids + keys
            ).fetchall()]  # fmt: skip
            if doomed:
                marks = ", ".join("?" * len(doomed))
                self._exec(conn, f"DELETE FROM feedback WHERE interaction_id IN ({marks})", doomed)
                self._exec(conn, f"DELETE FROM interactions WHERE id IN ({marks})", doomed)
        return new

    def is_forgotten(self, interaction_id: str, dedupe_key: str | None) -> bool:
        with self._backend.read() as conn:
            found = self._exec(
                conn,
                "SELECT 1 FROM forgotten WHERE id = ? OR dedupe_key = ?",
                (interaction_id, dedupe_key),
            )
            return found.fetchone() is not None

    def _redact_feedback(self, feedback: Feedback) -> tuple[Feedback, int]:
        deadline = self.redactor.deadline()
        reference, n1 = self.redactor.redact_value(feedback.reference, deadline)
        comment, n2 = (
            self.redactor.redact(feedback.comment, deadline)
            if feedback.comment
            else (feedback.comment, 0)
        )
        redacted = Feedback(**{f.name: getattr(feedback, f.name) for f in fields(feedback)})
        redacted.reference, redacted.comment = reference, comment
        return redacted, n1 + n2

    def _insert_feedback(self, conn: Any, iid: str, fb: Feedback, redactions: int) -> None:
        self._exec(
            conn,
            "INSERT INTO feedback (interaction_id, created_at, thumb, score, reference, comment, "
            "giver, trusted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                iid,
                fb.created_at or time.time(),
                fb.thumb,
                fb.score,
                _dump(fb.reference),
                fb.comment,
                fb.giver,
                int(fb.trusted),
            ),
        )
        if redactions:
            self._exec(
                conn,
                "UPDATE interactions SET redactions = redactions + ? WHERE id = ?",
                (redactions, iid),
            )

    def add_feedback(
        self,
        interaction_id: str,
        feedback: Feedback | dict[str, Any] | str,
        *,
        giver: str = OPERATOR,
        trusted: bool = True,
    ) -> str:
        """Attach feedback to an interaction (an id or a unique prefix of one, 6+ characters);
        returns the full id. It is stamped now, as given by `giver` (the operator by default;
        the proxy passes its client, untrusted)."""
        fb = Feedback.coerce(feedback)
        if fb is None or fb.empty():
            raise InputError("feedback is empty: give a thumb, a score, a reference or a comment")
        full_id = self.resolve_id(interaction_id)
        fb = Feedback(fb.thumb, fb.score, fb.reference, fb.comment, time.time(), giver, trusted)
        red, n = self._redact_feedback(fb)
        with self._backend.write() as conn:
            self._insert_feedback(conn, full_id, red, n)
        return full_id

    def mark_reviewed(self, interaction_ids: Iterable[str], reviewed: bool = True) -> int:
        ids = [self.resolve_id(i) for i in interaction_ids]
        with self._backend.write() as conn:
            return sum(
                self._exec(
                    conn, "UPDATE interactions SET reviewed = ? WHERE id = ?", (int(reviewed), i)
                ).rowcount
                for i in ids
            )

    # -- reading
    def resolve_id(self, prefix: str) -> str:
        prefix = prefix.strip()
        with self._backend.read() as conn:
            exact = self._exec(conn, "SELECT id FROM interactions WHERE id = ?", (prefix,))
            exact = exact.fetchone()
            if exact:
                full: str = exact[0]
                return full
            if len(prefix) < 6:
                raise LogError(f"no interaction with id {prefix!r} in {self.path}")
            # lower() on both sides: SQLite's LIKE ignores ASCII case, Postgres' does not
            found = self._exec(
                conn,
                "SELECT id FROM interactions WHERE lower(id) LIKE ? ESCAPE '\\' LIMIT 2",
                (_like_prefix(prefix.lower()),),
            ).fetchall()
        if not found:
            raise LogError(f"no interaction with id {prefix!r} in {self.path}")
        if len(found) > 1:
            raise LogError(f"id prefix {prefix!r} is ambiguous in {self.path}; give more of it")
        unique: str = found[0][0]
        return unique

    def get(self, interaction_id: str) -> Interaction:
        full_id = self.resolve_id(interaction_id)
        (found,) = self._select(" WHERE i.id = ?", [full_id], "")
        return found

    def query(self, flt: LogFilter | None = None) -> list[Interaction]:
        flt = flt or LogFilter()
        where, args = flt.where(self._dialect)
        order = f" ORDER BY i.created_at {'DESC' if flt.newest_first else 'ASC'}, "
        order += self._dialect.row_order
        if flt.limit is not None:
            order += f" LIMIT {int(flt.limit)}"
        return self._select(where, args, order)

    def count(self, flt: LogFilter | None = None) -> int:
        where, args = (flt or LogFilter()).where(self._dialect)
        with self._backend.read() as conn:
            row = self._exec(conn, f"SELECT COUNT(*) FROM interactions i{where}", args).fetchone()
        n: int = row[0]
        return n

    def _select(self, where: str, args: list[Any], order: str) -> list[Interaction]:
        with self._backend.read() as conn:
            rows = self._exec(
                conn, f"SELECT {_COLUMNS} FROM interactions i{where}{order}", args
            ).fetchall()
            found = [_interaction(r) for r in rows]
            by_id = {it.id: it for it in found}
            ids = list(by_id)
            untrusted_fields: dict[str, set[str]] = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for entry in self._exec(
                    conn,
                    "SELECT interaction_id, created_at, thumb, score, reference, comment, "
                    "giver, trusted FROM feedback "
                    f"WHERE interaction_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY trusted, created_at, id",
                    chunk,
                ):
                    untrusted = untrusted_fields.setdefault(entry[0], set())
                    _merge_feedback(by_id[entry[0]].feedback, entry, untrusted)
        return found

    def rows_by_id(self, ids: list[str]) -> list[Interaction]:
        """The rows with these ids (feedback merged), in no particular order."""
        if not ids:
            return []
        return self._select(f" WHERE i.id IN ({', '.join('?' * len(ids))})", list(ids), "")

    def has_dedupe_key(self, key: str) -> bool:
        with self._backend.read() as conn:
            found = self._exec(conn, "SELECT 1 FROM interactions WHERE dedupe_key = ?", (key,))
            return found.fetchone() is not None

    # -- copying between logs (`sleep log migrate`): rows as stored, already redacted
    def raw_page(
        self, after: Any, limit: int
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], Any]:
        """Up to `limit` rows as stored, in insertion order after the position `after` (None:
        from the first), their feedback entries (interaction_id first, in `_FEEDBACK` order)
        and the position of the last one. Copying in this order keeps the order of rows
        logged in the same instant."""
        order = self._dialect.row_order
        where, args = (f" WHERE {order} > ?", [after]) if after is not None else ("", [])
        with self._backend.read() as conn:
            rows = self._exec(
                conn,
                f"SELECT {_COLUMNS}, {order} FROM interactions i{where} ORDER BY {order} "
                f"LIMIT {int(limit)}",
                args,
            ).fetchall()
            feedback = self._feedback_of(conn, [r[0] for r in rows])
        last = rows[-1][-1] if rows else after
        return [tuple(r[:-1]) for r in rows], feedback, last

    def _feedback_of(self, conn: Any, ids: list[str]) -> list[tuple[Any, ...]]:
        if not ids:
            return []
        return [
            tuple(e)
            for e in self._exec(
                conn,
                f"SELECT interaction_id, {_FEEDBACK} FROM feedback "
                f"WHERE interaction_id IN ({', '.join('?' * len(ids))}) ORDER BY id",
                ids,
            )
        ]

    def add_raw(
        self, rows: list[tuple[Any, ...]], feedback: list[tuple[Any, ...]]
    ) -> tuple[int, int]:
        """Store rows as they are (no redaction: they were redacted when first stored) and
        the feedback entries not already here (compared whole), in ONE transaction. Returns
        (rows new, feedback entries new); running it again adds nothing."""
        new_feedback = 0
        with self._backend.write() as conn:
            new_rows = len(self._insert_rows(conn, rows))
            stored = self._feedback_of(conn, sorted({e[0] for e in feedback}))
            for entry in feedback:
                if entry in stored:
                    stored.remove(entry)  # one stored entry answers one copied entry
                    continue
                self._exec(
                    conn,
                    f"INSERT INTO feedback (interaction_id, {_FEEDBACK}) "
                    f"VALUES ({', '.join('?' * len(entry))})",
                    entry,
                )
                new_feedback += 1
        return new_rows, new_feedback

    def export_jsonl(self, path: str | Path, flt: LogFilter | None = None) -> int:
        """Write the rows (oldest first) as JSONL, atomically; returns how many."""
        from selftaught.runs import atomic_write_text, json_text

        flt = flt or LogFilter()
        flt.newest_first = False
        rows = self.query(flt)
        text = "".join(json_text(r.to_dict()) + "\n" for r in rows)
        with writing_to(path, "the export"):
            atomic_write_text(path, text)
        return len(rows)


def _merge_feedback(fb: Feedback, entry: tuple[Any, ...], untrusted: set[str]) -> None:
    """Apply one stored feedback entry over what came before it, per field. Entries come
    untrusted first, then by time, so the operator's word outranks any end user's; `untrusted`
    holds the fields whose value an untrusted giver set."""
    _, created, thumb, score, ref, comment, giver, trusted = entry
    values = {"thumb": thumb, "score": score, "reference": _load(ref), "comment": comment}
    for name, value in values.items():
        if value is not None:
            setattr(fb, name, value)
            (untrusted.discard if trusted else untrusted.add)(name)
    fb.created_at, fb.giver, fb.trusted = created, giver, not untrusted
    fb.untrusted_fields = tuple(name for name in USER_FIELDS if name in untrusted)


def _row(it: Interaction) -> tuple[Any, ...]:
    return (
        it.id,
        it.project,
        it.source,
        it.created_at,
        it.model,
        json.dumps(it.messages, ensure_ascii=False),
        it.reply,
        it.latency_s,
        it.prompt_tokens,
        it.completion_tokens,
        it.error,
        it.error_status,
        _dump(it.reference),
        json.dumps(list(it.tags), ensure_ascii=False),
        json.dumps(it.meta, ensure_ascii=False),
        it.skill_version,
        int(it.private),
        int(it.reviewed),
        it.dedupe_key,
        it.redactions,
        _dump(it.tools),
        _dump(it.tool_choice),
        _dump(it.tool_calls),
        it.shadow_of,
        it.client,
        it.session_id,
    )


def _interaction(r: tuple[Any, ...]) -> Interaction:
    return Interaction(
        id=r[0],
        project=r[1],
        source=r[2],
        created_at=r[3],
        model=r[4],
        messages=json.loads(r[5]),
        reply=r[6],
        latency_s=r[7],
        prompt_tokens=r[8],
        completion_tokens=r[9],
        error=r[10],
        error_status=r[11],
        reference=_load(r[12]),
        tags=json.loads(r[13]),
        meta=json.loads(r[14]),
        skill_version=r[15],
        private=bool(r[16]),
        reviewed=bool(r[17]),
        dedupe_key=r[18],
        redactions=r[19],
        tools=_load(r[20]),
        tool_choice=_load(r[21]),
        tool_calls=_load(r[22]),
        shadow_of=r[23],
        client=r[24],
        session_id=r[25],
    )


# ---- the Python entry point ------------------------------------------------------------------

_open_logs: dict[Path | LogUrl, TaskLog] = {}
_open_lock = threading.Lock()


def open_log(path: str | Path | LogUrl | None = None) -> TaskLog:
    """A TaskLog shared within this process, per path or URL."""
    where = log_location(path)
    resolved = where if isinstance(where, LogUrl) else where.resolve()
    with _open_lock:
        log = _open_logs.get(resolved)
        if log is None:
            log = _open_logs[resolved] = TaskLog(resolved)
        return log


def log_interaction(
    messages: list[Message] | str,
    reply: str | None,
    *,
    project: str = DEFAULT_PROJECT,
    model: str | None = None,
    feedback: Feedback | dict[str, Any] | str | float | None = None,
    reference: Any = None,
    tags: Iterable[str] = (),
    source: str = "api",
    latency_s: float | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    error: str | None = None,
    meta: dict[str, Any] | None = None,
    log: TaskLog | str | Path | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> str:
    """Log one interaction of your agent (redacted) and return its id, for feedback later.

    `messages` is the chat the model saw (a string means one user message); `feedback` may be
    'up' / 'down', a score, a dict or a `Feedback`; `reference` is the right answer if known.
    A tool-using agent passes the request's `tools` / `tool_choice`, the reply's `tool_calls`
    and the tool turns in `messages`: such an interaction is replayed as an episode."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    interaction = Interaction(
        messages=messages,
        reply=reply,
        project=project,
        source=source,
        model=model,
        latency_s=latency_s,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        error=error,
        reference=reference,
        tags=list(tags),
        meta=dict(meta or {}),
        feedback=Feedback.coerce(feedback) or Feedback(),
        tools=tools,
        tool_choice=tool_choice,
        tool_calls=tool_calls,
    )
    target = log if isinstance(log, TaskLog) else open_log(log)
    target.add(interaction)
    return interaction.id
