"""One night with scripted models: gate on / off, rollouts-k, budgets, failing backends,
privacy, caps, the cursor, model changes; then adopt / rollback / history round trips. The
night, adopt / rollback and lock tests taking `log_at` run on both log backends (SQLite,
Postgres: tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.gate import GateConfig
from selftaught.models.base import Completion
from selftaught.models.usage import Budget
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.lock import NightRunning, night_lock
from selftaught.sleep.night.cycle import (
    NightConfig,
    NightModels,
    is_remote,
    night_training_defaults,
    run_night,
)
from selftaught.sleep.paths import Adopted, read_adopted
from tests.scripted import (
    POISON,
    ScriptedModel,
    append,
    canned_analyst,
    edits_json,
    fatal,
    rule_answer,
    rule_target,
    system_of,
    transient,
    user_of,
)


def fill_log(
    home: Path,
    rules: list[str],
    *,
    start: int = 0,
    project: str = "demo",
    feedback_by: str | None = None,
    log_at=None,
    **kw,
) -> None:
    """Rows of `rules` questions, each corrected (thumb down, the right sum) by the operator,
    or by the end user `feedback_by` (untrusted, as the proxy's /v1/feedback stores it)."""
    log = TaskLog(log_at or home / "log.db")
    for i, rule in enumerate(rules, start):
        a, b = i + 1, 7 * i + 3
        fb = Feedback(thumb="down", reference=str(a + b))
        it = Interaction(
            messages=[{"role": "user", "content": f"[needs {rule}] What is {a} + {b}?"}],
            reply=f"Answer: {a + b + 1}",
            project=project,
            source="proxy",
            feedback=fb if feedback_by is None else Feedback(),
            **kw,
        )
        log.add(it)
        if feedback_by is not None:
            log.add_feedback(it.id, fb, giver=feedback_by, trusted=False)
    log.close()


def config(home: Path, log_at=None, **kw) -> NightConfig:
    training = kw.pop("training", night_training_defaults())
    return NightConfig(home=home, log_path=log_at or home / "log.db", training=training, **kw)


def models(target=None, analyst=None, target_spec="scripted-target") -> NightModels:
    analyst = analyst or canned_analyst(failure=edits_json(append("rule alpha")))
    return NightModels(target or rule_target(), target_spec, analyst, "scripted-analyst")


ALPHA_NIGHT = ["alpha"] * 8 + ["beta"] * 4


def test_a_night_stages_a_gated_proposal_with_its_report_and_evidence(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    (night,) = run_night(config(tmp_path, log_at), models=models())
    assert night.status == "staged" and not night.failed
    d = night.night_dir
    assert d == staging.nights_dir("demo", tmp_path) / night.night
    assert (d / "proposal" / "skill.md").read_text().strip() == "rule alpha"
    assert "+rule alpha" in (d / "proposal" / "skill.diff").read_text()
    report = json.loads((d / "report.json").read_text())
    assert report["proposal"]["val_after"]["hard"] > report["proposal"]["val_before"]["hard"]
    assert report["mining"]["tasks"] == 12 and sum(report["splits"].values()) == 12
    assert set(report["phases"]) == {"skill", "memory"} and report["gate"]["mode"] == "on"
    md = (d / "report.md").read_text()
    assert "**Status: staged**" in md and "+rule alpha" in md and "sleep adopt" in md
    diag = json.loads((d / "diagnostics.json").read_text())
    assert len(diag["val_before"]) == report["splits"]["val"]
    assert {"id", "hard", "soft", "reply_head", "why"} <= set(diag["val_before"][0])
    assert diag["steps"]["skill"][0]["analyst_calls"][0]["raw_reply"].startswith('{"edits"')
    evidence = [json.loads(line) for line in (d / "evidence.jsonl").read_text().splitlines()]
    assert {e["role"] for e in evidence} == {"target", "optimizer"}
    assert (
        len(evidence)
        == report["evidence_calls"]
        == sum(u["calls"] + u["errors"] for u in report["usage"].values())
    )
    assert len((d / "tasks.jsonl").read_text().splitlines()) == 12
    assert read_adopted("demo", tmp_path).empty  # staged, not adopted


def test_adopt_rollback_and_history_round_trip(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    live = tmp_path / "AGENTS.md"
    live.write_text("# My agent\nOwn rules stay.\n")
    (night,) = run_night(config(tmp_path, log_at), models=models())
    done = staging.adopt("demo", home=tmp_path, target_paths=[live])
    assert (done.version, done.previous, done.night) == (1, 0, night.night)
    adopted = read_adopted("demo", tmp_path)
    assert adopted.skill.strip() == "rule alpha" and adopted.version == "1"
    assert "Own rules stay." in live.read_text() and "rule alpha" in live.read_text()
    assert staging.read_report(night.night_dir)["status"] == "adopted"
    with pytest.raises(staging.StagingError, match="no staged proposal"):
        staging.adopt("demo", home=tmp_path)
    with pytest.raises(staging.StagingError, match="already adopted as version 1"):
        staging.adopt("demo", night.night, home=tmp_path)
    rows = staging.history("demo", tmp_path)
    assert [r["version"] for r in rows] == [0, 1] and rows[1]["current"]
    assert rows[1]["val_after"]["hard"] > rows[1]["val_before"]["hard"]
    back = staging.rollback("demo", home=tmp_path)
    assert (back.version, back.previous) == (0, 1)
    assert read_adopted("demo", tmp_path).empty and read_adopted("demo", tmp_path).version == "0"
    assert live.read_text() == "# My agent\nOwn rules stay.\n"  # the block is gone, the rest kept
    staging.rollback("demo", 1, home=tmp_path)
    assert (
        read_adopted("demo", tmp_path).skill.strip() == "rule alpha"
    )  # forward again to version 1
    assert "rule alpha" in live.read_text()  # the remembered live file follows
    with pytest.raises(staging.StagingError, match="no adopted version 7 \\(known: 0, 1\\)"):
        staging.rollback("demo", 7, home=tmp_path)
    assert [e["event"] for e in staging.events("demo", tmp_path)] == [
        "adopt",
        "rollback",
        "rollback",
    ]
    assert len(list((tmp_path / "projects" / "demo" / "backups").iterdir())) == 3


def test_a_proposal_gated_against_another_version_needs_force(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    run_night(config(tmp_path, log_at), models=models())
    fill_log(tmp_path, ALPHA_NIGHT, start=100, log_at=log_at)
    (second,) = run_night(config(tmp_path, log_at), models=models())
    staging.adopt("demo", staging.list_nights("demo", tmp_path)[0][0].name, home=tmp_path)
    with pytest.raises(staging.StagingError, match="gated against version 0"):
        staging.adopt("demo", second.night, home=tmp_path)
    assert staging.adopt("demo", second.night, home=tmp_path, force=True).version == 2


def test_an_interrupted_adopt_is_completed_on_the_next_one(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    run_night(config(tmp_path), models=models())
    staging.adopt("demo", home=tmp_path)
    # a kill between the documents and the version file: documents of v0, version still 1
    folder = tmp_path / "projects" / "demo" / "adopted"
    (folder / "skill.md").write_text("")
    assert not staging.adopted_consistent("demo", tmp_path)
    assert "version 0" in staging.recover_adopted("demo", tmp_path)
    assert staging.current_version("demo", tmp_path) == 0
    assert staging.adopted_consistent("demo", tmp_path)


def test_gate_off_accepts_a_poison_edit_the_gate_rejects(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    adopted = tmp_path / "projects" / "demo" / "adopted"
    adopted.mkdir(parents=True)
    (adopted / "skill.md").write_text("rule alpha")  # the alpha tasks are solved already
    poison = canned_analyst(failure=edits_json(append(POISON)))
    on = config(tmp_path, documents=("skill",))
    (kept,) = run_night(on, models=models(analyst=poison))
    assert kept.status == "no_proposal"
    assert "the gate kept the adopted skill" in kept.reason
    assert "step 1 reject" in kept.reason
    training = SkillOptConfig(epochs=1, batch_size=16, gate=GateConfig(accept_all=True))
    off = config(tmp_path, documents=("skill",), training=training, since=0)
    (greedy,) = run_night(off, models=models(analyst=poison))
    assert greedy.status == "staged" and "gate off" in greedy.reason
    proposal = greedy.proposal
    assert proposal.val_before.score.hard > 0 and proposal.val_after.score.hard == 0.0
    assert proposal.paired is not None
    assert proposal.paired.losses > 0 and proposal.paired.wins == 0
    assert "**OFF**" in (greedy.night_dir / "report.md").read_text()


class CoinTarget(ScriptedModel):
    """Greedy calls follow the rule target; sampled attempts are right on even seeds."""

    def __init__(self):
        super().__init__(rule_answer, "coin-target")

    async def achat(self, messages, params):
        if params.temperature == 0 or "rule steady" in system_of(messages):
            return await super().achat(messages, params)
        self.calls.append(messages)
        reply = rule_answer([{"role": "system", "content": "rule alpha rule beta"}, *messages])
        return Completion(text=reply if params.seed % 2 == 0 else "Answer: -1")


def test_rollouts_k_replays_each_train_task_k_times_and_reflects_on_the_contrast(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    analyst = canned_analyst(contrast=edits_json(append("rule steady")))
    training = SkillOptConfig(
        epochs=1, batch_size=16, rollouts_k=4, reflect_on_successes=False, gate=GateConfig()
    )
    cfg = config(tmp_path, documents=("skill",), training=training)
    (night,) = run_night(cfg, models=models(CoinTarget(), analyst))
    evidence = [
        json.loads(x) for x in (night.night_dir / "evidence.jsonl").read_text().split("\n") if x
    ]
    sampled = [e for e in evidence if e["role"] == "target" and e["params"]["temperature"] > 0]
    assert len(sampled) == 4 * night.splits.train
    assert any("## Solved and failed attempts" in user_of(e["messages"]) for e in evidence)
    assert night.training.rollouts_k == 4


def test_a_budget_ends_the_night_cleanly_and_covers_both_phases(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    training = SkillOptConfig(epochs=3, batch_size=4, budget=Budget(calls=12), gate=GateConfig())
    (night,) = run_night(config(tmp_path, training=training), models=models())
    skill, memory = night.phases["skill"], night.phases["memory"]
    assert skill.stopped_by.text.startswith("budget (12 of 12 calls used)")
    assert not memory.ran and "spent before the memory phase" in memory.stopped_by.text
    used = sum(u["calls"] + u["errors"] for u in night.usage.values())
    assert used <= 12 and not night.failed
    assert "stopped early" in (night.night_dir / "report.md").read_text()


def test_a_failing_target_is_a_backend_failure_never_nothing_to_learn(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    broken = rule_target()
    broken.fail_at = {i: transient() for i in range(1000)}
    (night,) = run_night(config(tmp_path), models=models(target=broken))
    assert night.failed and night.status == "backend_failed"
    assert "val replays failed" in night.reason and "injected 503" in night.reason
    assert night.consumed_until is None  # the same interactions are read again
    diag = json.loads((night.night_dir / "diagnostics.json").read_text())
    assert diag["backend_call_errors"] and "injected 503" in diag["backend_call_errors"][0]["error"]
    assert diag["no_proposal_reason"] is None
    # the next night, with a working backend, reads the same interactions
    (again,) = run_night(config(tmp_path), models=models())
    assert again.status == "staged" and again.window.read == 12


def test_a_failing_analyst_or_a_fatal_error_is_a_backend_failure(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    analyst = canned_analyst(failure=edits_json(append("rule alpha")))
    analyst.fail_at = {i: transient() for i in range(1000)}
    (night,) = run_night(config(tmp_path), models=models(analyst=analyst))
    assert night.status == "backend_failed" and "every analyst call failed" in night.reason
    bad_key = rule_target()
    bad_key.fail_at = {0: fatal()}
    (fatal_night,) = run_night(config(tmp_path), models=models(target=bad_key))
    assert fatal_night.status == "backend_failed"
    assert "401 Incorrect API key" in fatal_night.reason


def test_too_few_tasks_stage_nothing_and_wait_for_more(tmp_path):
    fill_log(tmp_path, ["alpha"] * 4)
    (night,) = run_night(config(tmp_path), models=models())
    assert night.status == "too_few_tasks" and "4 mined, at least 6 needed" in night.reason
    assert not (night.night_dir / "config.json").exists()  # nothing was trained
    fill_log(tmp_path, ["alpha"] * 4 + ["beta"] * 4, start=50)
    (later,) = run_night(config(tmp_path), models=models())
    assert later.window.read == 12 and later.status == "staged"
    (nothing,) = run_night(config(tmp_path, project="demo"), models=models())
    assert nothing.status == "too_few_tasks" and nothing.window.read == 0


def test_private_rows_never_reach_a_remote_model_unless_reviewed_or_allowed(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, private=True, log_at=log_at)
    remote = models(target_spec="openai:gpt-4o-mini")
    (night,) = run_night(config(tmp_path, log_at), models=remote)
    assert night.status == "too_few_tasks" and night.mining.withheld_private == 12
    assert "remote model" in night.notes[0]
    assert not (night.night_dir / "evidence.jsonl").read_text()  # no call at all
    (allowed,) = run_night(config(tmp_path, log_at, allow_remote=True), models=remote)
    assert allowed.status == "staged" and allowed.mining.withheld_private == 0
    assert is_remote("openai:gpt-4o") and is_remote("https://api.example.com/v1#m")
    assert not is_remote("http://127.0.0.1:8000/v1#m") and not is_remote("local")


def test_reviewed_private_rows_are_used_and_local_models_see_everything(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, private=True, reviewed=True, log_at=log_at)
    (night,) = run_night(config(tmp_path, log_at), models=models(target_spec="openai:gpt-4o-mini"))
    assert night.mining.withheld_private == 0 and night.status == "staged"


def test_each_night_reads_only_what_came_after_the_last_one_and_caps_wait(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (first,) = run_night(config(tmp_path, max_tasks=10), models=models())
    assert first.window.read == 10 and "max_tasks (10)" in first.notes[0]
    fill_log(tmp_path, ["alpha"] * 4, start=200)
    (second,) = run_night(config(tmp_path), models=models())
    assert second.window.read == 2 + 4  # the 2 left over, then the new ones


def test_a_model_change_since_the_last_night_is_warned_about(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    run_night(config(tmp_path), models=models())
    fill_log(tmp_path, ALPHA_NIGHT, start=100)
    (night,) = run_night(config(tmp_path), models=models(target_spec="other-model"))
    assert night.models.target == "other-model"
    assert any("models changed" in n and "other-model" in n for n in night.notes)


def test_preferences_reach_the_analyst_during_a_night(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    analyst = canned_analyst(failure=edits_json(append("rule alpha")))
    training = SkillOptConfig(
        epochs=1, batch_size=16, preferences="Answers end with the unit.", gate=GateConfig()
    )
    run_night(config(tmp_path, training=training), models=models(analyst=analyst))
    prompts = [user_of(m) for m in analyst.calls]
    assert prompts and all("Answers end with the unit." in p for p in prompts)


def test_two_nights_never_overlap_and_a_dead_night_is_marked_interrupted(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    with night_lock(tmp_path, "20260101-030000"), pytest.raises(NightRunning) as err:
        run_night(config(tmp_path, log_at), models=models())
    assert "20260101-030000" in str(err.value) and "pid" in str(err.value)
    dead = staging.nights_dir("demo", tmp_path) / "20260101-020000"
    dead.mkdir(parents=True)
    (dead / "report.json").write_text(
        json.dumps({"kind": "sleep-night", "night": dead.name, "status": "running"})
    )
    (night,) = run_night(config(tmp_path, log_at), models=models())
    assert night.status == "staged"
    assert staging.read_report(dead)["status"] == "interrupted"


def test_auto_adopt_makes_the_proposal_live(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    (night,) = run_night(config(tmp_path, log_at, auto_adopt=True), models=models())
    assert (
        night.status == "adopted" and read_adopted("demo", tmp_path).skill.strip() == "rule alpha"
    )


def test_a_dry_run_stages_nothing_and_the_next_night_reads_the_same(tmp_path, log_at):
    fill_log(tmp_path, ALPHA_NIGHT, log_at=log_at)
    (dry,) = run_night(config(tmp_path, log_at, auto_adopt=True), models=models(), dry_run=True)
    assert dry.status == "staged" and not staging.nights_dir("demo", tmp_path).exists()
    assert read_adopted("demo", tmp_path).empty
    (real,) = run_night(config(tmp_path, log_at), models=models())
    assert real.window.read == 12


def test_requests_without_a_reference_are_judged_by_their_rubric(tmp_path):
    log = TaskLog(tmp_path / "log.db")
    for i in range(12):
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"Write note number {i} to my landlord."}],
                reply="Fix the sink.",
                project="demo",
                feedback=Feedback(thumb="down", comment="too rude"),
            )
        )
    polite = ScriptedModel(
        lambda m: "Please fix the sink." if "rule polite" in system_of(m) else "Fix the sink."
    )
    judge = ScriptedModel(
        lambda m: (
            '{"score": 9, "reason": "polite"}'
            if "## Reply to grade\n\nPlease" in user_of(m)
            else '{"score": 2, "reason": "rude"}'
        )
    )
    night_models = models(polite, canned_analyst(failure=edits_json(append("rule polite"))))
    night_models.judge, night_models.judge_spec = judge, "scripted-judge"
    (night,) = run_night(config(tmp_path, documents=("skill",)), models=night_models)
    assert night.mining.by_check == {"rubric": 12}
    assert night.status == "staged" and night.usage["judge"]["calls"] > 0
    rubric = judge.calls[0][0]["content"]
    assert "too rude" in rubric and "'Fix the sink.'" in rubric  # the rejected reply is shown


def test_the_session_cap_counts_transcript_sessions_only():
    from selftaught.sleep.night.window import take_fairly

    rows = [Interaction(messages=[], meta={"session_id": f"s{i // 2}"}) for i in range(6)]
    rows.insert(1, Interaction(messages=[]))  # a proxy row: no session
    take = take_fairly(rows, 200, 2, 0.25)
    assert len(take.rows) == 5 and take.capped == "max_sessions (2)"
    assert take_fairly(rows, 3, 50, 0.25).capped == "max_tasks (3)"
    every = take_fairly(rows, 200, 50, 0.25)
    assert (every.rows, every.capped) == (rows, None)


def test_an_unexpected_error_leaves_the_night_marked_failed(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    training = SkillOptConfig(epochs=1, batch_size=16, budget=Budget(calls=2), gate=GateConfig())
    with pytest.raises(ValueError, match="cannot cover even the baseline"):
        run_night(config(tmp_path, training=training), models=models())
    ((path, night),) = staging.list_nights("demo", tmp_path)
    assert night.status == "failed" and "cannot cover" in str(night.reason)
    assert (path / "report.md").exists() and (path / "diagnostics.json").exists()


def test_what_the_user_said_is_proposed_to_the_memory_and_gated(tmp_path):
    """An analyst too weak to write an edit (SmolLM2 parrots the format) still leaves the
    user's own words: feedback comments on train tasks are proposed to the memory, and the
    gate keeps them only because they help on val."""
    log = TaskLog(tmp_path / "log.db")
    for i in range(12):
        a, b = i + 1, 7 * i + 3
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"[needs alpha] What is {a} + {b}?"}],
                reply=f"Answer: {a + b + 1}",
                project="demo",
                source="proxy",
                feedback=Feedback(
                    thumb="down", reference=str(a + b), comment="remember rule alpha"
                ),
            )
        )
    log.close()
    parrot = canned_analyst(failure='{"rules": {"append": {"content": "better text"}}}')
    (night,) = run_night(config(tmp_path), models=models(analyst=parrot))
    assert night.status == "staged", night.reason
    memory = (night.night_dir / "proposal" / "memory.md").read_text()
    assert "The user said: remember rule alpha" in memory
    assert not (night.night_dir / "proposal" / "skill.md").read_text().strip()
    report = json.loads((night.night_dir / "report.json").read_text())
    assert report["proposal"]["val_after"]["hard"] > report["proposal"]["val_before"]["hard"]


def test_the_users_words_are_refused_when_they_do_not_help(tmp_path):
    log = TaskLog(tmp_path / "log.db")
    for i in range(12):
        a, b = i + 1, 7 * i + 3
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"[needs alpha] What is {a} + {b}?"}],
                reply=f"Answer: {a + b + 1}",
                project="demo",
                source="proxy",
                feedback=Feedback(thumb="down", reference=str(a + b), comment="be nicer"),
            )
        )
    log.close()
    parrot = canned_analyst(failure="no json here")
    (night,) = run_night(config(tmp_path), models=models(analyst=parrot))
    assert night.status != "staged"
    assert read_adopted("demo", tmp_path).empty


def test_a_target_skill_file_keeps_its_mode(tmp_path):
    """--target-skill-path rewrites the user's file (AGENTS.md): its permissions stay."""
    live = tmp_path / "AGENTS.md"
    live.write_text("# My agent\n")
    live.chmod(0o644)
    staging.write_live_file(live, Adopted("rule alpha", "", "1"))
    assert "rule alpha" in live.read_text() and (live.stat().st_mode & 0o777) == 0o644
    live.chmod(0o640)
    staging.write_live_file(live, Adopted("rule beta", "", "2"))
    assert (live.stat().st_mode & 0o777) == 0o640
