"""The user's own files as starting documents (`sleep/adoption/write_back.py`): a night from a
repository's SKILL.md files (`--skills-from`) or from a CLAUDE.md (`--start-document`) stages
edits of them, adopt writes each back only while it is what the night read (their other front
matter byte for byte), a rollback restores the bytes; `optimize --skill F --write-back`; and
`sleep rollback --place` re-placing or removing what was placed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.skill_units import adopt_skill
from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night
from selftaught.sleep.paths import Unit, read_adopted
from tests.test_sleep_skills import PROJECT, fill_two_intents, stage_skills, two_rule_models

USER_SKILLS = {  # name: (description, folder): one Claude Code skill, one Codex skill
    "fruit-stall": ("Fruit stall apples pears, sums at the stall.", ".claude/skills"),
    "invoice-ledger": ("Invoice ledger totals, sums for the books.", ".agents/skills"),
}
FRONT = "allowed-tools: Read, Grep\nmetadata:\n  owner: me\n"  # theirs: never selftaught's


def user_skill(repo: Path, name: str) -> Path:
    description, folder = USER_SKILLS[name]
    path = repo / folder / name / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\n{FRONT}---\n\n"
                    f"# {name}\n\nReply as 'Answer: N'.\n")  # fmt: skip
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cli_run(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def test_a_night_from_the_users_skill_files_writes_each_back_only_if_unchanged(
    tmp_path, log_at, monkeypatch
):
    home, repo = tmp_path / "home", tmp_path / "repo"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    fruit, invoice = user_skill(repo, "fruit-stall"), user_skill(repo, "invoice-ledger")
    before = {p: p.read_bytes() for p in (fruit, invoice)}
    fill_two_intents(home, log_at)
    cfg = NightConfig(home=home, log_path=log_at, training=night_training_defaults(),
                      many_skills=True, skills_from=repo, project=PROJECT)  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    report = staging.read_report(night.night_dir)
    assert night.status == "staged", report["reason"]
    entries = {e["name"]: e for e in report["skills"]}
    assert set(entries) == set(USER_SKILLS)  # the tasks joined the user's two skills
    for path, kind in ((fruit, "claude-skill"), (invoice, "codex-skill")):
        entry = entries[path.parent.name]
        assert entry["status"] == "staged"
        assert entry["source"] == {
            "path": str(path),
            "kind": kind,
            "sha256": sha(before[path]),
            "root": str(repo),
            "root_real": os.path.realpath(repo),
        }
        assert path.read_bytes() == before[path]  # a night writes no user file
    diff = (night.night_dir / "skills" / "fruit-stall" / "proposal" / "file.diff").read_text()
    assert "+rule alpha" in diff and str(fruit) in diff
    assert not [ln for ln in diff.splitlines() if ln.startswith(("-", "+")) and "owner" in ln]

    # the user edits one file between the night and the adopt: that adopt stops, names it
    invoice.write_text(before[invoice].decode() + "My own line.\n")
    edited = invoice.read_bytes()
    refused = cli_run("sleep", "adopt", "--skill", "invoice-ledger", "--project", PROJECT)
    assert refused.exit_code != 0
    assert str(invoice) in refused.output and "changed since the night read it" in refused.output
    assert invoice.read_bytes() == edited
    assert staging.current_version(Unit(PROJECT, "invoice-ledger"), home) == 0
    assert not (home / "placements" / "backups").exists()  # nothing written anywhere

    # the other skill adopts: its file gets the trained body, their front matter byte for byte
    done = cli_run("sleep", "adopt", "--skill", "fruit-stall", "--project", PROJECT)
    assert done.exit_code == 0, done.output
    assert f"wrote back {fruit}" in done.output and "+rule alpha" in done.output
    text = fruit.read_text()
    front = before[fruit].decode().split("---\n\n")[0] + "---\n\n"
    assert text.startswith(front) and FRONT in front
    assert "Reply as 'Answer: N'." in text and "rule alpha" in text and "rule beta" not in text
    unit = Unit(PROJECT, "fruit-stall")
    assert staging.current_version(unit, home) == 1
    assert read_adopted(unit, home).skill.strip() in text  # the body served is the file's
    meta = staging.version_meta(unit, 1, home)["written_back"]
    assert (meta["path"], meta["sha256_before"]) == (str(fruit), sha(before[fruit]))

    # a rollback puts the file's bytes back; the edited file of the other skill stays
    back = cli_run("sleep", "rollback", "0", "--skill", "fruit-stall", "--project", PROJECT)
    assert back.exit_code == 0, back.output
    assert fruit.read_bytes() == before[fruit] and invoice.read_bytes() == edited
    assert staging.current_version(unit, home) == 0


def test_an_adopted_skill_of_the_same_name_wins_over_the_users_file(tmp_path):
    repo = tmp_path / "repo"
    fruit = user_skill(repo, "fruit-stall")
    stage_skills(tmp_path, "n0", {"unit-conversion": "UNITS ONE"})
    adopt_skill(PROJECT, "unit-conversion", home=tmp_path)
    (repo / ".claude" / "skills" / "unit-conversion").mkdir(parents=True)
    theirs = repo / ".claude" / "skills" / "unit-conversion" / "SKILL.md"
    theirs.write_text("---\nname: unit-conversion\ndescription: Mine.\n---\nMY OWN\n")
    from selftaught.sleep.night.skills import _starting_skills

    notes: list[str] = []
    start, files = _starting_skills(PROJECT, tmp_path, repo, notes)
    assert [(s.card.name, s.body) for s in start] == [
        ("unit-conversion", "UNITS ONE"),  # the adopted one, not the file
        ("fruit-stall", "# fruit-stall\n\nReply as 'Answer: N'."),
    ]
    assert set(files) == {"fruit-stall"} and files["fruit-stall"].path == fruit
    assert any("skill 'unit-conversion' is adopted already" in n for n in notes)


# ---- CLAUDE.md as the project's starting document ---------------------------------------------


def rule_models():
    from selftaught.sleep.night.cycle import NightModels
    from tests.scripted import append, canned_analyst, edits_json, rule_target, user_of

    def failure(messages):
        return edits_json(append("rule beta" if "[needs beta]" in user_of(messages) else
                                 "rule alpha"))  # fmt: skip

    return NightModels(rule_target(), "scripted-target", canned_analyst(failure=failure),
                       "scripted-analyst")  # fmt: skip


def test_a_night_starts_from_claude_md_and_adopt_writes_it_back_or_refuses(
    tmp_path, log_at, monkeypatch
):
    from tests.test_sleep_cycle import fill_log

    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    claude = tmp_path / "repo" / "CLAUDE.md"
    (claude.parent / ".git").mkdir(parents=True)  # its repository, whatever lies above tmp
    claude.write_text("# House rules\n\nReply as 'Answer: N'.\n")
    original = claude.read_bytes()
    fill_log(home, ["alpha"] * 12, project=PROJECT, log_at=log_at)
    cfg = NightConfig(home=home, log_path=log_at, training=night_training_defaults(),
                      project=PROJECT, start_document=claude)  # fmt: skip
    (night,) = run_night(cfg, models=rule_models())
    report = staging.read_report(night.night_dir)
    assert night.status == "staged", report["reason"]
    assert report["start_document"] == {"path": str(claude), "kind": "claude-md",
                                        "sha256": sha(original), "root": str(claude.parent),
                                        "root_real": os.path.realpath(claude.parent)}  # fmt: skip
    skill = (night.night_dir / "proposal" / "skill.md").read_text()
    assert skill.startswith("# House rules\n\nReply as 'Answer: N'.") and "rule alpha" in skill
    skill_diff = (night.night_dir / "proposal" / "skill.diff").read_text()
    assert "+rule alpha" in skill_diff and "-# House rules" not in skill_diff  # against the file
    assert claude.read_bytes() == original

    done = cli_run("sleep", "adopt", "--project", PROJECT)
    assert done.exit_code == 0, done.output
    assert f"wrote back {claude}" in done.output and "+rule alpha" in done.output
    assert claude.read_text() == skill == read_adopted(PROJECT, home).skill
    assert staging.version_numbers(PROJECT, home) == [1]  # adopted/ and versions as always

    back = cli_run("sleep", "rollback", "0", "--project", PROJECT)
    assert back.exit_code == 0, back.output
    assert claude.read_bytes() == original and staging.current_version(PROJECT, home) == 0

    # a second night from the file; the user edits it before the adopt: nothing is adopted
    fill_log(home, ["beta"] * 12, start=100, project=PROJECT, log_at=log_at)
    (second,) = run_night(cfg, models=rule_models())
    assert second.status == "staged", staging.read_report(second.night_dir)["reason"]
    claude.write_text("# House rules\n\nMy own rule.\n")
    refused = cli_run("sleep", "adopt", "--project", PROJECT)
    assert refused.exit_code != 0
    assert str(claude) in refused.output and "changed since the night read it" in refused.output
    assert claude.read_text() == "# House rules\n\nMy own rule.\n"
    assert staging.current_version(PROJECT, home) == 0
    assert staging.read_report(second.night_dir)["status"] == "staged"


def test_start_files_are_checked_before_a_night(tmp_path):
    from selftaught.errors import ConfigError

    doc = tmp_path / "AGENTS.md"
    doc.write_text("rules\n")
    with pytest.raises(ConfigError, match="--project"):
        NightConfig(start_document=doc)
    with pytest.raises(ConfigError, match="--skills-from"):
        NightConfig(project=PROJECT, start_document=doc, many_skills=True)
    with pytest.raises(ConfigError, match="goes with many_skills"):
        NightConfig(project=PROJECT, skills_from=tmp_path)
    with pytest.raises(ConfigError, match="not a file"):
        NightConfig(project=PROJECT, start_document=tmp_path / "missing.md")


# ---- optimize --skill F --write-back ------------------------------------------------------------


def test_optimize_write_back_writes_the_best_skill_into_the_file_unless_it_changed(
    tmp_path, monkeypatch
):
    from tests.fault_server import FaultServer
    from tests.scripted import prompt_kind
    from tests.test_skill_cli import TOY, endpoint_answer

    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))  # the backups go there
    skill = tmp_path / "notes.md"

    def run(out: str, answer) -> tuple[object, Path]:
        with FaultServer(answer, models=("toy-model",)) as server:
            spec = f"{server.base_url}#toy-model"
            result = cli_run("optimize", "--task", TOY, "--model", spec, "--optimizer-model",
                             spec, "--epochs", "2", "--batch-size", "4", "--api-key", "k",
                             "--output", str(tmp_path / out), "--skill", str(skill),
                             "--write-back")  # fmt: skip
        return result, tmp_path / out

    skill.write_text("Be exact.\n")
    result, run_dir = run("run1", endpoint_answer())
    assert result.exit_code == 0, result.output
    best = (run_dir / "best_skill.md").read_text()
    assert "rule alpha" in best and skill.read_text() == best
    assert f"wrote the best skill back into {skill}" in result.output and "+rule" in result.output

    skill.write_text("Be exact.\n")
    inner = endpoint_answer()

    def edits_mid_run(messages):  # the user saves the file while the run is going
        if prompt_kind(messages) != "other":
            skill.write_text("Mine now.\n")
        return inner(messages)

    result, _ = run("run2", edits_mid_run)
    assert result.exit_code == 1, result.output
    assert "not written back" in result.output and "changed since it was read" in result.output
    assert skill.read_text() == "Mine now.\n"
    no_skill = cli_run("optimize", "--task", TOY, "--write-back")
    assert no_skill.exit_code == 2 and "--write-back needs --skill PATH" in no_skill.output


# ---- rollback --place ---------------------------------------------------------------------------


def test_rollback_place_replaces_or_removes_and_never_touches_a_users_change(tmp_path, monkeypatch):
    from tests.test_probation import stage

    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    place = ("--project", PROJECT, "--place", f"claude:{repo}")
    stage_skills(tmp_path, "n1", {"sql-queries": "SQL ONE"})
    stage_skills(tmp_path, "n2", {"sql-queries": "SQL TWO"}, bases={"sql-queries": 1})
    for night in ("n1", "n2"):
        done = cli_run("sleep", "adopt", night, "--skill", "sql-queries", *place)
        assert done.exit_code == 0, done.output
    placed = repo / ".claude" / "skills" / "sql-queries" / "SKILL.md"
    assert "SQL TWO" in placed.read_text()
    back = cli_run("sleep", "rollback", "1", "--skill", "sql-queries", *place)
    assert back.exit_code == 0, back.output
    assert "SQL ONE" in placed.read_text() and "SQL TWO" not in placed.read_text()
    placed.write_text(placed.read_text() + "my note\n")  # the user's change: never undone
    kept = cli_run("sleep", "rollback", "0", "--skill", "sql-queries", *place)
    assert kept.exit_code == 1 and "skipped-user-changed" in kept.output
    assert placed.read_text().endswith("my note\n")
    assert staging.current_version(Unit(PROJECT, "sql-queries"), tmp_path) == 0

    # the project's own skill: placed at adopt, removed by a rollback to version 0; an
    # AGENTS.md section goes and the user's AGENTS.md is as it was, byte for byte
    agents = repo / "AGENTS.md"
    agents.write_text("# Mine\n\nKeep this.\n")
    stage(tmp_path, "m1", "MAIN RULE")
    both = (*place, "--place", f"agents-md:{repo}")
    done = cli_run("sleep", "adopt", "m1", *both)
    assert done.exit_code == 0, done.output
    main = repo / ".claude" / "skills" / PROJECT / "SKILL.md"
    assert "MAIN RULE" in main.read_text() and "MAIN RULE" in agents.read_text()
    back = cli_run("sleep", "rollback", *both)
    assert back.exit_code == 0, back.output
    assert not main.exists() and not main.parent.exists()
    assert agents.read_text() == "# Mine\n\nKeep this.\n"
