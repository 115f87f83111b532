"""The skills `place_skills` writes are read by the real, pinned Claude Code and Codex CLIs.

Each test writes a skill whose body holds a rule the scripted upstream (`tests.agent_upstream`)
needs before it answers SOLVED, runs the CLI non-interactively in a temp repository against
that upstream, and reads from what the upstream received that the skill reached the agent:

- Claude Code (`claude:REPO`): the skill's name and description in its skill listing; the
  upstream calls the `Skill` tool by that name, and the body comes back to it;
- Codex (`codex:REPO`, and `codex-global` in its home): the skill in its `<skills_instructions>`
  listing with its file; the upstream `cat`s that file with the shell tool and gets the body;
- Codex (`agents-md:REPO`): the body in the AGENTS.md instructions of the first request.

A run without the skill answers UNSOLVED, so the rule is what made the difference. The CLIs come
from `scripts/install-agent-clis.sh`; without them these tests skip, saying so."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from selftaught.skill.routing import SkillCard
from selftaught.skill.skill_md import SkillFile
from selftaught.sleep.adoption.placement import PlacementTarget, place_skills
from tests.agent_upstream import (
    MODEL,
    AgentRequest,
    AgentUpstream,
    Call,
    Reply,
    agent_env,
    codex_config,
    find_cli,
    needs_skill,
    shell_arguments,
)

NAME = "ledger-units"
DESCRIPTION = "Use for converting ledger quantities between units (PLACED-DESC-3318)."
RULE = "RULE-7741: always quote amounts in grams."
CLI_TIMEOUT_S = 120


def the_skill() -> SkillFile:
    return SkillFile(SkillCard(NAME, DESCRIPTION), f"# Ledger units\n\n{RULE}\n")


def need(name: str) -> str:
    path = find_cli(name)
    if path is None:
        pytest.skip(f"{name} CLI not installed: run scripts/install-agent-clis.sh")
    return path


def run_claude(up: AgentUpstream, repo: Path, home: Path) -> str | None:
    env = agent_env(home, ANTHROPIC_BASE_URL=up.root_url, ANTHROPIC_API_KEY="sk-test")
    cmd = [need("claude"), "-p", "convert the ledger", "--output-format", "json",
           "--model", MODEL]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        return json.loads(done.stdout).get("result")
    except ValueError:
        return f"no JSON: {done.stdout[-500:]} {done.stderr[-1500:]}"


def run_codex(up: AgentUpstream, repo: Path, home: Path) -> str | None:
    env = agent_env(home, X_KEY="sk-test")
    codex_config(home / ".codex", up.base_url, key_env="X_KEY")
    cmd = [need("codex"), "exec", "--skip-git-repo-check", "--json", "convert the ledger"]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    texts = [
        e["item"]["text"] for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]  # fmt: skip
    return texts[-1] if texts else f"rc {done.returncode}: {done.stderr[-1500:]}"


def uses_claude_skill(request: AgentRequest) -> Reply:
    """SOLVED once the rule is in the context; the Skill tool when the skill is listed."""
    if RULE in request.context():
        return "SOLVED"
    if f"- {NAME}: {DESCRIPTION}" in request.context() and "Skill" in request.tools:
        return Call("Skill", {"skill": NAME})
    return "UNSOLVED"


def codex_skill_file(context: str) -> str | None:
    """The absolute path of skill NAME in Codex's listing (`(file: rN/NAME/SKILL.md)` and the
    skill roots table `- `rN` = `/abs``)."""
    listed = re.search(rf"- {NAME}: {re.escape(DESCRIPTION)} \(file: (r\d+)/(\S+)\)", context)
    if listed is None:
        return None
    root = re.search(rf"- `{listed.group(1)}` = `([^`]+)`", context)
    return f"{root.group(1)}/{listed.group(2)}" if root else None


def reads_codex_skill(request: AgentRequest) -> Reply:
    """SOLVED once the shell read the rule; else `cat` the listed skill file."""
    if any(RULE in r.output for r in request.tool_results):
        return "SOLVED"
    path = codex_skill_file(request.context())
    if path is not None and request.tool_results == [] and request.shell_tool():
        tool = request.shell_tool()
        return Call(tool, shell_arguments(tool, f"cat {path}"))
    return "UNSOLVED"


def temp_repo(tmp_path: Path, name: str) -> Path:
    repo = tmp_path / name
    repo.mkdir()
    (repo / "README.md").write_text("A ledger.\n")
    return repo


def place(spec: str, tmp_path: Path, **kw: Any) -> None:
    target = PlacementTarget.parse(spec, **kw)
    done = place_skills([the_skill()], target, home=tmp_path / "selftaught-home")
    assert [f.action for f in done.files] == ["written"], done


def test_claude_code_lists_the_placed_skill_and_reads_its_body_through_the_skill_tool(tmp_path):
    need("claude")
    bare = temp_repo(tmp_path, "bare")
    with AgentUpstream(uses_claude_skill) as up:
        assert run_claude(up, bare, tmp_path / "home-bare") == "UNSOLVED"
    repo = temp_repo(tmp_path, "repo")
    place(f"claude:{repo}", tmp_path)
    with AgentUpstream(uses_claude_skill) as up:
        result = run_claude(up, repo, tmp_path / "home")
        seen = list(up.requests_seen)
    assert result == "SOLVED", result
    first = seen[0]
    assert f"- {NAME}: {DESCRIPTION}" in first.context() and RULE not in first.context()
    called = [r for r in seen if any(t.name == "Skill" for t in r.tool_results)]
    assert called and RULE in called[0].context()  # the body, after the Skill tool's result


@pytest.mark.parametrize("spec", ["codex", "codex-global"])
def test_codex_lists_the_placed_skill_and_its_file_holds_the_body(tmp_path, spec):
    need("codex")
    bare = temp_repo(tmp_path, "bare")
    with AgentUpstream(reads_codex_skill) as up:
        assert run_codex(up, bare, tmp_path / "home-bare") == "UNSOLVED"
    repo = temp_repo(tmp_path, "repo")
    home = tmp_path / "home"
    if spec == "codex":
        place(f"codex:{repo}", tmp_path)
        where = repo / ".agents" / "skills"
    else:
        place(f"codex-global:{home / '.codex'}", tmp_path, allow_global=True)
        where = home / ".codex" / "skills"
    with AgentUpstream(reads_codex_skill) as up:
        result = run_codex(up, repo, home)
        seen = list(up.requests_seen)
    assert result == "SOLVED", result
    assert codex_skill_file(seen[0].context()) == str(where / NAME / "SKILL.md")
    assert RULE not in seen[0].context()


def test_codex_reads_the_agents_md_section_in_every_turn(tmp_path):
    need("codex")
    repo = temp_repo(tmp_path, "repo")
    (repo / "AGENTS.md").write_text("# House rules\n\nUse tabs.\n")
    with AgentUpstream(needs_skill(RULE)) as up:
        assert run_codex(up, repo, tmp_path / "home-bare") == "UNSOLVED"
    place(f"agents-md:{repo}", tmp_path)
    with AgentUpstream(needs_skill(RULE)) as up:
        result = run_codex(up, repo, tmp_path / "home")
        first = up.requests_seen[0]
    assert result == "SOLVED", result
    agents = next(
        t["text"] for t in first.turns if t["text"].startswith("# AGENTS.md instructions for")
    )
    assert "Use tabs." in agents and RULE in agents and f"## Skill: {NAME}" in agents


# ---- end to end: what a night learned, adopted with --place, read by the real agents --------


def night_skill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A many-skills night on scripted traffic (`tests.test_sleep_skills`): the name, the
    description and the body of the skill it learned for the 'alpha' intent."""
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night
    from tests.test_sleep_skills import fill_two_intents, two_rule_models

    home = tmp_path / "selftaught-home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    fill_two_intents(home, home / "log.db")
    cfg = NightConfig(home=home, log_path=home / "log.db", many_skills=True,
                      training=night_training_defaults())  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    for entry in staging.read_report(night.night_dir)["skills"]:
        body = (night.night_dir / "skills" / entry["name"] / "proposal" / "skill.md").read_text()
        if "rule alpha" in body:
            return entry["name"], entry["description"], body
    raise AssertionError("the night learned no skill for the alpha intent")


