"""A project's many skills, each its own adoption unit (`sleep/adoption/skill_units.py`):
adopting or rolling back one skill never changes another's files or version, on both log
backends; a kill mid-adopt of a skill is completed by the next adopt; the CLI's `--skill`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.runs import atomic_write_json
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.skill_units import (
    adopt_skill,
    adopted_skills,
    rollback_skill,
    route_request,
    skill_names,
    write_skill_proposal,
)
from selftaught.sleep.paths import Unit, read_adopted
from selftaught.sleep.records import SkillRecord, ValPairRecord

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROJECT = "demo"
CARDS = {
    "unit-conversion": ("Convert between units: km, miles, kg, pounds.", "convert 5 km to miles"),
    "sql-queries": ("Write SQL queries over the orders table.", "select the orders of May"),
}


def stage_skills(home: Path, night: str, bodies: dict[str, str], bases: dict | None = None):
    """A night that staged `bodies` (skill name -> body), as a many-skills night leaves it."""
    folder = staging.nights_dir(PROJECT, home) / night
    entries = []
    for name, body in bodies.items():
        description, task = CARDS[name]
        entry = SkillRecord(
            name=name,
            dir=f"skills/{name}",
            description=description,
            status="staged",
            reason="accepted on its own val and the whole val",
            base_version=(bases or {}).get(name, 0),
            train_ids=(f"{name}-t1",),
            val_ids=(f"{name}-v1",),
            tasks=(task,),
            own_val=ValPairRecord(before=0.5, after=1.0, n=2),
            whole_val=ValPairRecord(before=0.5, after=0.75, n=4),
        )
        write_skill_proposal(folder, PROJECT, entry, body, home)
        entries.append(entry.to_dict())
    report = {"kind": staging.NIGHT_KIND, "night": night, "project": PROJECT, "status": "staged",
              "base_version": 0, "skills": entries}  # fmt: skip
    atomic_write_json(folder / "report.json", report)
    return folder


def unit_files(home: Path, name: str) -> dict[str, bytes]:
    root = Unit(PROJECT, name).folder(home)
    skip = ("backups", "adopt.lock")
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part in skip for part in p.relative_to(root).parts)
    }


def state(home: Path, name: str) -> tuple[int, str, list[int], list[str]]:
    unit = Unit(PROJECT, name)
    return (
        staging.current_version(unit, home),
        read_adopted(unit, home).skill,
        staging.version_numbers(unit, home),
        [e["event"] for e in staging.events(unit, home)],
    )


def test_adopting_or_rolling_back_one_skill_leaves_the_other_untouched(tmp_path, log_at):
    home = tmp_path / "home"
    stage_skills(home, "n1", {"unit-conversion": "UNITS ONE", "sql-queries": "SQL ONE"})
    stage_skills(home, "n2", {"unit-conversion": "UNITS TWO"}, bases={"unit-conversion": 1})
    assert adopt_skill(PROJECT, "sql-queries", home=home).version == 1  # the newest staged
    sql_before = state(home, "sql-queries")
    sql_files = unit_files(home, "sql-queries")
    assert adopt_skill(PROJECT, "unit-conversion", "n1", home=home).version == 1
    assert adopt_skill(PROJECT, "unit-conversion", home=home).night == "n2"
    assert state(home, "unit-conversion")[:3] == (2, "UNITS TWO", [1, 2])
    rollback_skill(PROJECT, "unit-conversion", 0, home=home)
    assert state(home, "unit-conversion") == (0, "", [1, 2], ["adopt", "adopt", "rollback"])
    # the other skill: same version, text, events and (on disk) the same bytes
    assert state(home, "sql-queries") == sql_before == (1, "SQL ONE", [1], ["adopt"])
    assert unit_files(home, "sql-queries") == sql_files
    # and the project's own unit: nothing adopted, no events
    assert staging.current_version(PROJECT, home) == 0 and staging.events(PROJECT, home) == []
    assert skill_names(PROJECT, home) == ["sql-queries", "unit-conversion"]
    served = {s.name: (s.version, s.body) for s in adopted_skills(PROJECT, home)}
    assert served == {"sql-queries": (1, "SQL ONE")}  # a skill at version 0 is not served
    report = staging.read_report(staging.nights_dir(PROJECT, home) / "n1")
    assert [(e["name"], e["status"], e["adopted_version"]) for e in report["skills"]] == [
        ("unit-conversion", "adopted", 1),
        ("sql-queries", "adopted", 1),
    ]
    meta = staging.version_meta(Unit(PROJECT, "sql-queries"), 1, home)
    assert meta["card"]["description"] == CARDS["sql-queries"][0] and meta["replaced"] == 0


def test_a_skills_night_is_not_adopted_as_the_project_and_a_skill_needs_its_base(tmp_path):
    stage_skills(tmp_path, "n1", {"unit-conversion": "UNITS ONE"})
    with pytest.raises(staging.StagingError, match="no staged proposal waiting"):
        staging.adopt(PROJECT, home=tmp_path)
    with pytest.raises(staging.StagingError, match="staged skills only"):
        staging.adopt(PROJECT, "n1", home=tmp_path)
    stage_skills(tmp_path, "n2", {"unit-conversion": "UNITS TWO"})  # gated against version 0
    adopt_skill(PROJECT, "unit-conversion", "n1", home=tmp_path)
    with pytest.raises(staging.StagingError, match="gated against its version 0"):
        adopt_skill(PROJECT, "unit-conversion", "n2", home=tmp_path)
    assert adopt_skill(PROJECT, "unit-conversion", "n2", home=tmp_path, force=True).version == 2
    with pytest.raises(staging.StagingError, match="nothing to adopt \\(adopted as version 1"):
        adopt_skill(PROJECT, "unit-conversion", "n1", home=tmp_path)
    with pytest.raises(staging.StagingError, match="trained no skill 'sql-queries'"):
        adopt_skill(PROJECT, "sql-queries", "n1", home=tmp_path)


KILL_MID_ADOPT = """
import os, sys
from pathlib import Path
from selftaught.sleep.adoption import skill_units, staging

