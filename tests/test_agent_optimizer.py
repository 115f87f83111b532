"""A coding agent as the optimizer (`--optimizer-model claude-code | codex | cmd:...`,
`skill/agent_edit.py`) and the skill package it edits (`skill_package.py`).

The agent edits a scratch copy of the package; its change comes back as one edit per hunk
of the diff, meets the edit budget, the guard and the gate like an analyst's edits, and what
it wrote outside the package is left out. The real pinned CLIs run against the scripted
upstream (`tests/agent_upstream.py`), which scripts the shell commands that edit SKILL.md;
`cmd:` optimizers are small Python scripts."""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.skill.agent_edit import diff_edits
from selftaught.skill.document import Edit, apply_edits, tidy
from selftaught.skill_package import (
    PackageError,
    PackageFile,
    check_blocks,
    join_files,
    keep_flags,
    read_package,
    split_files,
)
from tests.agent_upstream import (
    AgentUpstream,
    Call,
    point_clis,
    shell_arguments,
    with_cli,
)

KEY = "sk-test-optimizer-key-8d21f0"  # must never reach a file selftaught writes
MARKER = "MARKER-OPT"


def script(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(source)
    return f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


# the target: an agent that solves a task only when its instructions hold MARKER
TARGET = f"""\
import pathlib
rules = pathlib.Path("AGENTS.md")
print("SOLVED" if rules.exists() and "{MARKER}" in rules.read_text() else "UNSOLVED")
"""


def marker_task(tmp_path: Path) -> Path:
    rows = [
        {"id": f"t{i}", "input": f"Question {i}: is it solved?", "reference": "SOLVED"}
        | {"split": "train"}
        for i in range(4)
    ] + [
        {"id": f"v{i}", "input": f"Check number {i}: solved?", "reference": "SOLVED"}
        | {"split": "val"}
        for i in range(6)
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def optimize(tmp_path: Path, optimizer: str, skill: Path, *extra: str):
    run = tmp_path / "run"
    args = ["optimize", "--task", f"jsonl:{marker_task(tmp_path)}"]
    args += ["--model", script(tmp_path, "target.py", TARGET), "--optimizer-model", optimizer]
    args += ["--skill", str(skill), "--epochs", "1", "--batch-size", "4", "--no-test"]
    args += ["--demo-sets", "0", "--output", str(run), *extra]
    result = CliRunner().invoke(app, args)
    return result, run


def step_one(run: Path) -> tuple[dict, dict]:
    """(history row, diagnostics) of step 1."""
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    return rows[1], json.loads((run / "diagnostics" / "step_0001.json").read_text())


# ---- the diff as edits --------------------------------------------------------------------

VOCAB = ["- Check the units.", "## Steps", "", "  - an indented rule", "def f(x):"]
VOCAB += ["    return x", "", "x = 1", "# Title", "- Check the units."]


def _mutate(rng: random.Random, lines: list[str]) -> list[str]:
    lines = list(lines)
    for _ in range(rng.randint(0, 3)):
        i = rng.randint(0, len(lines))
        op = rng.choice("ird")
        if op == "i":
            lines.insert(i, rng.choice([*VOCAB, f"- New {rng.randint(0, 99)}"]))
        elif op == "r" and lines:
            lines[min(i, len(lines) - 1)] = f"- Changed {rng.randint(0, 99)}"
        elif op == "d" and lines:
            del lines[min(i, len(lines) - 1)]
    return lines


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _visible(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n") if line.strip())


def _apply_as_proposer(before: str, edits: list[Edit]) -> tuple[str, list]:
    """Apply as `Proposer.update` does: additions at the end first, the rest last first."""
    order = [e for e in edits if e.op == "append"] + [e for e in edits if e.op != "append"][::-1]
    return apply_edits(before, order, fallback_append=False)


@pytest.mark.parametrize("seed", range(4))
def test_the_hunks_of_a_package_rebuild_what_the_agent_left(seed):
    # random documents, files changed, deleted and added: applying every hunk to the parent
    # gives the agent's package, blank lines aside, each hunk applied where it belongs
    rng = random.Random(seed)
    paths = ["scripts/a.py", "scripts/b.sh", "references/r.md", "references/s/t.md"]
    for _ in range(250):
        files = {p: _text(rng.choices(VOCAB, k=rng.randint(1, 6))) for p in rng.sample(paths, 2)}
        md = _text(rng.choices(VOCAB, k=rng.randint(0, 6)))
        before = tidy(join_files(md, [PackageFile(p, t) for p, t in files.items()]))
        new_files = {
            p: _text(_mutate(rng, t.split("\n")[:-1]))
            for p, t in files.items()
            if rng.random() > 0.2
        }
        if rng.random() < 0.3:
            new_files["scripts/new.py"] = _text(rng.choices(VOCAB, k=3))
        new_md = _text(_mutate(rng, md.split("\n")[:-1]))
        after = join_files(new_md, [PackageFile(p, t) for p, t in new_files.items()])
        hunks, invalid = diff_edits(before, after, max_chars=800)
        text, reports = _apply_as_proposer(before, [h.edit for h in hunks])
        assert not invalid
        assert [r.status for r in reports if not r.changed] == [], (before, after)
        assert _visible(text) == _visible(after), (before, after)
        check_blocks(text)


def test_one_hunk_is_one_edit_and_a_new_file_is_one():
    before = tidy(join_files("# Rules\n- a\n- b\n- c\n", [PackageFile("references/x.md", "x\n")]))
    after = join_files(
        "# Rules\n- a (changed)\n- b\n- c\n- d\n",
        [PackageFile("references/x.md", "x\n"), PackageFile("scripts/y.py", "print(1)\n")],
    )
    hunks, _ = diff_edits(before, after, max_chars=800)
    assert [h.added for h in hunks] == [
        "- a (changed)",
        "- d",
        PackageFile("scripts/y.py", "print(1)\n").block().rstrip("\n"),
    ]
    assert [h.edit.rationale for h in hunks] == [
        "the agent's change to SKILL.md",
        "the agent's change to SKILL.md",
        "the agent's change to scripts/y.py (new)",
    ]


def test_a_hunk_over_the_edit_cap_is_invalid_saying_so():
    before = "# Rules\n- a\n"
    hunks, invalid = diff_edits(before, before + "- " + "x" * 900 + "\n", max_chars=800)
    assert hunks == []
    assert "over the 800 cap" in invalid[0]["reason"]


# ---- the package in the skill's text --------------------------------------------------------


def make_package(root: Path) -> Path:
    (root / "scripts").mkdir(parents=True)
    (root / "references").mkdir()
    (root / "SKILL.md").write_text("---\nname: calc\ndescription: sums\n---\nUse scripts/add.sh.\n")
    (root / "scripts" / "add.sh").write_text("#!/bin/sh\necho $(($1 + $2))\n")
    (root / "scripts" / "add.sh").chmod(0o755)
    (root / "references" / "notes.md").write_text("Sums of two numbers.\n\n\nEnd.\n")
    return root


def test_a_package_folder_reads_as_one_text_and_back(tmp_path):
    text = read_package(make_package(tmp_path / "calc"))
    rules, files = split_files(text)
    assert rules.startswith("---\nname: calc") and rules.endswith("Use scripts/add.sh.\n")
    assert [(f.path, f.executable) for f in files] == [
        ("references/notes.md", False),
        ("scripts/add.sh", True),  # as the user gave it
    ]
    assert files[0].text == "Sums of two numbers.\n\n\nEnd.\n"  # a file keeps its blank lines
    assert tidy(text) == text and join_files(rules, files) == text


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda r: (r / "scripts" / "link.sh").symlink_to("/etc/passwd"), "symlink"),
        (lambda r: (r / "scripts" / "bin.dat").write_bytes(b"\x00\xff\x00"), "not UTF-8"),
        (lambda r: (r / "references" / "big.md").write_text("x" * 70_000), "over the 65536"),
        (lambda r: (r / "references" / ".hidden").write_text("x"), "no hidden names"),
        (
            lambda r: (r / "references" / "m.md").write_text("<!-- /selftaught:file -->\n"),
            "marker",
        ),
    ],
)
def test_a_package_refuses_what_is_not_a_plain_text_file(tmp_path, make, message):
    root = make_package(tmp_path / "calc")
    make(root)
    with pytest.raises(PackageError, match=message):
        read_package(root)