def adopt_and_place(name: str, spec: str) -> None:
    from typer.testing import CliRunner

    from selftaught import cli
    from tests.test_sleep_skills import PROJECT

    done = CliRunner().invoke(
        cli.app, ["sleep", "adopt", "--skill", name, "--project", PROJECT, "--place", spec]
    )
    assert done.exit_code == 0, done.output


def test_a_skill_a_night_learned_is_used_by_the_real_claude_code(tmp_path, monkeypatch):
    need("claude")
    name, description, _ = night_skill(tmp_path, monkeypatch)

    def policy(request: AgentRequest) -> Reply:
        if "rule alpha" in request.context():
            return "SOLVED"
        if f"- {name}: {description}" in request.context() and "Skill" in request.tools:
            return Call("Skill", {"skill": name})
        return "UNSOLVED"

    repo = temp_repo(tmp_path, "repo")
    with AgentUpstream(policy) as up:
        assert run_claude(up, repo, tmp_path / "home-bare") == "UNSOLVED"
    adopt_and_place(name, f"claude:{repo}")
    with AgentUpstream(policy) as up:
        assert run_claude(up, repo, tmp_path / "home") == "SOLVED"


def test_a_skill_a_night_learned_is_used_by_the_real_codex(tmp_path, monkeypatch):
    need("codex")
    name, _, _ = night_skill(tmp_path, monkeypatch)
    repo = temp_repo(tmp_path, "repo")
    with AgentUpstream(needs_skill("rule alpha")) as up:
        assert run_codex(up, repo, tmp_path / "home-bare") == "UNSOLVED"
    adopt_and_place(name, f"agents-md:{repo}")
    with AgentUpstream(needs_skill("rule alpha")) as up:
        assert run_codex(up, repo, tmp_path / "home") == "SOLVED"