home = Path(sys.argv[1])
real_write = staging._write_adopted

def write_then_die(unit, home_, adopted):
    if os.environ.get("SELFTAUGHT_LOG"):  # Postgres: the version row is written, no pointer
        os._exit(9)
    folder = staging.adopted_dir(unit, home_)  # files: the skill written, `version` not yet
    staging.atomic_write_text(folder / "skill.md", adopted.skill)
    staging.atomic_write_text(folder / "memory.md", adopted.memory)
    os._exit(9)

staging._write_adopted = write_then_die
skill_units.adopt_skill("demo", "unit-conversion", "n2", home=home)
"""


def test_a_kill_mid_adopt_of_a_skill_is_completed_and_the_other_skill_untouched(tmp_path, log_at):
    home = tmp_path / "home"
    stage_skills(home, "n1", {"unit-conversion": "UNITS ONE", "sql-queries": "SQL ONE"})
    stage_skills(home, "n2", {"unit-conversion": "UNITS TWO"}, bases={"unit-conversion": 1})
    adopt_skill(PROJECT, "unit-conversion", "n1", home=home)
    adopt_skill(PROJECT, "sql-queries", "n1", home=home)
    sql_files = unit_files(home, "sql-queries")
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_MID_ADOPT, str(home)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == -9 or proc.returncode == 9, proc.stderr
    unit = Unit(PROJECT, "unit-conversion")
    assert staging.version_numbers(unit, home) == [1, 2]  # version 2 was written whole
    if isinstance(log_at, Path):
        # files: the adopted text is version 2's but `version` still names 1 (torn)
        assert not staging.adopted_consistent(unit, home)
    if isinstance(log_at, Path):
        # the next adopt or rollback of that skill completes it first, then does its own work
        done = rollback_skill(PROJECT, "unit-conversion", 1, home=home)
        assert "version 2" in str(done.note) and done.previous == 2
    else:  # one transaction per step: the pointer never moved, version 1 still serves
        assert staging.recover_adopted(unit, home) is None
    assert staging.adopted_consistent(unit, home)
    assert state(home, "unit-conversion")[:2] == (1, "UNITS ONE")
    assert state(home, "sql-queries") == (1, "SQL ONE", [1], ["adopt"])
    assert unit_files(home, "sql-queries") == sql_files


def test_the_cli_adopts_and_rolls_back_one_skill_and_status_lists_each(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path))
    stage_skills(tmp_path, "n1", {"unit-conversion": "UNITS ONE", "sql-queries": "SQL ONE"})
    runner = CliRunner()
    status = runner.invoke(cli.app, ["sleep", "status", "--project", PROJECT])
    assert status.exit_code == 0, status.output
    assert "skills staged: unit-conversion (night n1), sql-queries (night n1)" in status.output
    assert "waiting to be adopted" not in status.output  # nothing for the project itself
    for name in ("unit-conversion", "sql-queries"):
        done = runner.invoke(cli.app, ["sleep", "adopt", "--skill", name, "--project", PROJECT])
        assert done.exit_code == 0, done.output
        assert f"adopted skill {name} of night n1 as its version 1" in done.output
    back = runner.invoke(cli.app, ["sleep", "rollback", "0", "--skill", "sql-queries",
                                   "--project", PROJECT])  # fmt: skip
    assert back.exit_code == 0 and "skill sql-queries is at version 0 (was 1)" in back.output
    status = runner.invoke(cli.app, ["sleep", "status", "--project", PROJECT])
    assert "skill sql-queries: version 0 adopted (versions: 1)" in status.output
    assert "skill unit-conversion: version 1 adopted (versions: 1)" in status.output
    stage_skills(tmp_path, "n2", {"sql-queries": "SQL TWO"})  # over its version 0 again
    repo = tmp_path / "repo"
    repo.mkdir()
    placed = runner.invoke(cli.app, ["sleep", "adopt", "--skill", "sql-queries", "--project",
                                     PROJECT, "--place", f"claude:{repo}"])  # fmt: skip
    assert placed.exit_code == 0, placed.output
    skill_md = (repo / ".claude" / "skills" / "sql-queries" / "SKILL.md").read_text()
    assert "name: sql-queries" in skill_md and "SQL TWO" in skill_md
    assert not (repo / ".claude" / "skills" / "unit-conversion").exists()  # that skill only
    bad = runner.invoke(cli.app, ["sleep", "adopt", "--skill", "Bad Name", "--project", PROJECT])
    assert bad.exit_code == 2 and "skill name 'Bad Name' is not valid" in bad.output


# ---- the proxy's router -----------------------------------------------------------------------


def _chat(url: str, text: str) -> str:
    from tests import loopback

    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    r = loopback.post(f"{url}/chat/completions", json=body, timeout=20)
    assert r.status_code == 200, r.text
    return r.headers["x-selftaught-interaction-id"]


def test_the_proxy_routes_two_requests_to_two_skills_and_logs_each_route(tmp_path, log_at):
    from selftaught.sleep.adoption.inject import strip_injected_messages
    from selftaught.sleep.intake.log import TaskLog
    from tests.fake_upstream import fake_proxy
    from tests.test_sleep_proxy import adopt as adopt_project

    home = tmp_path / "home"
    stage_skills(home, "n1", {"unit-conversion": "UNITS RULE", "sql-queries": "SQL RULE"})
    adopt_skill(PROJECT, "unit-conversion", home=home)
    adopt_skill(PROJECT, "sql-queries", home=home)
    adopt_project(home, PROJECT, "PROJECT RULE", "", "4")
    with fake_proxy(home, log_at) as (url, _app, upstream):
        ids = [
            _chat(url, "please convert 12 km to miles"),
            _chat(url, "which orders shipped in May? write the query"),
            _chat(url, "hello there"),  # shares no word with any skill
        ]
        sent = [r["messages"] for r in upstream.requests]
        from tests.test_sleep_proxy import wait_logged

        wait_logged(url, 3)
    units, sql, none = (m[0]["content"] for m in sent)
    assert "PROJECT RULE" in units and "PROJECT RULE" in sql and "PROJECT RULE" in none
    assert "<!-- selftaught:skill name=unit-conversion version=1 -->\nUNITS RULE" in units
    assert "SQL RULE" not in units and "UNITS RULE" not in sql and "SQL RULE" in sql
    assert "name=" not in none
    for messages, text in zip(sent, ("please convert", "which orders", "hello"), strict=True):
        (client,) = strip_injected_messages(messages)  # both blocks go, the client's stays
        assert client["role"] == "user" and client["content"].startswith(text)
    log = TaskLog(log_at)
    try:
        routes = [log.get(i).meta["skill_route"] for i in ids]
    finally:
        log.close()
    assert [(r["skill"], r["version"]) for r in routes] == [
        ("unit-conversion", 1),
        ("sql-queries", 1),
        (None, 0),
    ]
    assert routes[0]["score"] > 0 and set(routes[0]) >= {"runner_up", "runner_up_score"}
    assert all("skill_route" not in str(m) for m in sent)  # the decision is logged, not sent


def test_a_routed_skill_never_reaches_a_mined_task():
    """A row whose messages hold what the proxy injected (an agent's transcript, a client that
    echoes its system prompt back): the project's and the routed skill's blocks, demo turns
    included, are stripped before anything is mined from it."""
    from selftaught.demos import Demo, join_skill
    from selftaught.sleep.adoption.inject import RoutedSkill, inject_adopted
    from selftaught.sleep.intake.log import Interaction
    from selftaught.sleep.night.cycle import mine
    from selftaught.sleep.night.mine import MineConfig
    from selftaught.sleep.paths import Adopted

    demo = Demo("d1", "convert 1 km to miles", "0.62 miles")
    routed_body = join_skill("SECRET ROUTED RULE: answer in miles.", [demo])
    client = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "convert 3 km to miles"}]  # fmt: skip
    sent = inject_adopted(client, Adopted("PROJECT RULE", "", "2"),
                          RoutedSkill("unit-conversion", routed_body, 3))  # fmt: skip
    assert any("SECRET ROUTED RULE" in str(m["content"]) for m in sent)
    assert {"role": "assistant", "content": "0.62 miles"} in sent  # the demo as a turn
    tasks, _ = mine([Interaction(messages=sent, reply="1.86 miles", reference="1.86")],
                    MineConfig())  # fmt: skip
    (task,) = tasks
    text = str(task.to_dict())
    assert "SECRET ROUTED RULE" not in text and "0.62 miles" not in text
    assert "PROJECT RULE" not in text and "selftaught:" not in text
    assert task.messages == client


# ---- probation per skill ------------------------------------------------------------------------


def routed_row(text: str, skill: str | None, version: int, thumb: str):
    from selftaught.sleep.intake.log import Feedback, Interaction

    meta = {} if skill is None else {"skill_route": {"skill": skill, "version": version,
            "score": 1.0, "runner_up": None, "runner_up_score": 0.0}}  # fmt: skip
    return Interaction(messages=[{"role": "user", "content": text}], reply="ok", project=PROJECT,
                       source="proxy", meta=meta, feedback=Feedback(thumb=thumb))  # fmt: skip


def test_a_drop_on_one_skills_rows_rolls_back_that_skill_only(tmp_path, log_at):
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import ProbationConfig, skill_probations
    from selftaught.sleep.intake.watch import ProbationWatch

    home = tmp_path / "home"
    stage_skills(home, "n1", {"unit-conversion": "UNITS ONE", "sql-queries": "SQL ONE"})
    stage_skills(home, "n2", {"unit-conversion": "UNITS TWO"}, bases={"unit-conversion": 1})
    adopt_skill(PROJECT, "unit-conversion", "n1", home=home)
    adopt_skill(PROJECT, "sql-queries", "n1", home=home)
    adopt_skill(PROJECT, "unit-conversion", "n2", home=home)
    units, sql = "convert 5 km to miles please", "select the orders of May"
    rows = [routed_row(units, "unit-conversion", 1, "up") for _ in range(25)]
    rows += [routed_row(units, "unit-conversion", 2, "down") for _ in range(25)]  # v2: worse
    rows += [routed_row(sql, "sql-queries", 1, "up") for _ in range(25)]
    rows += [routed_row(sql, None, 0, "up") for _ in range(25)]  # before sql-queries existed
    rows += [routed_row("hello there", None, 0, "down") for _ in range(25)]  # no skill's rows
    log = TaskLog(log_at)
    log.add_many(rows)
    config = ProbationConfig(min_outcomes=20)
    by_skill = {r.skill: r for r in skill_probations(PROJECT, log, home=home, config=config)}
    units_p, sql_p = by_skill["unit-conversion"], by_skill["sql-queries"]
    assert units_p.adopted.verdict == "drop" and units_p.current == "2"
    assert (units_p.adopted.new.outcomes, units_p.adopted.old.outcomes) == (25, 25)
    # sql-queries' first version against the requests it serves now, served without it
    assert sql_p.adopted.verdict == "ok" and sql_p.adopted.old.version == "0"
    assert (sql_p.adopted.new.successes, sql_p.adopted.old.successes) == (25, 25)
    sql_files = unit_files(home, "sql-queries")
    watch = ProbationWatch(PROJECT, log_at, home, config, auto_rollback=True, every=1)
    try:
        watch.poke()
        assert watch.wait_idle(60)
    finally:
        watch.close()
    assert watch.error is None
    rolled = [(r["skill"], r["from"], r["to"]) for r in watch.rollbacks]
    assert rolled == [("unit-conversion", 2, 1)]
    assert watch.snapshot()["skills"]["sql-queries"]["verdict"] == "ok"
    events = ["adopt", "adopt", "rollback", "auto_rollback"]
    assert state(home, "unit-conversion") == (1, "UNITS ONE", [1, 2], events)
    assert state(home, "sql-queries") == (1, "SQL ONE", [1], ["adopt"])
    assert unit_files(home, "sql-queries") == sql_files
    assert staging.events(PROJECT, home) == []  # the project's own unit: untouched
    log.close()


def test_status_shows_each_skills_probation(tmp_path, monkeypatch):
    from selftaught.sleep.intake.log import TaskLog

    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path))
    stage_skills(tmp_path, "n1", {"unit-conversion": "UNITS ONE"})
    stage_skills(tmp_path, "n2", {"unit-conversion": "UNITS TWO"}, bases={"unit-conversion": 1})
    adopt_skill(PROJECT, "unit-conversion", "n1", home=tmp_path)
    adopt_skill(PROJECT, "unit-conversion", "n2", home=tmp_path)
    text = "convert 5 km to miles please"
    with TaskLog(tmp_path / "log.db") as log:
        log.add_many([routed_row(text, "unit-conversion", v, t) for v, t in [(1, "up"), (2, "down")]
                      for _ in range(25)])  # fmt: skip
    out = CliRunner().invoke(cli.app, ["sleep", "status", "--project", PROJECT])
    assert out.exit_code == 0, out.output
    assert "probation of skill unit-conversion: version 2 vs version 1" in out.output
    assert "sleep rollback 1 --project demo --skill unit-conversion" in out.output


# ---- a night that trains many skills -----------------------------------------------------------

INTENTS = {"alpha": "Fruit stall apples pears:", "beta": "Invoice ledger totals:"}


def fill_two_intents(home: Path, log_at, n: int = 12) -> None:
    """Rows of two intents (their own words), each corrected by the operator; a question is
    solved only when the system prompt holds its intent's rule (`tests.scripted`)."""
    from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog

    log = TaskLog(log_at)
    for i in range(n):
        for rule, words_ in INTENTS.items():
            a, b = i + 1, 7 * i + (3 if rule == "alpha" else 5)
            text = f"{words_} [needs {rule}] What is {a} + {b}?"
            log.add(Interaction(
                messages=[{"role": "user", "content": text}],
                reply=f"Answer: {a + b + 1}", project=PROJECT, source="proxy",
                feedback=Feedback(thumb="down", reference=str(a + b))))  # fmt: skip
    log.close()