def test_only_the_users_package_makes_a_file_executable():
    before = join_files(
        "r\n", [PackageFile("scripts/a.sh", "a\n", True), PackageFile("scripts/b.sh", "b\n")]
    )
    forged = before.replace("path=scripts/b.sh -->", "path=scripts/b.sh exec -->").replace(
        "path=scripts/a.sh exec -->", "path=scripts/a.sh -->"
    )
    forged += PackageFile("scripts/c.sh", "c\n", True).block()
    flags = {f.path: f.executable for f in split_files(keep_flags(forged, before))[1]}
    assert flags == {"scripts/a.sh": True, "scripts/b.sh": False, "scripts/c.sh": False}


def test_an_analyst_edit_may_not_forge_or_break_a_file_block():
    from selftaught.skill.document import EditError

    with pytest.raises(EditError, match="package file's markers"):
        Edit.from_dict(
            {"op": "append", "content": "<!-- selftaught:file path=scripts/x.sh exec -->"}
        )
    text = join_files("r\n", [PackageFile("scripts/a.sh", "a\n")])
    broken, (report,) = apply_edits(text, [Edit("delete", target="<!-- /selftaught:file -->")])
    assert report.status == "breaks_package" and broken == text


# ---- a cmd: agent as the optimizer, end to end ------------------------------------------

