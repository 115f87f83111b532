"""Probation: each adopted version watched on live traffic. Outcome rules, rows a night trained
on left out, Newcombe's interval, verdicts; through the proxy with a scripted upstream: a worse
version adopted with --force rolled back by --auto-rollback, shadow and serve canaries; the
log migration that adds `shadow_of`; the CLI."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from fastapi import FastAPI, Request  # noqa: E402  (module level: the endpoint's annotations)

from selftaught import cli  # noqa: E402
from selftaught.errors import ConfigError  # noqa: E402
from selftaught.runs import atomic_write_json, atomic_write_text  # noqa: E402
from selftaught.sleep.adoption import staging  # noqa: E402
from selftaught.sleep.intake.canary import CanaryError, picked, start_canary  # noqa: E402
from selftaught.sleep.intake.harvest.import_jsonl import import_file  # noqa: E402
from selftaught.sleep.intake.log import (  # noqa: E402
    MIGRATIONS,
    SCHEMA_VERSION,
    Feedback,
    Interaction,
    LogFilter,
    TaskLog,
    migrate,
)
from selftaught.sleep.intake.probation import (  # noqa: E402
    Lineage,
    ProbationConfig,
    Tally,
    compare,
    evaluate,
    maybe_roll_back,
    outcome,
    probation_for,
    read_lineage,
)
from selftaught.sleep.intake.proxy import (  # noqa: E402
    ID_HEADER,
    ProxyConfig,
    ProxyError,
    Upstream,
    create_proxy_app,
    proxy_in_background,
)
from selftaught.sleep.night.mine import MineConfig, mine_one  # noqa: E402
from selftaught.sleep.night.summary import status_lines  # noqa: E402
from selftaught.stats import newcombe_interval  # noqa: E402

PROJECT = "demo"


def row(reply: str | None = "4", version: str | None = "1", **kw: Any) -> Interaction:
    fb = kw.pop("feedback", None)
    return Interaction(
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        reply=reply,
        project=PROJECT,
        source=kw.pop("source", "proxy"),
        skill_version=version,
        feedback=Feedback.coerce(fb) or Feedback(),
        **kw,
    )


# ---- statistics ---------------------------------------------------------------------------


def test_newcombe_hybrid_score_interval_matches_the_textbook_example():
    # Newcombe (1998), Statistics in Medicine 17:873, example (a): 56/70 vs 48/80, method 10
    lo, hi = newcombe_interval(56, 70, 48, 80)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    assert newcombe_interval(0, 0, 3, 10) == (-1.0, 1.0)
    lo, hi = newcombe_interval(0, 10, 10, 10)  # bounded at -1
    assert lo >= -1.0 and hi < 0


def tally(version: str, successes: int, outcomes: int) -> Tally:
    t = Tally(version, requests=outcomes, outcomes=outcomes, successes=successes)
    t.close(1.96)
    return t


def test_verdicts_too_few_ok_and_drop():
    config = ProbationConfig(min_outcomes=20)
    assert compare("adopted", tally("2", 5, 19), tally("1", 40, 50), config).verdict == "too_few"
    assert compare("adopted", tally("2", 30, 40), tally("1", 40, 50), config).verdict == "ok"
    drop = compare("adopted", tally("2", 10, 40), tally("1", 40, 50), config)
    assert drop.verdict == "drop" and drop.interval[1] < 0 and drop.diff == pytest.approx(-0.55)
    better = compare("adopted", tally("2", 40, 40), tally("1", 20, 50), config)
    assert better.verdict == "ok"  # only a drop is acted on
    with pytest.raises(ConfigError):
        ProbationConfig(min_outcomes=0)
    with pytest.raises(ConfigError):
        ProbationConfig(confidence=1.0)


# ---- outcomes -------------------------------------------------------------------------------


def test_outcome_rules_correction_thumb_score_logged_reference():
    # a correction is scored with the night's reference check, whatever the thumb says
    assert outcome(row("The answer is 4.", feedback={"reference": "4", "thumb": "down"})) == 1
    assert outcome(row("The answer is 5.", feedback={"reference": "4", "thumb": "up"})) == 0
    assert outcome(row("It is 7 km", feedback={"reference": "7 km"})) == 1  # quantity
    assert outcome(row("It is 7", feedback={"reference": "7 km"})) == 0  # the unit is missing
    assert outcome(row(feedback="up")) == 1
    assert outcome(row(feedback="down")) == 0
    assert outcome(row(feedback=0.5)) == 1 and outcome(row(feedback=0.2)) == 0
    assert outcome(row("4", reference="4")) == 1  # a reference logged with the request
    assert outcome(row("5", reference="4")) == 0
    assert outcome(row()) is None  # no signal
    assert outcome(row(feedback={"comment": "hm"})) is None
    assert outcome(row(None, error="HTTP 500", feedback="down")) is None  # errors: never


def test_a_corrected_tool_call_is_checked_against_the_reply_calls():
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    made = [{"id": "c1", "type": "function",
             "function": {"name": "calc", "arguments": '{"x": "2+2"}'}}]  # fmt: skip
    right = {"name": "calc", "arguments": {"x": "2+2"}}
    wrong = {"name": "calc", "arguments": {"x": "2*2"}}
    assert outcome(row("", tools=tools, tool_calls=made, feedback={"reference": right})) == 1
    assert outcome(row("", tools=tools, tool_calls=made, feedback={"reference": wrong})) == 0


def test_tallies_count_errors_apart_and_skip_rows_of_unknown_version():
    rows = [
        row(feedback="up"),
        row(feedback="down"),
        row(None, error="HTTP 502"),
        row(),
        row(version=None, feedback="up"),  # served with nothing adopted: version 0
        row(version=None, feedback="up", source="api"),  # not through the proxy: no version
    ]
    result = evaluate(rows, Lineage("1", "0"))
    v1 = next(t for t in result.tallies if t.version == "1")
    v0 = next(t for t in result.tallies if t.version == "0")
    assert (v1.requests, v1.errors, v1.outcomes, v1.successes) == (4, 1, 2, 1)
    assert (v0.requests, v0.outcomes) == (1, 1)
    assert result.adopted is not None and result.adopted.verdict == "too_few"


# ---- a project on disk ---------------------------------------------------------------------


def stage(home: Path, night: str, skill: str, *, base: int = 0, tasks=(), adapter=None) -> Path:
    """A staged night as `sleep run` leaves it (the fields adopt and probation read)."""
    folder = staging.nights_dir(PROJECT, home) / night
    atomic_write_text(folder / "proposal" / "skill.md", skill)
    atomic_write_text(folder / "proposal" / "memory.md", "")
    proposal = {"adapter": adapter} if adapter else {}
    atomic_write_json(folder / "report.json", {"kind": staging.NIGHT_KIND, "night": night,
                      "project": PROJECT, "status": "staged", "base_version": base,
                      "proposal": proposal})  # fmt: skip
    lines = [json.dumps({"id": f"t{i}", "split": split, "sources": ids})
             for i, (split, ids) in enumerate(tasks)]  # fmt: skip
    atomic_write_text(folder / "tasks.jsonl", "".join(line + "\n" for line in lines))
    return folder


def test_rows_a_version_was_trained_or_gated_on_are_left_out(tmp_path, log_at):
    home = tmp_path / "home"
    old = [row(version=None, feedback="down") for _ in range(6)]
    stage(home, "n1", "GOOD", tasks=[("train", [old[0].id, old[1].id]), ("val", [old[2].id]),
                                     ("test", [old[3].id])])  # fmt: skip
    staging.adopt(PROJECT, "n1", home=home)
    lineage = read_lineage(PROJECT, home)
    assert lineage.current == "1" and lineage.replaced == "0"
    assert lineage.trained == {old[0].id, old[1].id, old[2].id}  # the test split stays
    result = evaluate([*old, row(feedback="up")], lineage)
    v0 = next(t for t in result.tallies if t.version == "0")
    assert (v0.requests, v0.excluded, v0.outcomes) == (6, 3, 3)


# ---- through the proxy -------------------------------------------------------------------------


def answer_for(messages: list[dict[str, Any]]) -> str:
    """The scripted model: right with the GOOD skill, off by one with BAD, by two with STAGED."""
    system = " ".join(str(m.get("content")) for m in messages if m.get("role") == "system")
    a, b = map(int, re.findall(r"\d+", str(messages[-1]["content"]))[:2])
    off = 1 if "BAD" in system else 2 if "STAGED" in system else 0
    return f"The answer is {a + b + off}."


def upstream_app() -> Any:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        message = {"role": "assistant", "content": answer_for(body["messages"])}
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 4}}  # fmt: skip

    return app


def scripted_upstream() -> Upstream:
    transport = httpx.ASGITransport(app=upstream_app())
    return Upstream(httpx.AsyncClient(transport=transport), "http://upstream/v1", "m",
                    False, None, False)  # fmt: skip


FEEDBACK_KEY = "operator-feedback-key"
OPERATOR = {"x-api-key": FEEDBACK_KEY}  # the operator's feedback: trusted, counted by probation


def proxy_config(tmp_path: Path, log_at: Path | str | None = None, **kw: Any) -> ProxyConfig:
    return ProxyConfig(upstream="http://upstream/v1#m", project=PROJECT, port=0,
                       log_path=log_at or tmp_path / "log.db", home=tmp_path / "home",
                       feedback_key=FEEDBACK_KEY, **kw)  # fmt: skip


def ask(client: httpx.Client, url: str, i: int) -> tuple[str, str]:
    body = {"model": "m", "messages": [{"role": "user", "content": f"What is {i} + {i + 1}?"}]}
    r = client.post(f"{url}/chat/completions", json=body)
    r.raise_for_status()
    return r.headers[ID_HEADER], r.json()["choices"][0]["message"]["content"]


def thumb(client: httpx.Client, url: str, iid: str, reply: str, i: int) -> None:
    right = reply == f"The answer is {2 * i + 1}."
    body = {"id": iid, "thumb": "up" if right else "down"}
    client.post(f"{url}/feedback", json=body, headers=OPERATOR).raise_for_status()


def test_a_no_val_nights_version_is_rolled_back_without_auto_rollback(tmp_path, log_at):
    """A version adopted from a `--no-val` night is on probation with auto-rollback by
    default: the proxy, started with neither --auto-rollback nor a canary, watches it once it
    serves and rolls it back on a drop."""
    home = tmp_path / "home"
    stage(home, "n1", "GOOD")
    staging.adopt(PROJECT, "n1", home=home)
    report = stage(home, "n2", "BAD", base=1) / "report.json"
    written = json.loads(report.read_text())
    atomic_write_json(report, {**written, "gate": {"mode": "off", "no_val": True}})
    config = proxy_config(tmp_path, log_at, probation=ProbationConfig(10))
    assert not config.watched
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        for i in range(12):
            thumb(client, url, *ask(client, url, i), i)
        assert app.state.proxy.watch is None  # version 1 went through a gate
        staging.adopt(PROJECT, "n2", home=home)
        for i in range(12, 40):
            iid, reply = ask(client, url, i)
            thumb(client, url, iid, reply, i)
            watch = app.state.proxy.watch
            assert watch is not None and watch.wait_idle(30)
            if staging.current_version(PROJECT, home) == 1:
                break
    assert staging.current_version(PROJECT, home) == 1
    events = [e for e in staging.events(PROJECT, home) if e["event"] == "auto_rollback"]
    assert [(e["previous"], e["version"], e["by"]) for e in events] == [(2, 1, "proxy")]


def test_a_worse_version_adopted_with_force_is_rolled_back(tmp_path, log_at):
    home = tmp_path / "home"
    stage(home, "n1", "GOOD")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "BAD")  # gated against version 0, adopted over 1 anyway
    config = proxy_config(tmp_path, log_at, auto_rollback=True, probation=ProbationConfig(10))
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        watch = app.state.proxy.watch
        for i in range(12):
            thumb(client, url, *ask(client, url, i), i)
        staging.adopt(PROJECT, "n2", home=home, force=True)
        flagged = None
        for i in range(12, 40):
            iid, reply = ask(client, url, i)
            thumb(client, url, iid, reply, i)
            assert watch.wait_idle(30)
            if staging.current_version(PROJECT, home) == 1:
                flagged = i - 11  # requests served by version 2 before the rollback
                break
        assert flagged == 10  # 0/10 against 12/12: a drop as soon as both sides count
        iid, reply = ask(client, url, 99)
        assert reply == "The answer is 199."  # version 1 again, without a restart
        health = client.get(url.removesuffix("/v1") + "/health").json()
    events = [e for e in staging.events(PROJECT, home) if e["event"] == "auto_rollback"]
    assert len(events) == 1 and (events[0]["previous"], events[0]["version"]) == (2, 1)
    stats = events[0]["probation"]
    assert stats["verdict"] == "drop" and stats["new"]["outcomes"] == 10
    assert stats["interval"][1] < 0 and events[0]["by"] == "proxy"
    assert health["probation"]["rollbacks"][0]["from"] == 2
    assert health["probation"]["auto_rollback"] is True
    assert TaskLog(log_at).get(iid).skill_version == "1"
    # brought back by hand: warned, not rolled back again
    staging.rollback(PROJECT, 2, home=home)
    result = probation_for(PROJECT, TaskLog(log_at), home=home,
                           config=ProbationConfig(10))  # fmt: skip
    assert result.drop and maybe_roll_back(PROJECT, result, home=home) is None
    lines = status_lines(PROJECT, home, log_at)  # the default min_outcomes, 20
    assert any(line.startswith("  probation: version 2 vs version 1: 0.00 (0/10") for line in lines)


def test_shadow_answers_are_logged_linked_never_returned_never_mined(tmp_path, log_at):
    home = tmp_path / "home"
    stage(home, "n1", "GOOD")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "STAGED", base=1)
    config = proxy_config(tmp_path, log_at, canary_share=1.0, canary_mode="shadow")
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        iid, reply = ask(client, url, 3)
        assert reply == "The answer is 7."  # the adopted version's answer
        client.post(f"{url}/feedback", json={"id": iid, "reference": "7"}, headers=OPERATOR)
        state = app.state.proxy
        for _ in range(500):
            if not state.shadow_tasks:
                break
            time.sleep(0.02)
        assert state.writer.flush(30)
        health = client.get(url.removesuffix("/v1") + "/health").json()
    log = TaskLog(log_at)
    rows = log.query(LogFilter(project=PROJECT))
    shadow = next(r for r in rows if r.shadow_of is not None)
    served = log.get(iid)
    assert len(rows) == 2 and shadow.shadow_of == iid and served.shadow_of is None
    assert shadow.skill_version == "staged:n2" and served.skill_version == "1"
    assert shadow.reply == "The answer is 9." and shadow.messages == served.messages
    assert not shadow.is_task and served.is_task
    task, why = mine_one(shadow, MineConfig())
    assert task is None and "shadow" in why
    assert health["canary"]["shadow"] == 1 and health["canary"]["night"] == "n2"
    assert shadow.to_dict()["shadow_of"] == iid
    log.export_jsonl(tmp_path / "out.jsonl")  # the link survives an export and an import
    copy = TaskLog(tmp_path / "copy.db")
    import_file(tmp_path / "out.jsonl", copy)
    assert copy.get(shadow.id).shadow_of == iid and not copy.get(shadow.id).is_task
    # the user's correction of the served reply scores the shadow answer too
    result = probation_for(PROJECT, log, home=home)
    staged = next(t for t in result.tallies if t.version == "staged:n2")
    assert (staged.requests, staged.shadow, staged.outcomes, staged.successes) == (0, 1, 1, 0)
    assert result.staged and result.staged[0].old.version == "1"


def test_canary_serve_mode_returns_the_staged_answer_and_compares_before_adoption(tmp_path, log_at):
    home = tmp_path / "home"
    stage(home, "n1", "GOOD")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "STAGED", base=1)
    config = proxy_config(tmp_path, log_at, canary_share=0.5, canary_mode="serve",
                          probation=ProbationConfig(5))  # fmt: skip
    served = {"1": 0, "staged:n2": 0}
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        for i in range(80):  # both sides reach status's default 20 outcomes (p > 0.9999)
            iid, reply = ask(client, url, i)
            staged = picked(iid, 0.5)
            assert reply == f"The answer is {2 * i + 1 + 2 * staged}."
            served["staged:n2" if staged else "1"] += 1
            thumb(client, url, iid, reply, i)
        assert app.state.proxy.writer.flush(30) and app.state.proxy.watch.wait_idle(30)
        health = client.get(url.removesuffix("/v1") + "/health").json()
    log = TaskLog(log_at)
    labels = [r.skill_version for r in log.query(LogFilter(project=PROJECT))]
    assert {v: labels.count(v) for v in served} == served and min(served.values()) >= 5
    assert not any(r.shadow_of for r in log.query())
    assert health["probation"]["staged"][0]["verdict"] == "drop"
    assert health["probation"]["verdict"] == "too_few"  # version 0 served nothing here
    lines = status_lines(PROJECT, home, log_at)
    assert any(line.startswith("  canary: staged night n2 vs version 1") for line in lines)
    assert any("do not adopt it" in line for line in lines)
    assert staging.current_version(PROJECT, home) == 1  # a canary never adopts or rolls back


def test_canary_selection_is_seeded_per_interaction_id():
    ids = [f"id-{i}" for i in range(4000)]
    share = sum(picked(i, 0.25) for i in ids) / len(ids)
    assert 0.22 < share < 0.28
    assert [picked(i, 0.25) for i in ids[:50]] == [picked(i, 0.25) for i in ids[:50]]
    assert [picked(i, 0.25, 1) for i in ids[:50]] != [picked(i, 0.25) for i in ids[:50]]
    assert not any(picked(i, 0.0) for i in ids) and all(picked(i, 1.0) for i in ids)


def home_night(home, night):
    from selftaught.sleep.adoption import staging

    return staging.nights_dir(PROJECT, home) / night


def test_a_staged_adapter_refuses_the_canary_at_startup_on_a_remote_upstream(tmp_path):
    home = tmp_path / "home"
    stage(home, "n1", "GOOD", adapter={"dir": "adapter", "method": "sft"})
    config = proxy_config(tmp_path, canary_share=0.2)
    with pytest.raises(ProxyError, match="adapter.*remote upstream"):
        create_proxy_app(config, upstream=scripted_upstream())
    local = ProxyConfig(upstream="local", project=PROJECT, home=home, canary_share=0.2)
    canary = start_canary(local, local=True)  # a local upstream serves the staged adapter
    assert canary is not None and canary.current().adapter == home_night(home, "n1") / "adapter"
    with pytest.raises(CanaryError, match="remote upstream"):
        start_canary(local, local=False)
    with pytest.raises(ProxyError):
        ProxyConfig(upstream="local", canary_share=1.5)
    with pytest.raises(ProxyError):
        ProxyConfig(upstream="local", canary_mode="both")
    nothing = proxy_config(tmp_path, canary_share=0.2, canary_night="n9")
    with pytest.raises(ProxyError, match="n9"):
        create_proxy_app(nothing, upstream=scripted_upstream())


# ---- the log ------------------------------------------------------------------------------------


def test_a_log_of_the_previous_schema_gains_shadow_of(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=SCHEMA_VERSION - 1)
    conn.execute(
        "INSERT INTO interactions (id, project, source, created_at, messages, reply, "
        "skill_version) VALUES ('old-1', 'demo', 'proxy', 1.0, '[]', 'a', '2')"
    )
    conn.close()
    log = TaskLog(path)
    assert log.schema_version() == SCHEMA_VERSION == len(MIGRATIONS)
    with sqlite3.connect(path) as check:
        columns = [r[1] for r in check.execute("PRAGMA table_info(interactions)")]
    assert "shadow_of" in columns
    old = log.get("old-1")
    assert old.shadow_of is None and old.is_task and old.skill_version == "2"
    log.add(Interaction(messages=[], project="demo", source="proxy", shadow_of="old-1",
                        skill_version="staged:n"))  # fmt: skip
    assert len(log.query(LogFilter(skill_versions=("2",)))) == 1
    assert len(log.query(LogFilter(skill_versions=("staged:n", None)))) == 1
    assert log.query(LogFilter(skill_versions=("staged:n",)))[0].shadow_of == "old-1"


# ---- the CLI ------------------------------------------------------------------------------------


def test_sleep_probation_cli_table_json_and_auto_rollback(tmp_path, monkeypatch, log_at):
    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    stage(home, "n1", "GOOD")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "BAD")
    staging.adopt(PROJECT, "n2", home=home, force=True)
    log = TaskLog(log_at)
    log.add_many([row(version="1", feedback="up") for _ in range(25)]
                 + [row(version="2", feedback="down") for _ in range(25)])  # fmt: skip
    runner = CliRunner()
    args = ["sleep", "probation", "--project", PROJECT, "--log", str(log_at)]
    shown = runner.invoke(cli.app, args)
    assert shown.exit_code == 0, shown.output
    assert "WARNING: version 2 does worse" in shown.output and "current" in shown.output
    status = runner.invoke(cli.app, ["sleep", "status", "--project", PROJECT,
                                     "--log", str(log_at)])  # fmt: skip
    assert "probation: version 2 vs version 1" in status.output and "drop" in status.output
    done = runner.invoke(cli.app, [*args, "--json", "--auto-rollback"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["adopted"]["verdict"] == "drop" and data["rolled_back"] == {"from": 2, "to": 1}
    assert [v["version"] for v in data["versions"]] == ["1", "2"]
    assert staging.current_version(PROJECT, home) == 1
    assert staging.events(PROJECT, home)[-1]["event"] == "auto_rollback"
    bad = runner.invoke(cli.app, [*args, "--confidence", "1.5"])
    assert bad.exit_code == 2


def test_a_version_without_documents_is_still_recorded_as_the_one_that_served(tmp_path, log_at):
    home = tmp_path / "home"
    stage(home, "n1", "")  # e.g. a weights-only night: the version is its adapter
    staging.adopt(PROJECT, "n1", home=home)
    config = proxy_config(tmp_path, log_at)
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        first, _ = ask(client, url, 1)
        staging.rollback(PROJECT, 0, home=home)
        second, _ = ask(client, url, 2)
        assert app.state.proxy.writer.flush(30)
    log = TaskLog(log_at)
    assert log.get(first).skill_version == "1" and log.get(second).skill_version is None


def test_a_shadow_row_before_other_rows_leaves_the_labeller_alone():
    """A shadow answer's served row once took the name of the `served` labeller, so every row
    after a shadow row was labelled by calling an Interaction (found by the type checker)."""
    served = row(feedback={"reference": "4"})
    shadow = row(version="staged:n1", shadow_of=served.id)
    rows = [served, shadow, row(feedback="up"), row(feedback="down")]
    result = evaluate(rows, Lineage("1", "0", staged=("staged:n1",)))
    v1 = next(t for t in result.tallies if t.version == "1")
    staged = next(t for t in result.tallies if t.version == "staged:n1")
    assert (v1.requests, v1.outcomes, v1.successes) == (3, 3, 2)
    assert (staged.shadow, staged.outcomes, staged.successes) == (1, 1, 1)