def two_rule_models():
    from selftaught.sleep.night.cycle import NightModels
    from tests.scripted import append, canned_analyst, edits_json, rule_target, user_of

    def failure(messages):
        rule = "beta" if "[needs beta]" in user_of(messages) else "alpha"
        return edits_json(append(f"rule {rule}"))

    analyst = canned_analyst(failure=failure)
    return NightModels(rule_target(), "scripted-target", analyst, "scripted-analyst")


def test_a_night_with_two_intents_stages_two_skills_each_adopted_alone(tmp_path, log_at):
    from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night

    home = tmp_path / "home"
    fill_two_intents(home, log_at)
    cfg = NightConfig(home=home, log_path=log_at, training=night_training_defaults(),
                      many_skills=True)  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    report = staging.read_report(night.night_dir)
    assert night.status == "staged", report["reason"]
    skills = {e["name"]: e for e in report["skills"]}
    assert len(skills) == 2 and all(e["status"] == "staged" for e in skills.values())
    by_rule = {}
    for name, entry in skills.items():
        body = (night.night_dir / "skills" / name / "proposal" / "skill.md").read_text()
        rule = "alpha" if "rule alpha" in body else "beta"
        by_rule[rule] = name
        assert f"rule {'beta' if rule == 'alpha' else 'alpha'}" not in body  # its own only
        assert entry["own_val"]["after"] > entry["own_val"]["before"]
        assert entry["whole_val"]["after"] > entry["whole_val"]["before"]
        assert entry["tasks"] and all(f"[needs {rule}]" in t for t in entry["tasks"])
        skill_md = (night.night_dir / "skills" / name / "proposal" / "SKILL.md").read_text()
        assert skill_md.startswith(f"---\nname: {name}\ndescription: ")
    assert set(by_rule) == {"alpha", "beta"}
    assert report["skill_set"]["staged"] == 2 and "proposal" not in report
    assert not (night.night_dir / "proposal").exists()  # nothing for the project itself
    adopt_skill(PROJECT, by_rule["alpha"], home=home)
    assert staging.current_version(Unit(PROJECT, by_rule["alpha"]), home) == 1
    assert staging.current_version(Unit(PROJECT, by_rule["beta"]), home) == 0  # not adopted
    assert staging.current_version(PROJECT, home) == 0
    # the proxy routes by the night's kinds: a beta request shares "needs" and "what" with
    # alpha's card, but is of beta's kind, which has no skill adopted: it gets none
    deadline = time.monotonic() + 10  # a Postgres proxy lists the adopted skills every 1 s
    while not adopted_skills(PROJECT, home) and time.monotonic() < deadline:
        time.sleep(0.05)
    for rule, skill in (("alpha", by_rule["alpha"]), ("beta", None)):
        text = f"{INTENTS[rule]} [needs {rule}] What is 40 + 2?"
        routed, decision = route_request(PROJECT, home, [{"role": "user", "content": text}])
        assert (routed.name if routed else None) == skill
        assert decision is not None and decision.route.kind == by_rule[rule]


def test_auto_adopt_adopts_each_accepted_skill_and_the_next_night_starts_from_them(tmp_path):
    from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night

    fill_two_intents(tmp_path, tmp_path / "log.db")
    cfg = NightConfig(home=tmp_path, log_path=tmp_path / "log.db", auto_adopt=True,
                      training=night_training_defaults(), many_skills=True)  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    assert night.status == "adopted"
    served = adopted_skills(PROJECT, tmp_path)
    assert len(served) == 2 and all(s.version == 1 for s in served)
    fill_two_intents(tmp_path, tmp_path / "log.db", n=12)  # more of the same: nothing to add
    (second,) = run_night(cfg, models=two_rule_models())
    report = staging.read_report(second.night_dir)
    # the tasks joined the adopted skills (by their cards), which already solve them
    assert {e["name"] for e in report["skills"]} == {s.name for s in served}
    assert all(e["status"] == "rejected" for e in report["skills"])
    assert second.status == "no_proposal"
