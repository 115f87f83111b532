"""The coding agent as the policy: `claude-code`, `codex` and `cmd:` model specs.

The real CLIs (the pinned versions `scripts/install-agent-clis.sh` installs) run against the
scripted upstream (`tests/agent_upstream.py`) with no network: the skill reaches the agent
through CLAUDE.md / AGENTS.md, a refused key and an unknown model stop the run in the agent's
words, a check task is scored on the file the agent wrote with its tool, and no credential
reaches the run directory. `cmd:` runs small Python scripts as the agent."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.errors import ConfigError
from selftaught.models import GenerationParams, RetryPolicy, load_model
from selftaught.models.agents.base import (
    SCRUBBED,
    AgentOutdated,
    agent_environment,
    brief_from_messages,
)
from selftaught.models.agents.settings import AgentSettings
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.models.spec import SPEC_FORMS, ModelSpecError, parse_model_spec
from selftaught.rollout import RolloutConfig
from selftaught.tasks.sandbox import find_bwrap
from tests.agent_upstream import (
    AGENTS,
    AgentUpstream,
    needs_skill,
    one_tool_then_answer,
    point_clis,
    sandbox_ready,
    with_cli,
)

KEY = "sk-test-agent-key-5f3a9c1e7b"  # must never reach a file selftaught writes
MARKER = "MARKER-AGENT-7Q"
UNSAFE_ARGS = ["--unsafe-exec"] if find_bwrap() is None else []


def chat(model, messages, **params):
    return model.chat(messages, GenerationParams(**params))


def script_spec(tmp_path: Path, source: str, args: str = "", name: str = "agent.py") -> str:
    script = tmp_path / name
    script.write_text(source)
    return f"cmd:{shlex.quote(sys.executable)} {shlex.quote(str(script))} {args}".strip()


def qa_task(tmp_path: Path, n: int = 2, **extra) -> Path:
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": f"q{i}", "input": f"Question {i}: is it solved?", "reference": "SOLVED"}
        | {"split": "test"}
        | extra
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_eval(tasks: Path, model: str, out: Path, *extra: str):
    result = CliRunner().invoke(
        app,
        ["eval", "--task", f"jsonl:{tasks}", "--model", model, "--split", "test"]
        + ["--output", str(out), "--concurrency", "2", *extra],
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return result, rows


@pytest.fixture
def upstream_env(monkeypatch, tmp_path):
    """Point both CLIs at a scripted upstream, with KEY as their API key."""
    return point_clis(monkeypatch, tmp_path, KEY)


# ---- specs -------------------------------------------------------------------------------


def test_agent_specs_parse_and_are_listed():
    assert parse_model_spec("claude-code").backend == "claude-code"
    assert parse_model_spec("claude-code:claude-sonnet-4-5").model == "claude-sonnet-4-5"
    assert parse_model_spec("codex:gpt-5-codex").model == "gpt-5-codex"
    spec = parse_model_spec("cmd:my-agent --ask {prompt}")
    assert (spec.backend, spec.model) == ("cmd", "my-agent --ask {prompt}")
    assert any(f.startswith("claude-code") for f in SPEC_FORMS)
    with pytest.raises(ModelSpecError) as err:
        parse_model_spec("claude")
    for form in ("claude-code[:MODEL]", "codex[:MODEL]", "cmd:TEMPLATE"):
        assert form in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cmd:", "needs a command"),
        ("cmd:agent 'unclosed", "cannot be split"),
        ("cmd:sh -c 'my-agent {prompt}'", "would run the prompt as shell code"),
        ("cmd:bash -lc 'echo {instructions}'", "would run the prompt as shell code"),
        ("claude-code:", "needs a model name"),
    ],
)
def test_bad_agent_specs_are_refused(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        parse_model_spec(spec)


def test_a_prompt_passed_to_a_shell_as_an_argument_is_data(tmp_path):
    # the safe form: the script reads "$1"; quotes and $(...) in the prompt stay text
    model = load_model('cmd:sh -c \'printf "%s" "$1"\' sh {prompt}')
    tricky = 'it\'s "$(touch pwned)"; `id` & echo $HOME'
    assert chat(model, [{"role": "user", "content": tricky}]).text == tricky
    assert not Path("pwned").exists()


def test_a_response_cache_is_refused_for_agents(tmp_path):
    with pytest.raises(ConfigError, match="cannot serve 'codex'"):
        load_model("codex", cache_path=tmp_path / "cache.db")


# ---- what the agent reads ----------------------------------------------------------------


def test_system_and_worked_examples_go_to_the_instruction_file():
    brief = brief_from_messages(
        [
            {"role": "system", "content": "Rule: answer in one word.\n\n## Memory\nuser likes tea"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "Capital of France?"},
        ]
    )
    assert brief.prompt == "Capital of France?"
    assert brief.instructions.startswith("Rule: answer in one word.\n\n## Memory\nuser likes tea")
    assert "## Worked examples\nExample 1:\nInput: 2+2?\nReply: 4" in brief.instructions
    with pytest.raises(ConfigError, match="brings its own tools"):
        brief_from_messages([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])


def test_cmd_agent_reads_the_skill_from_agents_md_end_to_end(tmp_path):
    agent = """\
