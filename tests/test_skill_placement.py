"""Skills written where each agent reads them (`sleep/adoption/placement.py`): each target's
layout, text only, a file the user changed never overwritten (the others still written), the
global Codex folder only with the opt-in, a restore giving back the previous bytes, AGENTS.md
sections leaving the rest of the file byte for byte, and the user's own files read as starting
documents and written back within bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.skill.routing import SkillCard
from selftaught.skill.skill_md import SkillFile, parse_skill_md
from selftaught.sleep.adoption.placement import (
    DocumentEdit,
    PlacementError,
    PlacementResult,
    PlacementTarget,
    StartingDocument,
    place_skills,
    read_starting_documents,
    restore_placement,
    write_documents,
)


def skill(name: str, body: str = "Check the units first.", **kw) -> SkillFile:
    return SkillFile(SkillCard(name, f"Use for {name.replace('-', ' ')} tasks."), body, **kw)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


def place(skills, spec: str, tmp_path: Path, **kw) -> PlacementResult:
    target = PlacementTarget.parse(spec, **{k: kw.pop(k) for k in list(kw) if k in (
        "allow_global", "follow_symlinks")})  # fmt: skip
    return place_skills(skills, target, home=tmp_path / "home", **kw)


def actions(result: PlacementResult) -> dict[str | None, str]:
    return {f.skill: f.action for f in result.files}


# ---- layouts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "folder"), [("claude", ".claude/skills"), ("codex", ".agents/skills")]
)
def test_each_skill_is_its_own_skill_md_where_the_agent_reads_it(tmp_path, repo, kind, folder):
    done = place([skill("unit-math"), skill("date-format")], f"{kind}:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "written", "date-format": "written"}
    for name in ("unit-math", "date-format"):
        path = repo / folder / name / "SKILL.md"
        text = path.read_text()
        assert text.startswith(f'---\nname: {name}\ndescription: "Use for ')
        parsed = parse_skill_md(text, str(path))
        assert parsed.card.name == name and parsed.body == "Check the units first."
        assert parsed.extra == ()
    (first,) = [f for f in done.files if f.skill == "unit-math"]
    assert (
        first.diff.startswith("--- /dev/null\n+++ b/SKILL.md") and "+name: unit-math" in first.diff
    )
    again = place([skill("unit-math")], f"{kind}:{repo}", tmp_path)
    assert actions(again) == {"unit-math": "unchanged"} and again.backup is None


def test_codex_global_is_refused_without_the_opt_in_and_written_with_it(tmp_path):
    home = tmp_path / "codex-home"
    with pytest.raises(PlacementError, match="every repository.*--allow-global"):
        PlacementTarget.parse(f"codex-global:{home}")
    with pytest.raises(PlacementError, match="--allow-global"):
        PlacementTarget("codex-global", home)
    assert not home.exists()
    done = place([skill("unit-math")], f"codex-global:{home}", tmp_path, allow_global=True)
    assert actions(done) == {"unit-math": "written"}
    assert (home / "skills" / "unit-math" / "SKILL.md").is_file()


def test_a_bad_spec_and_two_skills_of_one_name_are_errors(tmp_path, repo):
    with pytest.raises(PlacementError, match="expected claude:REPO"):
        PlacementTarget.parse("cursor:/x")
    with pytest.raises(PlacementError, match="is not a folder"):
        place([skill("a-b")], f"claude:{repo / 'typo'}", tmp_path)
    with pytest.raises(PlacementError, match="share a name: a-b"):
        place([skill("a-b"), skill("a-b")], f"claude:{repo}", tmp_path)
    assert not (repo / ".claude").exists()


# ---- text only --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (skill("bad-one", extra=("allowed-tools: Bash(rm:*)",)), "allowed-tools"),
        (skill("bad-one", extra=("hooks:", "  PreToolUse: x")), "hooks"),
        (skill("bad-one", "Rules.\n---\nallowed-tools: Bash\n---\nmore"), "front-matter fence"),
        (skill("bad-one", "Rules.\n<!-- /selftaught:skill -->\nrider"), "block marker"),
        (skill("bad-one", "x\n<!-- /selftaught:agent-skill name=bad-one -->"), "section marker"),
    ],
)
def test_a_skill_that_is_not_text_only_is_refused_and_the_others_written(tmp_path, repo, bad, why):
    for kind in ("claude", "agents-md"):
        done = place([bad, skill("good-one")], f"{kind}:{repo}", tmp_path)
        assert actions(done) == {"bad-one": "refused", "good-one": "written"}
        assert why in done.refused[0].reason
    assert not (repo / ".claude/skills/bad-one").exists()
    assert "bad-one" not in (repo / "AGENTS.md").read_text()


# ---- AGENTS.md sections -----------------------------------------------------------------------

USER_AGENTS = (
    "# House rules\r\n\r\nUse tabs.\n\n<!-- a comment of the user's -->\ntrailing, no newline"
)


def test_agents_md_sections_leave_the_rest_of_the_file_byte_for_byte(tmp_path, repo):
    path = repo / "AGENTS.md"
    path.write_bytes(USER_AGENTS.encode())
    done = place([skill("unit-math"), skill("date-format")], f"agents-md:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "written", "date-format": "written"}
    text = path.read_bytes().decode()
    assert text.startswith(USER_AGENTS + "\n\n<!-- selftaught:agent-skill name=unit-math -->\n")
    assert "## Skill: date-format\n\nUse for date format tasks.\n\nCheck the units first.\n" in text
    # the user edits the file around the sections; a new body replaces only its own section
    edited = "PREFIX\n" + text + "user's own last line\n"
    path.write_bytes(edited.encode())
    done = place([skill("unit-math", "Convert to SI first.")], f"agents-md:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "written"}
    assert "-Check the units first.\n+Convert to SI first.\n" in done.files[0].diff
    assert path.read_bytes().decode() == edited.replace(
        "## Skill: unit-math\n\nUse for unit math tasks.\n\nCheck the units first.",
        "## Skill: unit-math\n\nUse for unit math tasks.\n\nConvert to SI first.",
    )


def test_a_section_the_user_changed_is_skipped_and_the_others_written(tmp_path, repo):
    path = repo / "AGENTS.md"
    place([skill("unit-math"), skill("date-format")], f"agents-md:{repo}", tmp_path)
    path.write_text(path.read_text().replace("Check the units first.", "My own rule.", 1))
    before = path.read_text()
    new = [skill("unit-math", "New rule A."), skill("date-format", "New rule B.")]
    done = place(new, f"agents-md:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "skipped-user-changed", "date-format": "written"}
    assert "changed since selftaught wrote it" in done.skipped[0].reason
    after = path.read_text()
    assert "My own rule." in after and "New rule A." not in after and "New rule B." in after
    assert after.split("date-format -->")[0] == before.split("date-format -->")[0]
    # a section the user removed is not put back either
    cut = after.index("<!-- selftaught:agent-skill name=date-format")
    path.write_text(after[:cut])
    done = place([skill("date-format", "Newer.")], f"agents-md:{repo}", tmp_path)
    assert actions(done) == {"date-format": "skipped-user-changed"}
    assert "removed since" in done.skipped[0].reason and path.read_text() == after[:cut]


def test_malformed_section_markers_refuse_the_file_and_change_nothing(tmp_path, repo):
    path = repo / "AGENTS.md"
    path.write_text("x\n<!-- selftaught:agent-skill name=unit-math -->\nno end\n")
    done = place([skill("unit-math")], f"agents-md:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "refused"} and "never closed" in done.refused[0].reason
    assert path.read_text() == "x\n<!-- selftaught:agent-skill name=unit-math -->\nno end\n"


# ---- never over the user's changes ------------------------------------------------------------


def test_a_skill_file_the_user_changed_is_never_overwritten_the_others_are(tmp_path, repo):
    place([skill("unit-math"), skill("date-format")], f"claude:{repo}", tmp_path)
    mine = repo / ".claude/skills/unit-math/SKILL.md"
    mine.write_text(mine.read_text() + "\nA line the user added.\n")
    users = repo / ".claude/skills/their-own/SKILL.md"
    users.parent.mkdir()
    users.write_text('---\nname: their-own\ndescription: "theirs"\n---\nTheir text.\n')
    new = [skill(n, "Updated.") for n in ("unit-math", "date-format", "their-own")]
    done = place(new, f"claude:{repo}", tmp_path)
    assert actions(done) == {
        "unit-math": "skipped-user-changed",
        "date-format": "written",
        "their-own": "skipped-user-changed",
    }
    assert "A line the user added." in mine.read_text()
    assert users.read_text().endswith("Their text.\n")
    assert (repo / ".claude/skills/date-format/SKILL.md").read_text().endswith("Updated.\n")
    reasons = {f.skill: f.reason for f in done.skipped}
    assert "neither written by selftaught nor read" in reasons["their-own"]


def test_a_file_read_as_a_starting_document_may_be_replaced_until_it_changes(tmp_path, repo):
    users = repo / ".codex/skills/their-own/SKILL.md"
    users.parent.mkdir(parents=True)
    users.write_text('---\nname: their-own\ndescription: "theirs"\n---\nTheir text.\n')
    docs = read_starting_documents(repo)
    (doc,) = docs
    assert doc.kind == "codex-skill" and doc.skill and doc.skill.body == "Their text."
    edit = DocumentEdit(doc, doc.text.replace("Their text.", "Their text, improved."))
    users.write_text(users.read_text() + "typed meanwhile\n")
    done = write_documents([edit], home=tmp_path / "home")
    assert [f.action for f in done.files] == ["skipped-user-changed"]
    assert users.read_text().endswith("typed meanwhile\n")
    (doc,) = read_starting_documents(repo)  # read again: now the edit goes through
    done = write_documents(
        [DocumentEdit(doc, doc.text + "One more rule.\n")], home=tmp_path / "home"
    )
    assert [f.action for f in done.files] == ["written"] and "+One more rule." in done.files[0].diff


def test_place_skills_replaces_a_users_skill_it_was_given_as_read(tmp_path, repo):
    users = repo / ".agents/skills/their-own/SKILL.md"
    users.parent.mkdir(parents=True)
    users.write_text('---\nname: their-own\ndescription: "theirs"\n---\nTheir text.\n')
    docs = read_starting_documents(repo)
    trained = skill("their-own", "Their text, trained.")
    assert actions(place([trained], f"codex:{repo}", tmp_path)) == {
        "their-own": "skipped-user-changed"
    }
    assert actions(place([trained], f"codex:{repo}", tmp_path, read=docs)) == {
        "their-own": "written"
    }
    assert users.read_text().endswith("Their text, trained.\n")


def test_a_changed_file_stops_only_itself_when_writing_back(tmp_path, repo):
    (repo / "CLAUDE.md").write_text("Claude rules.\n")
    (repo / "AGENTS.md").write_text("Agent rules.\n")
    claude_md, agents_md = read_starting_documents(repo)
    assert (claude_md.kind, agents_md.kind) == ("claude-md", "agents-md")
    (repo / "CLAUDE.md").write_text("Claude rules, the user's edit.\n")
    done = write_documents(
        [DocumentEdit(claude_md, "Claude rules v2.\n"), DocumentEdit(agents_md, "Agent v2.\n")],
        home=tmp_path / "home",
    )
    assert [(Path(f.path).name, f.action) for f in done.files] == [
        ("CLAUDE.md", "skipped-user-changed"),
        ("AGENTS.md", "written"),
    ]
    assert (repo / "CLAUDE.md").read_text() == "Claude rules, the user's edit.\n"
    assert (repo / "AGENTS.md").read_text() == "Agent v2.\n"


def test_a_write_back_keeps_the_users_front_matter_and_markers(tmp_path, repo):
    users = repo / ".claude/skills/theirs/SKILL.md"
    users.parent.mkdir(parents=True)
    users.write_text('---\nname: theirs\ndescription: "d"\nallowed-tools: Read\n---\nBody.\n')
    (repo / "AGENTS.md").write_text("<!-- selftaught:skill -->\nx\n<!-- /selftaught:skill -->\n")
    skill_doc, agents = sorted(read_starting_documents(repo), key=lambda d: d.kind)[::-1]
    assert skill_doc.skill.extra == ("allowed-tools: Read",)
    bad = [
        DocumentEdit(skill_doc, skill_doc.text.replace("Read", "Bash")),
        DocumentEdit(agents, "gone\n"),
    ]
    done = write_documents(bad, home=tmp_path / "home")
    assert [f.action for f in done.files] == ["refused", "refused"]
    assert "front matter" in done.files[0].reason and "marker lines" in done.files[1].reason
    ok = DocumentEdit(skill_doc, skill_doc.text.replace("Body.", "Body, better."))
    done = write_documents([ok], home=tmp_path / "home")
    assert done.files[0].action == "written"
    assert users.read_text() == (
        '---\nname: theirs\ndescription: "d"\nallowed-tools: Read\n---\nBody, better.\n'
    )


# ---- restore, symlinks, starting documents -----------------------------------------------------


def test_restore_gives_back_the_previous_bytes_and_removes_what_was_new(tmp_path, repo):
    (repo / "AGENTS.md").write_bytes(USER_AGENTS.encode())
    place([skill("unit-math")], f"claude:{repo}", tmp_path)
    first = (repo / ".claude/skills/unit-math/SKILL.md").read_bytes()
    second = place([skill("unit-math", "Changed.")], f"claude:{repo}", tmp_path)
    sections = place([skill("unit-math")], f"agents-md:{repo}", tmp_path)
    back = restore_placement(sections.backup, home=tmp_path / "home")
    assert [f.action for f in back.files] == ["written"]
    assert (repo / "AGENTS.md").read_bytes() == USER_AGENTS.encode()
    back = restore_placement(second.backup, home=tmp_path / "home")
    assert (repo / ".claude/skills/unit-math/SKILL.md").read_bytes() == first
    # the restored file is selftaught's again: a later placement may replace it
    assert actions(place([skill("unit-math", "x.")], f"claude:{repo}", tmp_path)) == {
        "unit-math": "written"
    }


def test_restore_removes_a_new_file_unless_the_user_changed_it(tmp_path, repo):
    one = place([skill("unit-math")], f"codex:{repo}", tmp_path)
    back = restore_placement(one.backup, home=tmp_path / "home")
    assert [f.action for f in back.files] == ["removed"]
    assert not (repo / ".agents/skills/unit-math").exists()
    two = place([skill("unit-math")], f"codex:{repo}", tmp_path)
    path = repo / ".agents/skills/unit-math/SKILL.md"
    path.write_text(path.read_text() + "mine\n")
    back = restore_placement(two.backup, home=tmp_path / "home")
    assert [f.action for f in back.files] == ["skipped-user-changed"]
    assert path.read_text().endswith("mine\n")


def test_symlinks_are_refused_unless_followed(tmp_path, repo):
    elsewhere = tmp_path / "dotfiles"
    elsewhere.mkdir()
    (repo / ".claude").symlink_to(elsewhere, target_is_directory=True)
    done = place([skill("unit-math")], f"claude:{repo}", tmp_path)
    assert actions(done) == {"unit-math": "refused"} and "symlink" in done.refused[0].reason
    assert not any(elsewhere.iterdir())
    done = place([skill("unit-math")], f"claude:{repo}", tmp_path, follow_symlinks=True)
    assert actions(done) == {"unit-math": "written"}
    assert (elsewhere / "skills/unit-math/SKILL.md").is_file()
    docs = read_starting_documents(repo)
    assert [d.problem is not None and "symlink" in d.problem for d in docs] == [True]
    (doc,) = read_starting_documents(repo, follow_symlinks=True)
    assert doc.usable and doc.path == (elsewhere / "skills/unit-math/SKILL.md").resolve()


def test_starting_documents_are_every_instruction_file_with_its_hash(tmp_path, repo):
    (repo / "CLAUDE.md").write_text("c\n")
    (repo / "AGENTS.md").write_text("a\n")
    for folder in (".claude/skills/x", ".agents/skills/y"):
        (repo / folder).mkdir(parents=True)
        name = folder.rsplit("/", 1)[1]
        (repo / folder / "SKILL.md").write_text(f'---\nname: {name}\ndescription: "d"\n---\nb\n')
    (repo / ".codex/skills/z").mkdir(parents=True)
    (repo / ".codex/skills/z/SKILL.md").write_text("no front matter\n")
    docs = read_starting_documents(repo)
    assert [(d.path.relative_to(repo).as_posix(), d.kind) for d in docs] == [
        ("CLAUDE.md", "claude-md"),
        ("AGENTS.md", "agents-md"),
        (".claude/skills/x/SKILL.md", "claude-skill"),
        (".agents/skills/y/SKILL.md", "codex-skill"),
        (".codex/skills/z/SKILL.md", "codex-skill"),
    ]
    import hashlib

    assert docs[0].sha256 == hashlib.sha256(b"c\n").hexdigest()
    assert (
        docs[2].skill.card.name == "x"
        and docs[4].skill is None
        and "front matter" in docs[4].problem
    )
    round_trip = StartingDocument.from_dict(json.loads(json.dumps(docs[2].to_dict())))
    assert round_trip == docs[2]


def test_results_round_trip_through_json(tmp_path, repo):
    done = place([skill("unit-math")], f"claude:{repo}", tmp_path)
    assert PlacementResult.from_dict(json.loads(json.dumps(done.to_dict()))) == done


# ---- the CLI ----------------------------------------------------------------------------------


def test_sleep_adopt_places_the_adopted_skill_for_each_agent(tmp_path, repo, monkeypatch):
    from typer.testing import CliRunner

    from selftaught.cli import app
    from selftaught.runs import atomic_write_json, atomic_write_text
    from selftaught.sleep.adoption import staging

    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    folder = staging.nights_dir("demo", home) / "night-1"
    atomic_write_text(folder / "proposal" / "skill.md", "Quote amounts in grams.")
    atomic_write_text(folder / "proposal" / "memory.md", "The ledger is in kg.")
    atomic_write_json(folder / "report.json", {"kind": staging.NIGHT_KIND, "night": "night-1",
                      "project": "demo", "status": "staged", "base_version": 0})  # fmt: skip
    runner = CliRunner()
    refused = runner.invoke(app, ["sleep", "adopt", "--project", "demo", "--place", "codex-global"])
    assert refused.exit_code == 2 and "--allow-global" in refused.output
    assert staging.current_version("demo", home) == 0  # refused before anything was adopted
    args = ["sleep", "adopt", "--project", "demo", "--place", f"claude:{repo}",
            "--place", f"agents-md:{repo}"]  # fmt: skip
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    text = (repo / ".claude/skills/demo/SKILL.md").read_text()
    assert text.startswith("---\nname: demo\ndescription: ")
    assert text.endswith("---\nQuote amounts in grams.\n\n## Memory\nThe ledger is in kg.\n")
    assert "## Skill: demo" in (repo / "AGENTS.md").read_text()
    assert f"written {repo / '.claude/skills/demo/SKILL.md'}" in done.output