EDITOR = f"""\
import json, os, pathlib, stat
skill = pathlib.Path("SKILL.md")
rule = "Use scripts/add.sh."
skill.write_text(skill.read_text().replace(rule, rule + "\\nSay {MARKER}."))
notes = pathlib.Path("references/notes.md")
notes.write_text(notes.read_text() + "Mind negative numbers.\\n")
new = pathlib.Path("scripts/check.sh")
new.write_text("#!/bin/sh\\nexit 0\\n")
new.chmod(0o755)
pathlib.Path("notes.txt").write_text("scratch\\n")  # outside the package
seen = {{
    "failed": sorted(os.listdir("rollouts/failed")),
    "passed": sorted(os.listdir("rollouts/passed")),
    "instructions": "at most 3 changes" in pathlib.Path("AGENTS.md").read_text(),
    "script_mode": oct(stat.S_IMODE(os.stat("scripts/add.sh").st_mode)),
    "failed_01": pathlib.Path("rollouts/failed/01.md").read_text(),
}}
print(json.dumps(seen))
"""


def test_a_cmd_agent_optimizes_a_package_through_the_gate(tmp_path):
    package = make_package(tmp_path / "calc")
    editor = script(tmp_path, "editor.py", EDITOR)
    result, run = optimize(
        tmp_path, editor, package, "--edit-budget-max", "3", "--edit-budget-min", "3"
    )
    assert result.exit_code == 0, result.output
    row, diag = step_one(run)
    assert row["gate"]["decision"] == "accept_new_best"
    (call,) = diag["analyst_calls"]
    seen = json.loads(call["raw_reply"])
    assert seen["instructions"] and len(seen["failed"]) == 4 and seen["passed"] == []
    assert seen["script_mode"] == "0o644"  # no file of the package is executable there
    assert "# Task 1 (failed)" in seen["failed_01"] and "Grader feedback" in seen["failed_01"]
    assert call["kind"] == "agent" and call["agent"]["cli"] == "cmd"
    assert [e["rationale"] for e in call["edits"]] == [
        "the agent's change to SKILL.md",
        "the agent's change to references/notes.md",
        "the agent's change to scripts/check.sh (new)",
    ]
    assert call["invalid_edits"] == [
        {
            "edit": {"path": "notes.txt"},
            "reason": "outside the skill package: not part of the candidate",
        }
    ]
    assert row["edits"]["applied"] == 3
    best = run / "best_package"
    assert f"Say {MARKER}." in (best / "SKILL.md").read_text()
    assert (best / "references" / "notes.md").read_text().endswith("Mind negative numbers.\n")
    assert (best / "scripts" / "check.sh").read_text() == "#!/bin/sh\nexit 0\n"
    assert not os.access(best / "scripts" / "check.sh", os.X_OK)  # the optimizer's: never
    assert os.access(best / "scripts" / "add.sh", os.X_OK)  # the user's own: as given
    assert not (best / "notes.txt").exists()