import pathlib, sys
rules = pathlib.Path("AGENTS.md").read_text() if pathlib.Path("AGENTS.md").exists() else ""
print("SOLVED" if "MARKER-AGENT-7Q" in rules and "Example 1:" in rules else "UNSOLVED")
"""
    model = script_spec(tmp_path, agent)
    tasks = qa_task(tmp_path)
    skill = tmp_path / "skill.md"
    skill.write_text(
        f"Remember {MARKER}.\n\n<!-- selftaught:demos placement=turns -->\n"
        '{"id": "d1", "input": "Is 1 solved?", "reply": "SOLVED", "source": "reference"}\n'
        "<!-- /selftaught:demos -->\n"
    )
    result, rows = run_eval(tasks, model, tmp_path / "with.jsonl", "--skill", str(skill))
    assert result.exit_code == 0, result.output
    assert [r["score"]["hard"] for r in rows] == [1.0, 1.0]
    assert rows[0]["agent"]["cli"] == "cmd" and rows[0]["stop"] == "answer"
    result, rows = run_eval(tasks, model, tmp_path / "without.jsonl")
    assert result.exit_code == 0, result.output
    assert [r["score"]["hard"] for r in rows] == [0.0, 0.0]


# ---- running the process -----------------------------------------------------------------


def test_a_timeout_kills_the_agent_and_what_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    agent = f"""\
import subprocess, time
child = subprocess.Popen(["sleep", "300"])
open({str(pid_file)!r}, "w").write(str(child.pid))
time.sleep(300)
"""
    model = load_model(
        script_spec(tmp_path, agent), timeout_s=2.0, retry=RetryPolicy(max_retries=0)
    )
    t0 = time.monotonic()
    with pytest.raises(TransientBackendError, match="timed out after 2s"):
        chat(model, [{"role": "user", "content": "go"}])
    assert time.monotonic() - t0 < 15
    assert gone(int(pid_file.read_text()))  # killed with the agent's process group


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """The process has exited (reaped, or a zombie waiting for its new parent)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_exit_75_is_retried_in_a_clean_workspace_and_other_failures_stop(tmp_path):
    tries = tmp_path / "tries"
    agent = f"""\
import pathlib, sys
tries = pathlib.Path({str(tries)!r})
n = int(tries.read_text()) + 1 if tries.exists() else 1
tries.write_text(str(n))
leftover = pathlib.Path("scratch.txt").exists()
pathlib.Path("scratch.txt").write_text("x")
if n == 1:
    print("busy, try later", file=sys.stderr)
    sys.exit(75)
print(f"attempt {{n}}, leftover from the first: {{leftover}}")
"""
    model = load_model(script_spec(tmp_path, agent), retry=RetryPolicy(base_delay_s=0.01))
    c = chat(model, [{"role": "user", "content": "go"}])
    assert (c.text, c.retries) == ("attempt 2, leftover from the first: False", 1)
    assert c.extra["agent"]["files_changed"] == ["A scratch.txt (+1)"]

    crash = script_spec(tmp_path, "import sys; print('bad flag --x', file=sys.stderr); sys.exit(2)")
    with pytest.raises(FatalBackendError, match="exited with status 2: bad flag --x"):
        chat(
            load_model(crash, retry=RetryPolicy(base_delay_s=0.01)),
            [{"role": "user", "content": "go"}],
        )


