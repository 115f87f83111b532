"""Ways in besides the proxy: `log_interaction`, JSONL import (three formats, all or nothing),
and the Claude Code / Codex transcript harvesters on fixture files that follow their formats."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from selftaught.sleep.intake.harvest import HarvestConfig, harvest, resolve_sources
from selftaught.sleep.intake.harvest.import_jsonl import ImportFormatError, import_file
from selftaught.sleep.intake.log import LogFilter, TaskLog, log_interaction

FIXTURES = Path(__file__).parent / "fixtures"
CLAUDE = FIXTURES / "claude_code" / "projects"
CODEX = FIXTURES / "codex"
EVER = HarvestConfig(since=0)


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def log(tmp_path) -> TaskLog:
    return TaskLog(tmp_path / "log.db")


# ---- import --------------------------------------------------------------------------------


def test_import_detects_each_format(tmp_path, log):
    path = write(
        tmp_path / "mixed.jsonl",
        [
            {  # OpenAI chat: the final assistant turn is the reply
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of Peru?"},
                    {"role": "assistant", "content": "Lima"},
                ]
            },
            {  # OpenAI evals
                "input": [{"role": "user", "content": "2+2?"}],
                "ideal": ["4", "four"],
            },
            {  # ours, with feedback and a private flag that must survive
                "id": "keep-this-id",
                "project": "shop",
                "source": "proxy",
                "timestamp": "2026-02-01T10:00:00Z",
                "messages": [{"role": "user", "content": "refund policy?"}],
                "reply": "30 days",
                "feedback": {"thumb": "down", "reference": "60 days"},
                "private": True,
                "tags": ["support"],
            },
        ],
    )
    result = import_file(path, log)
    assert (result.read, result.inserted) == (3, 3)
    assert result.formats == {"openai-chat": 1, "openai-evals": 1, "selftaught": 1}
    rows = {r.source + ":" + (r.reply or "-"): r for r in log.query()}
    chat = rows["import:Lima"]
    assert [m["role"] for m in chat.messages] == ["system", "user"]
    evals = rows["import:-"]
    assert evals.reference == ["4", "four"] and evals.reply is None
    ours = log.get("keep-this-id")
    assert ours.project == "shop" and ours.private and ours.feedback.thumb == "down"
    assert ours.effective_reference == "60 days"
    assert ours.created_at == 1769940000.0
    # importing again adds nothing: ids are kept, other lines carry a content key
    again = import_file(path, log)
    assert (again.inserted, again.duplicates) == (0, 3) and log.count() == 3


def test_import_round_trips_an_export(tmp_path, log):
    log_interaction("q1", "a1", project="p", feedback="up", tags=["x"], log=log)
    log_interaction("q2", None, project="p", error="HTTP 503: overloaded", log=log)
    exported = tmp_path / "export.jsonl"
    assert log.export_jsonl(exported) == 2
    other = TaskLog(tmp_path / "other.db")  # the operator's own export: its trust is theirs
    assert import_file(exported, other, trust_fields=True).inserted == 2
    assert [r.to_dict() for r in other.query()] == [r.to_dict() for r in log.query()]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"messages": [{"role": "user", "content": "hi"}', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt": "hi", "completion": "ho"}', "unknown format"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}', "needs a `role`"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', "only the assistant"),
        ('{"input": [], "ideal": "1"}', "`input` must be a non-empty list"),
        ('{"input": "q", "ideal": 5}', "`ideal` must be a string or a list"),
        ('{"messages": [{"role": "user", "content": "q"}], "reply": "a", "colour": 1}', "colour"),
        (
            '{"messages": [{"role": "user", "content": "q"}], "reply": "a", "feedback": "meh"}',
            "thumb",
        ),
        ('{"messages": [{"role": "user", "content": "q"}], "reply": 3}', "`reply` must be"),
    ],
)
def test_a_bad_line_names_file_and_line_and_nothing_is_imported(tmp_path, log, bad, message):
    good = {"input": "fine", "ideal": "ok"}
    path = write(tmp_path / "bad.jsonl", [good, good | {"ideal": "also"}, "", bad, good])
    with pytest.raises(ImportFormatError, match=message) as info:
        import_file(path, log)
    assert f"{path}:4:" in str(info.value)
    assert log.count() == 0  # nothing half-imported


def test_import_project_override_and_bad_project(tmp_path, log):
    path = write(tmp_path / "a.jsonl", [{"input": "q", "ideal": "a"}])
    import_file(path, log, project="team-a")
    assert log.query()[0].project == "team-a"
    with pytest.raises(ValueError, match="invalid project name"):
        import_file(path, log, project="../etc")


def test_log_interaction_python_api(log):
    iid = log_interaction(
        [{"role": "user", "content": "translate 'chat' to English"}],
        "cat",
        project="translator",
        model="gpt-4o-mini",
        feedback={"thumb": "up", "score": 1.0},
        reference="cat",
        tags=["fr-en"],
        log=log,
    )
    row = log.get(iid)
    assert row.source == "api" and row.project == "translator" and row.reference == "cat"
    assert row.feedback.score == 1.0 and row.tags == ["fr-en"]


# ---- harvest ------------------------------------------------------------------------------


def test_claude_code_fixture_is_harvested_into_requests_and_answers(log):
    report = harvest("claude-code", log, EVER, root=CLAUDE)
    assert (report.sessions_read, report.found, report.inserted) == (1, 3, 3)
    assert report.malformed == []
    rows = log.query(LogFilter(source="claude-code", newest_first=False))
    first, second, third = rows
    assert first.messages == [
        {
            "role": "user",
            "content": "Add a --verbose flag to the CLI in src/cli.py that sets the log level "
            "to DEBUG.",
        }
    ]
    assert first.reply.startswith("Added `--verbose`")  # the text after the last tool call
    assert first.meta["tools"] == ["Read", "Edit"] and first.model == "claude-opus-4-6"
    assert first.project == "webapp" and first.meta["git_branch"] == "main"
    assert first.completion_tokens == 61 + 140 + 48  # each API response counted once
    assert first.latency_s == pytest.approx(8.3, abs=0.01)
    # the second request sees the first exchange as context; its secret is redacted
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    assert "s3cretPassw0rd" not in second.messages[-1]["content"] and second.redactions == 1
    assert second.meta["tool_errors"] == 1 and second.model == "claude-sonnet-4-5"
    assert "Found it in tests/conftest.py" not in (second.reply or "")  # sidechain skipped
    # the third was interrupted during a tool call: no answer, but kept as a request
    assert third.reply is None and third.meta["answered"] is False
    assert all(r.private and not r.reviewed and r.is_task for r in rows)
    assert not any("DATABASE_URL." in r.messages[-1]["content"] for r in rows)  # subagent file


def test_codex_fixture_uses_events_and_turn_ids(log):
    report = harvest("codex", log, EVER, root=CODEX)
    assert (report.sessions_read, report.found) == (2, 3)
    rows = log.query(LogFilter(source="codex", newest_first=False))
    old, first, second = rows
    assert old.messages[-1]["content"] == "what is 2+2? just give me the answer"
    assert old.reply == "4" and old.model == "gpt-5-codex" and old.prompt_tokens == 2946
    assert first.messages[-1]["content"].startswith("invoice totals are off")
    assert all("environment_context" not in m["content"] for r in rows for m in r.messages)
    assert all("AGENTS.md" not in m["content"] for r in rows for m in r.messages)
    assert first.reply.startswith("Fixed: `total()`")
    assert first.meta["tools"] == ["exec_command", "apply_patch"]
    assert (first.prompt_tokens, first.completion_tokens) == (36446, 597)
    assert (second.prompt_tokens, second.completion_tokens) == (58094 - 36446, 640 - 597)
    assert second.dedupe_key.endswith("019cd2e1-9b10-7e01-a1b2-c3d4e5f60002")
    assert "ghp_" not in second.messages[-1]["content"]
    assert first.project == "billing-service" and first.meta["git_branch"] == "fix/rounding"


def test_harvest_is_idempotent_and_picks_up_new_turns(tmp_path, log):
    root = tmp_path / "projects"
    shutil.copytree(CLAUDE, root)
    assert harvest("claude-code", log, EVER, root=root).inserted == 3
    again = harvest("claude-code", log, EVER, root=root)
    assert (again.found, again.inserted) == (3, 0)
    (session,) = root.glob("*/*.jsonl")
    with session.open("a") as f:  # the agent keeps writing: a new request, then a torn line
        f.write(
            json.dumps(
                {
                    "type": "user",
                    "uuid": "b4000000-0000-4000-8000-000000000001",
                    "sessionId": "7f3c2a91-5b4e-4c1d-9e8f-2a6b0c4d1e33",
                    "timestamp": "2026-03-10T10:00:00.000Z",
                    "cwd": "/home/dev/src/webapp",
                    "message": {"role": "user", "content": "Thanks! Now bump the version."},
                }
            )
            + "\n"
            + '{"type": "assistant", "message": {"role": "assis'
        )
    third = harvest("claude-code", log, EVER, root=root)
    assert (third.found, third.inserted) == (4, 1)
    assert len(third.malformed) == 1 and f"{session}:" in third.malformed[0]
    assert log.count() == 4


def test_lookback_window_and_caps(tmp_path, log):
    since = HarvestConfig(since=time.mktime((2026, 1, 1, 0, 0, 0, 0, 0, -1)))
    report = harvest("codex", log, since, root=CODEX)
    assert report.found == 2  # the 2025 session is outside the window
    capped = harvest(
        "codex", TaskLog(tmp_path / "c.db"), HarvestConfig(since=0, max_tasks=1), root=CODEX
    )
    assert capped.found == 1 and capped.capped == "max-tasks"
    one = harvest(
        "codex", TaskLog(tmp_path / "s.db"), HarvestConfig(since=0, max_sessions=1), root=CODEX
    )
    assert one.sessions_read == 1 and one.capped == "max-sessions"
    # sessions whose files were last written before the window are not even opened
    old_root = tmp_path / "codex"
    shutil.copytree(CODEX, old_root)
    for p in old_root.rglob("*.jsonl"):
        os.utime(p, (1_000_000, 1_000_000))
    stale = harvest(
        "codex", TaskLog(tmp_path / "o.db"), HarvestConfig(lookback_days=7), root=old_root
    )
    assert (stale.sessions_read, stale.sessions_too_old, stale.found) == (0, 2, 0)
    with pytest.raises(ValueError, match="max_sessions"):
        HarvestConfig(max_sessions=0)


def test_project_override_and_auto_sources(tmp_path, monkeypatch, log):
    report = harvest("claude-code", log, HarvestConfig(since=0, project="mine"), root=CLAUDE)
    assert report.inserted == 3 and {r.project for r in log.query()} == {"mine"}
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "no-claude"))
    monkeypatch.setenv("CODEX_HOME", str(CODEX))
    assert resolve_sources("auto") == ["codex"]
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(CLAUDE.parent))
    assert resolve_sources("auto") == ["claude-code", "codex"]
    with pytest.raises(ValueError, match="valid: auto, claude-code, codex"):
        resolve_sources("cursor")