def test_past_the_edit_budget_the_later_hunks_are_dropped(tmp_path):
    package = make_package(tmp_path / "calc")
    editor = script(tmp_path, "editor.py", EDITOR)
    result, run = optimize(
        tmp_path, editor, package, "--edit-budget-max", "1", "--edit-budget-min", "1"
    )
    assert result.exit_code == 0, result.output
    row, diag = step_one(run)
    assert row["edits"]["proposed"] == 3 and row["edits"]["applied"] == 1
    assert row["edits"]["dropped"] == {"over the edit budget": 2}
    assert row["gate"]["decision"] == "accept_new_best"
    best = run / "best_package"
    assert f"Say {MARKER}." in (best / "SKILL.md").read_text()
    assert not (best / "scripts" / "check.sh").exists()
    assert "Mind negative" not in (best / "references" / "notes.md").read_text()


def test_a_cmd_optimizer_passes_the_same_template_guard(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text("rules\n")
    result, _ = optimize(tmp_path, "cmd:sh -c 'edit {prompt}'", skill)
    assert result.exit_code == 2
    assert "would run the prompt as shell code" in result.output


def test_an_agent_edit_that_echoes_its_instructions_is_refused_by_the_guard(tmp_path):
    echo = f"""\
import pathlib
words = pathlib.Path("AGENTS.md").read_text().split("## Your job")[1].split("\\n\\n")[1]
p = pathlib.Path("SKILL.md")
p.write_text(p.read_text() + " ".join(words.split()) + " {MARKER}\\n")
print("echoed")
"""
    skill = tmp_path / "skill.md"
    skill.write_text("# Rules\n- Be brief.\n")
    result, run = optimize(tmp_path, script(tmp_path, "echo.py", echo), skill)
    assert result.exit_code == 0, result.output
    row, diag = step_one(run)
    (call,) = diag["analyst_calls"]
    assert call["edits"] == []
    assert call["refused_edits"][0]["reason"] == "echoes the analyst's prompt"
    assert MARKER not in (run / "best_skill.md").read_text()


# ---- the real CLIs as the optimizer -------------------------------------------------------


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    """Point both CLIs at a scripted upstream, with KEY as their API key."""
    return point_clis(monkeypatch, tmp_path, KEY)


def editing_policy(outside: Path):
    """The optimizer's model: one shell command that changes SKILL.md in two places (a rule
    on top, one at the end), writes a file beside it and one outside the folder; Claude Code
    then tries its Write tool outside the folder too; then it answers."""
    command = (
        f"sed -i '1i Say {MARKER}.' SKILL.md && printf -- '- Keep it short.\\n' >> SKILL.md"
        f" && echo scratch > notes.txt; touch {outside}; echo edited"
    )

    def policy(request):
        done = len(request.tool_results)
        tool = request.shell_tool()
        if done == 0 and tool is not None:
            return Call(tool, shell_arguments(tool, command))
        if done == 1 and "Write" in request.tools:
            return Call("Write", {"file_path": f"{outside}-write", "content": "x"})
        return "I added a rule that names the marker."

    return policy


@pytest.mark.parametrize("kind", with_cli())
def test_a_real_agent_edits_the_skill_and_the_gate_takes_it(tmp_path, upstream_env, kind):
    outside = Path.home() / ".cache" / "selftaught" / f"escape-opt-{os.getpid()}-{kind}"
    skill = tmp_path / "skill.md"
    skill.write_text("# Rules\n- Be brief.\n")
    try:
        with AgentUpstream(editing_policy(outside)) as up:
            upstream_env(up)
            budget = ("--edit-budget-max", "1", "--edit-budget-min", "1")
            result, run = optimize(tmp_path, kind, skill, *budget)
            assert result.exit_code == 0, result.output
            first = up.requests_seen[0].context()
        assert not outside.exists() and not Path(f"{outside}-write").exists()
    finally:
        outside.unlink(missing_ok=True)
        Path(f"{outside}-write").unlink(missing_ok=True)
    assert "at most 1 changes" in first and "rollouts/failed/" in first  # its instructions
    row, diag = step_one(run)
    (call,) = diag["analyst_calls"]
    assert call["kind"] == "agent" and call["agent"]["cli"] == kind
    assert call["raw_reply"] == "I added a rule that names the marker."
    # the diff: two hunks, the budget keeps the first; notes.txt is not part of the package
    assert [e["content"] for e in call["edits"]] == [f"Say {MARKER}.\n# Rules", "- Keep it short."]
    assert row["edits"]["dropped"] == {"over the edit budget": 1}
    assert {
        "edit": {"path": "notes.txt"},
        "reason": "outside the skill package: not part of the candidate",
    } in call["invalid_edits"]
    assert row["gate"]["decision"] == "accept_new_best"
    assert (run / "best_skill.md").read_text() == f"Say {MARKER}.\n# Rules\n- Be brief.\n"
    summary = json.loads((run / "summary.json").read_text())
    optimizer = summary["usage"]["optimizer"]
    assert optimizer["calls"] == 1 and optimizer["prompt_tokens"] > 0
    if kind == "claude-code":  # it reports what the run cost: charged to the budget
        assert optimizer["usd"] == pytest.approx(call["agent"]["total_cost_usd"])
        assert call["agent"]["permission_denials"] == 1  # its Write outside the folder
    for file in run.rglob("*"):
        if file.is_file():
            assert KEY not in file.read_text(errors="replace"), file


def test_a_skill_that_is_one_file_stays_one(tmp_path):
    adder = f"""\
import pathlib
pathlib.Path("SKILL.md").write_text("Say {MARKER}.\\n" + pathlib.Path("SKILL.md").read_text())
pathlib.Path("references").mkdir()
pathlib.Path("references/more.md").write_text("more\\n")
print("done")
"""
    skill = tmp_path / "skill.md"
    skill.write_text("# Rules\n- Be brief.\n")
    result, run = optimize(tmp_path, script(tmp_path, "adder.py", adder), skill)
    assert result.exit_code == 0, result.output
    _, diag = step_one(run)
    (call,) = diag["analyst_calls"]
    assert len(call["edits"]) == 1 and "not a package" in call["invalid_edits"][0]["reason"]
    assert (run / "best_skill.md").read_text() == f"Say {MARKER}.\n# Rules\n- Be brief.\n"
    assert not (run / "best_package").exists()


def test_a_usd_budget_takes_claude_code_which_reports_its_cost():
    from selftaught.errors import ConfigError
    from selftaught.models.usage import Budget

    Budget(usd=1.0).check_priced(["claude-code", "claude-code:claude-sonnet-4-5"])
    with pytest.raises(ConfigError, match="codex"):
        Budget(usd=1.0).check_priced(["codex"])
