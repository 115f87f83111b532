"""No prompt is ever shell code: what a `cmd:` template may do with the text it carries.

- Every spelling that reads a placeholder (or the prompt on stdin) as code is refused when the
  template is parsed, whatever the flag spelling (`bash -c -e`, `-Cc`, `sh -ec --`), the
  program's path or name (`/bin/dash`, `sh.distrib`, `busybox sh`), or the launcher in front
  (`env`, `timeout 60`, `nice -n 5`, `ssh`); the safe forms are accepted.
- The safe forms, run for real on hostile prompts (`$(touch F)`, backticks, `;`, a prompt
  starting with `-e`), hand the agent the text and run none of it.
- A night replaying logged traffic on a `cmd:` agent: an unsafe template is refused before
  anything runs (measured before: `env sh -c 'echo {prompt}'` ran 16 users' `$(...)` on the
  host); a safe one runs only with `--allow-cmd-replay`, and runs none of the prompts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.errors import ConfigError, InputError
from selftaught.models import load_model
from selftaught.models.agents.command import CommandTemplateError, parse_template
from selftaught.models.agents.command_guard import program_name
from selftaught.models.base import GenerationParams
from selftaught.models.spec import ModelSpecError, parse_model_spec
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night.cycle import NightConfig, NightModels, run_night
from tests.scripted import ScriptedModel, canned_analyst

SHELL = "would run the prompt as shell code"
LAUNCHER = "launches another program"
OPTIONS = "still reads options"
STDIN = "reads its program from stdin"
INSIDE = "inside a larger argument"
UNKNOWN = "does not know"
OPAQUE = "in ways selftaught cannot check"

REFUSED = [
    # the spellings the old guard let through (issue 49)
    ("bash -c -e 'echo {prompt}'", SHELL),
    ("bash -c -- 'echo {prompt}'", SHELL),
    ("bash -Cc 'echo {prompt}'", SHELL),
    ("sh -ec -- 'echo {prompt}'", SHELL),
    ("env sh -c 'echo {prompt}'", LAUNCHER),
    ("/usr/bin/env bash -c 'echo {prompt}'", LAUNCHER),
    ("timeout 60 sh -c 'echo {prompt}'", LAUNCHER),
    ("nice -n 5 bash -c 'echo {prompt}'", LAUNCHER),
    ("sh.distrib -c 'echo {prompt}'", SHELL),
    # the ones it caught, still caught
    ("sh -c 'my-agent {prompt}'", SHELL),
    ("bash -lc 'echo {instructions}'", SHELL),
    # more shells, paths and flag spellings
    ("/bin/dash -c 'echo {prompt}'", SHELL),
    ("busybox sh -c 'echo {prompt}'", SHELL),
    ("zsh -c {prompt}", SHELL),
    ("ksh93 -xc 'echo {prompt}'", SHELL),
    ("bash-static -c 'cd {workspace} && agent'", SHELL),
    ("bash -euo pipefail -c 'echo {prompt}'", SHELL),
    ("bash +e -c 'echo {prompt}'", SHELL),
    ("sh -c -- {prompt} sh", SHELL),
    ("bash -o {prompt} -c 'agent'", "to an option of `bash`"),
    ("bash --rcfile {prompt} -c 'agent'", "to an option of `bash`"),
    ("bash -oerrexit -c 'agent \"$1\"' sh {prompt}", UNKNOWN),
    ("bash --wat -c 'agent \"$1\"' sh {prompt}", UNKNOWN),
    ("sh {prompt}", "reads its script"),
    # interpreters' inline code
    ("python -c 'print(\"{prompt}\")'", "would run the prompt as Python code"),
    ("python3 -c {prompt}", "would run the prompt as Python code"),
    ("python3.11 -Sc {prompt}", "would run the prompt as Python code"),
    ("python -m {prompt}", "would run the prompt as Python code"),
    ("perl -e {prompt}", "would run the prompt as Perl code"),
    ("perl -le {prompt}", "would run the prompt as Perl code"),
    ("perl -e 'print @ARGV' {prompt}", OPTIONS),  # a prompt "-e CODE" would be code
    ("perl -ne 'print' {prompt}", UNKNOWN),  # <> opens "cmd|" as a pipe
    ("node -e {prompt}", "would run the prompt as JavaScript code"),
    ("node -pe {prompt}", "would run the prompt as JavaScript code"),
    ("node --eval={prompt}", "to an option of `node`"),
    ("node -e 'console.log(1)' {prompt}", OPTIONS),
    ("ruby -e {prompt}", "would run the prompt as Ruby code"),
    ("ruby -e 'p ARGV' -- {prompt}", "may read"),
    ("php -r {prompt}", "would run the prompt as PHP code"),
    ("lua -e 'x' {prompt}", OPTIONS),
    # launchers, whatever they launch
    ("env VAR={prompt} sh -c 'agent'", LAUNCHER),
    ("env -S {prompt}", LAUNCHER),
    ("stdbuf -oL sh -c 'agent' sh {prompt}", LAUNCHER),
    ("setsid bash -c 'agent \"$1\"' sh {prompt}", LAUNCHER),
    ("xargs -I X sh -c 'agent X'", "may start a shell"),
    ("su bob -c 'agent {prompt}'", LAUNCHER),
    ("sudo -u bob agent {prompt}", LAUNCHER),
    ("ssh host agent {prompt}", LAUNCHER),
    ("docker exec box agent {prompt}", LAUNCHER),
    ("nohup agent {prompt}", LAUNCHER),
    ("chroot /srv agent {prompt}", LAUNCHER),
    ("unshare -r agent {prompt}", LAUNCHER),
    ("flock /tmp/l -c 'agent {prompt}'", LAUNCHER),
    ("ionice -c 3 agent {prompt}", LAUNCHER),
    ("taskset 1 agent {prompt}", LAUNCHER),
    ("script -qc 'agent {prompt}'", LAUNCHER),
    ("watch agent {prompt}", LAUNCHER),
    # the prompt on stdin, to a program that reads its program from stdin
    ("sh", STDIN),
    ("bash -s", STDIN),
    ("bash -c", STDIN),
    ("python", STDIN),
    ("python -", STDIN),
    ("python -i agent.py", STDIN),
    ("node -i", STDIN),
    ("env sh", STDIN),
    ("timeout 60 bash", STDIN),
    ("nice -n 5 env python3", STDIN),
    ("env -S 'sh -e'", "hides a command line"),
    ("ssh host", "may start a shell"),
    ("sudo -s", "may start a shell"),
    # programs whose arguments are not parsed, and a placeholder inside an argument
    ("awk {prompt}", OPAQUE),
    ("sed -e 's/a/b/' {prompt}", OPAQUE),
    ("fish -c 'agent $argv' {prompt}", OPAQUE),
    ("pwsh -File agent.ps1 {prompt}", OPAQUE),
    ("sqlite3 db.sqlite", OPAQUE),
    ("make run PROMPT={prompt}", OPAQUE),
    ("my-agent 'Question: {prompt}'", INSIDE),
    ("my-agent -q{prompt}", INSIDE),
    ("my-agent --ask={prompt}{instructions}", INSIDE),
    ("{prompt}", "choose what runs"),
]

SAFE = [
    "my-agent --ask {prompt}",
    "my-agent --ask={prompt}",
    "my-agent -q={prompt} --rules {instructions} --dir {workspace}",
    "my-agent",
    "./my-agent.sh {prompt}",
    "sh my-agent.sh {prompt}",
    "sh -c 'my-agent --ask \"$1\"' sh {prompt}",
    "/bin/dash -ec 'my-agent --ask \"$1\"' sh {prompt}",
    "bash -euo pipefail -c 'my-agent \"$1\" | tail -1' sh {prompt}",
    "bash --norc -c 'my-agent \"$1\"' sh --ask={prompt}",
    "busybox sh -c 'my-agent \"$1\"' sh {prompt}",
    "bash -c 'my-agent'",  # the prompt on stdin, read by the agent
    "python agent.py {prompt}",
    "python3.11 -u -X utf8 agent.py --ask {prompt}",
    "python -m agent {prompt}",
    "python -c 'import sys; print(sys.argv[1])' {prompt}",
    "perl agent.pl {prompt}",
    "perl -Ilib -e 'print @ARGV' -- {prompt}",
    "node agent.js {prompt}",
    "node --title=agent -e 'console.log(process.argv[1])' -- {prompt}",
    "ruby agent.rb {prompt}",
    "timeout 60 my-agent",
    "env AGENT_MODE=fast nice -n 5 python agent.py",
    "codex exec -",
]


@pytest.mark.parametrize(("template", "why"), REFUSED)
def test_a_template_that_could_run_the_prompt_as_code_is_refused(template, why):
    with pytest.raises(CommandTemplateError, match=why) as err:
        parse_template(template)
    assert isinstance(err.value, InputError) and "safe forms: cmd:my-agent" in str(err.value)
    with pytest.raises(ModelSpecError, match=why):
        parse_model_spec(f"cmd:{template}")


@pytest.mark.parametrize("template", SAFE)
def test_the_safe_forms_are_accepted(template):
    assert parse_template(template) == shlex.split(template)
    assert parse_model_spec(f"cmd:{template}").model == template


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/usr/bin/python3.11", "python"),
        ("sh.distrib", "sh"),
        ("/bin/ksh93", "ksh"),
        ("bash-static", "bash"),
        ("pypy3", "pypy"),
        ("my-agent", "my-agent"),
        ("./agent.sh", "agent"),
    ],
)
def test_a_program_is_known_by_its_name_whatever_its_path_or_version(path, name):
    assert program_name(path) == name


# ---- the safe forms, run on hostile prompts ---------------------------------------------------

ECHO = "import sys\nsys.stdout.write(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())\n"


def hostile(marker: Path) -> list[str]:
    """Prompts that run `touch marker` if a shell reads them as code (each one valid shell,
    so a night on an unguarded template runs them all), two of them starting with `-`."""
    m = shlex.quote(str(marker))
    return [
        f"$(touch {m})",
        f"`touch {m}`",
        f"done; touch {m}",
        f"' ; touch {m} ; '",
        f'" && touch {m} && "',
        f"| touch {m}",
        f"x\ntouch {m}",
        f"-e $(touch {m})",
        f"--eval=$(touch {m})",
    ]


def as_options(marker: Path) -> list[str]:
    """Prompts that run code if an interpreter reads them as its own options."""
    return [
        f"-e system(\"touch {marker}\"); require('fs').writeFileSync('{marker}', '')",
        f"-c import pathlib; pathlib.Path('{marker}').touch()",
        f"--eval=require('fs').writeFileSync('{marker}', '')",
    ]


def runnable(tmp_path: Path) -> list[str]:
    script = tmp_path / "echo_agent.py"
    script.write_text(ECHO)
    py, agent = shlex.quote(sys.executable), shlex.quote(str(script))
    forms = [
        'sh -c \'printf "%s" "$1"\' sh {prompt}',
        'bash -euo pipefail -c \'printf "%s" "$1"\' sh {prompt}',
        f"{py} {agent} {{prompt}}",
        f"{py} -c 'import sys; sys.stdout.write(sys.argv[1])' {{prompt}}",
        f"{py} {agent}",  # stdin
        f"timeout 60 {py} {agent}",  # stdin, behind a launcher
    ]
    if shutil.which("perl"):
        forms.append("perl -e 'print $ARGV[0]' -- {prompt}")
    if shutil.which("node"):
        forms.append("node -e 'process.stdout.write(process.argv[1])' -- {prompt}")
    return forms


def test_the_safe_forms_hand_hostile_prompts_over_as_text(tmp_path):
    marker = tmp_path / "PWNED"
    for template in runnable(tmp_path):
        model = load_model(f"cmd:{template}")
        for prompt in hostile(marker) + as_options(marker):
            reply = model.chat([{"role": "user", "content": prompt}], GenerationParams())
            assert reply.text == prompt.strip(), template
        assert not marker.exists(), template


# ---- a night replaying logged traffic on a cmd: agent -------------------------------------------

PROJECT = "app"


def fill_hostile_log(log_path: Path, marker: Path, n: int = 16) -> list[str]:
    """`n` proxied requests (end users' words), each answered and corrected by the operator,
    each holding a way to run `touch marker`."""
    log, payloads = TaskLog(log_path), hostile(marker)
    prompts = [f"{payloads[i % len(payloads)]} #{100 + i}" for i in range(n)]
    for prompt in prompts:
        log.add(
            Interaction(
                messages=[{"role": "user", "content": prompt}],
                reply="UNSOLVED",
                project=PROJECT,
                source="proxy",
                feedback=Feedback(thumb="down", reference="SOLVED"),
            )
        )
    log.close()
    return prompts


@pytest.fixture
def night_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))
    monkeypatch.setattr(cli.out, "width", 250)
    marker = tmp_path / "PWNED"
    prompts = fill_hostile_log(tmp_path / "log.db", marker)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["sleep", "run", "--documents", "skill", *args])
        return result.exit_code, " ".join(result.output.split())

    return marker, prompts, run


def recording_agent(tmp_path: Path) -> tuple[str, Path]:
    """A cmd: agent that writes down each prompt it was given (as JSON) and echoes it."""
    seen = tmp_path / "seen.jsonl"
    script = tmp_path / "recording_agent.py"
    script.write_text(
        "import json, sys\n"
        f"with open({str(seen)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1]) + '\\n')\n"
        "print(sys.argv[1])\n"
    )
    return f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{prompt}}", seen


@pytest.mark.parametrize(
    "template",
    [
        "env sh -c 'echo {prompt}'",
        "/usr/bin/env bash -c 'echo {prompt}'",
        "timeout 60 sh -c 'echo {prompt}'",
        "bash -c -e 'echo {prompt}'",
        "sh.distrib -c 'echo {prompt}'",
    ],
)
def test_a_night_refuses_an_unsafe_template_before_running_anything(tmp_path, night_env, template):
    marker, _, run = night_env
    code, text = run("--model", f"cmd:{template}")  # refused before the opt-in is asked for
    assert code == 2, text
    assert "shell code" in text or "launches another program" in text
    assert not marker.exists() and not list((tmp_path / "home").rglob("report.json"))


def test_a_night_on_a_cmd_agent_needs_the_operators_opt_in(tmp_path, night_env):
    marker, _, run = night_env
    spec, seen = recording_agent(tmp_path)
    code, text = run("--model", spec)
    assert code == 2 and "--allow-cmd-replay" in text and "no sandbox" in text, text
    assert not seen.exists() and not marker.exists()
    # the analyst and the judge are refused the same way (they read the traffic too)
    code, text = run("--model", "http://127.0.0.1:9/v1#m", "--judge-model", spec)
    assert code == 2 and "--judge-model" in text and "--allow-cmd-replay" in text, text
    with pytest.raises(ConfigError, match="allow-cmd-replay"):
        NightConfig(model="local", optimizer_model=spec)


def test_a_night_with_the_opt_in_runs_no_prompt_as_code(tmp_path, night_env):
    from tests.fake_upstream import FakeUpstream

    marker, prompts, run = night_env
    spec, seen = recording_agent(tmp_path)
    with FakeUpstream(canned_analyst().fn) as analyst:
        code, text = run("--model", spec, "--optimizer-model", f"{analyst.base_url}#fake-model",
                         "--allow-cmd-replay")  # fmt: skip
    assert code == 0, text
    assert not marker.exists()
    given = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(given) >= 4 and set(given) <= set(prompts)  # each prompt reached it as text
    assert any("$(touch" in g for g in given) and any(g.startswith("-") for g in given)
    report = json.loads(next((tmp_path / "home").rglob("report.json")).read_text())
    assert report["replay"] == "agent" and report["models"]["target"] == spec


def test_a_cmd_agent_passed_to_run_night_needs_the_opt_in_too(tmp_path):
    marker = tmp_path / "PWNED"
    fill_hostile_log(tmp_path / "log.db", marker)
    spec, seen = recording_agent(tmp_path)
    agent = load_model(spec)
    models = NightModels(agent, "my-agent", ScriptedModel(lambda m: '{"edits": []}'), "analyst")
    config = NightConfig(home=tmp_path / "home", log_path=tmp_path / "log.db")
    with pytest.raises(ConfigError, match="--model 'cmd:"):
        run_night(config, models=models)
    assert not seen.exists()