def test_the_agent_sees_its_own_settings_only_and_secrets_are_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-never-passed-123")
    monkeypatch.setenv("MY_TOOL_HOME", "/opt/tool")
    monkeypatch.setenv("SELFTAUGHT_AGENT_ENV", "MY_TOOL_HOME")
    agent = "import json, os; print(json.dumps(dict(os.environ)))"
    model = load_model(script_spec(tmp_path, agent))
    c = chat(model, [{"role": "user", "content": "env"}])
    seen = json.loads(c.text)
    assert seen["ANTHROPIC_API_KEY"] == SCRUBBED  # it had the key; the recorded reply does not
    assert KEY not in c.text and KEY not in json.dumps(c.extra)
    assert "AWS_SECRET_ACCESS_KEY" not in seen
    assert seen["MY_TOOL_HOME"] == "/opt/tool"
    home = Path(seen["HOME"])
    assert home != Path.home() and home.parent == AgentSettings().homes_dir
    assert not home.exists()  # the per-run home is gone with the run
    assert agent_environment({"PATH": "/bin", "GITHUB_TOKEN": "x"}) == {"PATH": "/bin"}


def test_concurrent_runs_are_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_AGENT_CONCURRENCY", "2")
    log = tmp_path / "log"
    agent = f"""\
import os, time
with open({str(log)!r}, "a") as f:
    f.write(f"start {{time.monotonic()}}\\n")
time.sleep(0.4)
with open({str(log)!r}, "a") as f:
    f.write(f"end {{time.monotonic()}}\\n")
print("done", os.getcwd())
"""
    model = load_model(script_spec(tmp_path, agent))

    async def six() -> list:
        msgs = [{"role": "user", "content": "go"}]
        return await asyncio.gather(*(model.achat(msgs, GenerationParams()) for _ in range(6)))

    replies = asyncio.run(six())
    assert len({r.text for r in replies}) == 6  # six workspaces
    events = sorted(
        (float(t), 1 if kind == "start" else -1)
        for kind, t in (line.split() for line in log.read_text().splitlines())
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2


def test_a_task_with_tools_is_refused(tmp_path):
    model = load_model(script_spec(tmp_path, "print('x')"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with pytest.raises(ConfigError, match="brings its own tools"):
        chat(model, [{"role": "user", "content": "go"}], tools=tools)


# ---- install errors ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", AGENTS)
def test_a_missing_cli_is_exit_1_naming_what_to_install(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("SELFTAUGHT_AGENT_CLIS", str(tmp_path / "empty"))
    monkeypatch.setenv("SELFTAUGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.chdir(tmp_path)
    result, _ = run_eval(qa_task(tmp_path), kind, tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output
    package = {"claude-code": "@anthropic-ai/claude-code@2.1.328", "codex": "@openai/codex@0.169.0"}
    assert f"npm install --prefix {tmp_path / 'empty'} {package[kind]}" in result.output
    assert "scripts/install-agent-clis.sh" in result.output


def test_an_outdated_cli_is_refused_in_one_sentence(tmp_path, monkeypatch):
    bin_dir = tmp_path / "clis" / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "codex").write_text("#!/bin/sh\necho 'codex-cli 0.98.0'\n")
    (bin_dir / "codex").chmod(0o755)
    monkeypatch.setenv("SELFTAUGHT_AGENT_CLIS", str(tmp_path / "clis"))
    model = load_model("codex")
    with pytest.raises(FatalBackendError) as err:
        chat(model, [{"role": "user", "content": "hi"}])
    assert "Codex 0.98.0" in str(err.value) and "older than 0.169.0" in str(err.value)
    assert err.value.exit_code == 1 and isinstance(err.value, AgentOutdated)


# ---- the real CLIs against the scripted upstream -----------------------------------------


@pytest.mark.parametrize("kind", with_cli())
def test_the_skill_reaches_the_real_agent(tmp_path, upstream_env, kind):
    tasks = qa_task(tmp_path)
    skill = tmp_path / "skill.md"
    skill.write_text(f"Always check {MARKER} before answering.\n")
    with AgentUpstream(needs_skill(MARKER)) as up:
        upstream_env(up)
        result, rows = run_eval(tasks, kind, tmp_path / "with.jsonl", "--skill", str(skill))
        assert result.exit_code == 0, result.output
        assert [r["score"]["hard"] for r in rows] == [1.0, 1.0]
        file = {"claude-code": "CLAUDE.md", "codex": "AGENTS.md"}[kind]
        assert any(file in r.context() and MARKER in r.context() for r in up.requests_seen)
        result, rows = run_eval(tasks, kind, tmp_path / "without.jsonl")
        assert result.exit_code == 0, result.output
        assert [r["score"]["hard"] for r in rows] == [0.0, 0.0]
        assert [r["reply"] for r in rows] == ["UNSOLVED", "UNSOLVED"]
    assert rows[0]["agent"]["cli"] == kind and rows[0]["prompt_tokens"] > 0


@pytest.mark.parametrize("kind", with_cli())
def test_a_check_task_scores_the_file_the_real_agent_wrote(tmp_path, upstream_env, kind):
    path = tmp_path / "write.jsonl"
    check = ["python", "-c", "assert open('answer.txt').read().strip() == '42'"]
    line = {"id": "w", "input": "Write 42 into answer.txt.", "check": check, "split": "test"}
    path.write_text(json.dumps(line) + "\n")
    with AgentUpstream(one_tool_then_answer("echo 42 > answer.txt && echo written")) as up:
        upstream_env(up)
        result, rows = run_eval(path, kind, tmp_path / "out.jsonl", *UNSAFE_ARGS)
    assert result.exit_code == 0, result.output
    (row,) = rows
    assert row["score"]["hard"] == 1.0
    assert row["reply"].startswith("tool said: ") and row["reply"].endswith("written")
    assert row["agent"]["files_changed"] == ["A answer.txt (+1)"]
    assert row["tool_calls"] == 1 and row["turns"] == 2 and row["stop"] == "answer"
    call = row["trajectory"][0]["tool_calls"][0]["function"]
    assert call["name"] in ("Bash", "exec_command") and "answer.txt" in call["arguments"]
    assert row["trajectory"][1]["role"] == "tool" and "written" in row["trajectory"][1]["content"]
    assert "turns / tool calls per episode" in result.output


@pytest.mark.parametrize("kind", with_cli())
def test_a_refused_key_stops_the_run_in_the_agents_words(tmp_path, upstream_env, kind):
    with AgentUpstream(needs_skill(MARKER), api_key="the-right-key") as up:
        upstream_env(up, key="a-wrong-key-123456")
        t0 = time.monotonic()
        result, rows = run_eval(qa_task(tmp_path, 1), kind, tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output
    assert "HTTP 401: the API key was refused" in result.output
    words = {"claude-code": "Failed to authenticate", "codex": "401 Unauthorized"}[kind]
    assert words in result.output
    assert time.monotonic() - t0 < 60  # stopped, not retried for minutes


@pytest.mark.parametrize("kind", with_cli())
def test_an_unknown_model_stops_the_run(tmp_path, upstream_env, kind):
    with AgentUpstream(needs_skill(MARKER)) as up:
        upstream_env(up)
        up.faults.extend(["404"] * 4)  # how an endpoint answers a model it does not serve
        result, _ = run_eval(qa_task(tmp_path, 1), f"{kind}:no-such-model", tmp_path / "o.jsonl")
    assert result.exit_code == 1, result.output
    assert "HTTP 404: model or endpoint not found" in result.output


@pytest.mark.parametrize("kind", with_cli())
def test_no_credential_reaches_the_run_directory(tmp_path, upstream_env, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # the agent's tool prints its whole environment, key included, into the trajectory
    with AgentUpstream(one_tool_then_answer("env; echo done")) as up:
        upstream_env(up)
        result, rows = run_eval(qa_task(tmp_path, 1), kind, run_dir / "eval.jsonl")
    assert result.exit_code == 0, result.output
    assert "done" in rows[0]["trajectory"][1]["content"]
    for file in run_dir.rglob("*"):
        if file.is_file():
            assert KEY not in file.read_text(errors="replace"), file
    assert KEY not in result.output


@pytest.mark.parametrize("kind", with_cli(("claude-code",)))
def test_claude_codes_reported_cost_is_charged_to_the_usd_budget(tmp_path, upstream_env, kind):
    from selftaught.models.usage import Budget, BudgetExhausted, TrackedModel, UsageLedger

    ask = [{"role": "user", "content": "Question 1: is it solved?"}]
    with AgentUpstream(needs_skill(MARKER)) as up:
        upstream_env(up)
        agent = load_model(kind)
        Budget(usd=1.0).check_priced([agent.name])  # its cost is known: it reports it
        first = UsageLedger()
        reply = chat(TrackedModel(agent, first, "target"), ask)
        cost = reply.extra["agent"]["total_cost_usd"]
        assert cost > 0 and first.to_dict()["target"]["usd"] == pytest.approx(cost)
        # a budget of one and a half runs: the second run starts, the third is refused
        ledger = UsageLedger(budget=Budget(usd=1.5 * cost))
        tracked = TrackedModel(agent, ledger, "target")
        chat(tracked, ask)
        chat(tracked, ask)
        with pytest.raises(BudgetExhausted, match="spent"):
            chat(tracked, ask)
    assert ledger.to_dict()["target"]["calls"] == 2
    assert ledger.to_dict()["target"]["usd"] == pytest.approx(2 * cost)


def test_an_agents_cost_is_what_it_reported_else_its_tokens_at_its_models_price():
    from selftaught.models.base import Completion
    from selftaught.models.usage import Budget, call_usd

    said = Completion(
        "ok", 1000, 10, extra={"agent": {"cli": "claude-code", "total_cost_usd": 0.2}}
    )
    assert call_usd("claude-code:sonnet", said, 1000) == 0.2
    tokens = Completion("ok", 1_000_000, 0, extra={"agent": {"cli": "codex"}})
    assert call_usd("codex:gpt-4.1-mini", tokens, 1_000_000) == pytest.approx(0.40)
    assert call_usd("codex", tokens, 1_000_000) is None  # Codex says no cost, no model named
    with pytest.raises(ConfigError, match="unknown: codex"):
        Budget(usd=1.0).check_priced(["claude-code", "codex"])


def test_what_the_agent_did_reaches_the_analyst_and_the_report_rows(tmp_path):
    from selftaught.evaluation import rollout_row
    from selftaught.policy import Policy
    from selftaught.rollout import attempt_text, run_rollouts
    from selftaught.tasks.jsonl import JsonlTask

    agent = "import pathlib; pathlib.Path('notes.txt').write_text('a\\nb\\n'); print('noted')"
    task = JsonlTask(qa_task(tmp_path, 1))
    model = load_model(script_spec(tmp_path, agent))
    (r,) = run_rollouts(model, Policy(), task, task.examples("test"), RolloutConfig(progress=False))
    assert r.is_episode and r.agent["files_changed"] == ["A notes.txt (+2)"]
    assert rollout_row(r)["trajectory"] == ["files changed: A notes.txt (+2)", "answer: noted"]
    assert attempt_text(r, 400).endswith("answer: noted")


# ---- the embedded model behind an agent ---------------------------------------------------

# Codex 0.169.0 refuses `wire_api = "chat"` ("no longer supported") and Claude Code speaks
# Anthropic Messages only, while `selftaught serve` speaks chat completions: so the agent here
# is a tiny CLI agent of our own behind `cmd:`, reading AGENTS.md like the real ones, calling
# the embedded model's endpoint, and using one "tool" (writing its answer into a file).
TINY_AGENT = """\
import json, pathlib, sys, urllib.request
url, model = sys.argv[1], sys.argv[2]
prompt = sys.stdin.read()
rules = pathlib.Path("AGENTS.md").read_text() if pathlib.Path("AGENTS.md").exists() else ""
messages = ([{"role": "system", "content": rules}] if rules else []) + [
    {"role": "user", "content": prompt}
]
body = {"model": model, "messages": messages, "max_tokens": 24, "temperature": 0}
request = urllib.request.Request(
    url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
)
reply = json.load(urllib.request.urlopen(request, timeout=300))["choices"][0]["message"]
text = (reply.get("content") or "").strip() or "(nothing)"
pathlib.Path("answer.txt").write_text(text + "\\n")
print(text)
"""


@pytest.mark.slow
@pytest.mark.local
def test_the_embedded_model_behind_an_agent(tmp_path):
    import socket
    import subprocess
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "selftaught", "serve", "--model", "local", "--port", str(port)]
        + ["--name", "smol"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "selftaught serve did not come up"
                time.sleep(0.5)
        path = tmp_path / "sum.jsonl"
        check = ["python", "-c", "assert open('answer.txt').read().split()[0] == '5'"]
        rows = [
            {"id": f"s{i}", "input": q, "check": check, "split": "test"}
            for i, q in enumerate(["What is 2 + 3? Answer with the number.", "2 plus 3 is?"])
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        skill = tmp_path / "skill.md"
        skill.write_text("Answer with the number only.\n")
        model = script_spec(tmp_path, TINY_AGENT, f"http://127.0.0.1:{port}/v1 smol")
        result, out = run_eval(path, model, tmp_path / "out.jsonl", "--skill", str(skill))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.exit_code == 0, result.output
    assert [r["error"] for r in out] == [None, None]  # the path ran; the answers may be bad
    for row in out:
        assert row["reply"] and row["score"]["hard"] in (0.0, 1.0)
        assert row["agent"]["files_changed"][0].startswith("A answer.txt (+")


@pytest.mark.skipif(not sandbox_ready(), reason="the agents' sandboxes need bubblewrap and socat")
@pytest.mark.parametrize("kind", with_cli())
def test_the_agents_commands_write_in_their_workspace_only(tmp_path, upstream_env, kind):
    outside = Path.home() / ".cache" / "selftaught" / f"escape-{os.getpid()}-{kind}"
    command = f"echo in > inside.txt; touch {outside}; echo done"
    try:
        with AgentUpstream(one_tool_then_answer(command)) as up:
            upstream_env(up)
            model = load_model(kind)
            c = chat(model, [{"role": "user", "content": "go"}])
        assert c.extra["agent"]["files_changed"] == ["A inside.txt (+1)"]
        assert not outside.exists()
        said = c.extra["trajectory"][1]["content"]
        assert "Read-only file system" in said or "Permission denied" in said
    finally:
        outside.unlink(missing_ok=True)


@pytest.mark.parametrize("kind", with_cli(["claude-code"]))
def test_claude_code_without_its_sandbox_stops_the_run(tmp_path, upstream_env, monkeypatch, kind):
    bare_path = tmp_path / "bin"  # no bwrap, no socat on this PATH
    bare_path.mkdir()
    for tool in ("sh", "bash"):
        (bare_path / tool).symlink_to(f"/bin/{tool}")
    with AgentUpstream(needs_skill(MARKER)) as up:
        upstream_env(up)
        monkeypatch.setenv("PATH", str(bare_path))
        monkeypatch.setenv("SELFTAUGHT_CLAUDE_SANDBOX", "1")
        model = load_model(kind, retry=RetryPolicy(base_delay_s=0.01))
        with pytest.raises(FatalBackendError, match="Claude Code did not start: .*[Ss]andbox"):
            chat(model, [{"role": "user", "content": "go"}])
        assert up.requests_seen == []  # refused before any request
        monkeypatch.setenv("SELFTAUGHT_CLAUDE_SANDBOX", "0")  # the user's explicit choice
        assert chat(load_model(kind), [{"role": "user", "content": "go"}]).text == "UNSOLVED"


@pytest.mark.parametrize("kind", with_cli(["claude-code"]))
def test_claude_codes_file_tools_write_in_its_workspace_only(tmp_path, upstream_env, kind):
    # measured with 2.1.328: `--allowedTools Edit,Write` let Write create a file anywhere;
    # `Edit(./**)` keeps it in the workspace, and a denied tool ends the run cleanly
    from tests.agent_upstream import Call

    outside = Path.home() / ".cache" / "selftaught" / f"escape-write-{os.getpid()}"
    steps = [
        Call("Write", {"file_path": str(outside), "content": "x"}),
        Call("Write", {"file_path": "inside.txt", "content": "in"}),
    ]

    def policy(request):
        done = len(request.tool_results)
        return steps[done] if done < len(steps) else "done"

    try:
        with AgentUpstream(policy) as up:
            upstream_env(up)
            c = chat(load_model(kind), [{"role": "user", "content": "go"}])
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    assert c.text == "done"
    assert c.extra["agent"]["files_changed"] == ["A inside.txt (+1)"]
    assert c.extra["agent"]["permission_denials"] == 1
    assert "Permission to use Write has been denied" in c.extra["trajectory"][1]["content"]


def test_a_skill_packages_files_reach_the_agent_under_dot_skill(tmp_path):
    from selftaught.skill_package import PackageFile, join_files

    agent = """\
import json, os, pathlib
files = sorted(str(p) for p in pathlib.Path(".skill").rglob("*") if p.is_file())
modes = {f: os.access(f, os.X_OK) for f in files}
print(json.dumps({"modes": modes, "rules": pathlib.Path("AGENTS.md").read_text()}))
"""
    skill = join_files(
        "Run scripts/run.sh first.\n",
        [PackageFile("scripts/run.sh", "echo hi\n", True), PackageFile("references/a.md", "A\n")],
    )
    model = load_model(script_spec(tmp_path, agent))
    c = chat(model, [{"role": "system", "content": skill}, {"role": "user", "content": "go"}])
    seen = json.loads(c.text)
    assert seen["modes"] == {".skill/references/a.md": False, ".skill/scripts/run.sh": True}
    assert seen["rules"].startswith("Run scripts/run.sh first.\n\n## The skill's files\n")
    assert "`.skill/scripts/run.sh`" in seen["rules"] and "selftaught:file" not in seen["rules"]
    assert c.extra["agent"]["files_changed"] == []  # placed before the run, not its work
