"""DSPy as a peer (benchmarks/peers/driver.py): each DSPy optimizer runs end to end against a
scripted OpenAI-compatible server behind the counting proxy, its target calls are cut at the
budget, and what it ships is a selftaught skill that reproduces its program. Needs the peers'
venv (`bash benchmarks/peers/setup.sh`); skipped without it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from counting_proxy import CallCounter, counting_proxy  # noqa: E402

from selftaught.demos import split_skill  # noqa: E402
from selftaught.tasks import load_task  # noqa: E402
from tests.fault_server import FaultServer  # noqa: E402

PEERS_PYTHON = ROOT / "benchmarks" / ".venv-peers" / "bin" / "python"
SPEC = "gym:basic_arithmetic?max_terms=2&max_digits=1"
HINT = "Answer with the number only."

pytestmark = pytest.mark.skipif(
    subprocess.run([str(PEERS_PYTHON), "-c", "import dspy"], capture_output=True).returncode
    if PEERS_PYTHON.exists()
    else True,
    reason="the peers' venv with dspy is not installed (bash benchmarks/peers/setup.sh)",
)


def _dspy_reply(system: str) -> str | None:
    """A reply in the shape DSPy's adapters parse, for the optimizers' own proposers."""
    if "Your output fields are:" not in system:
        return None
    block = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
    names = re.findall(r"\d+\. `(\w+)`", block)
    if "[[ ## completed ## ]]" not in system:  # DSPy's JSON adapter
        return json.dumps({n: HINT for n in names})
    return "".join(f"[[ ## {n} ## ]]\n{HINT}\n\n" for n in names) + "[[ ## completed ## ]]"


def _scripted(references: dict[str, str]):
    """The target answers right only when taught: worked examples as prior turns (demos)
    or the hint in its system prompt (an instruction); otherwise one off."""

    def answer(messages: list[dict]) -> str:
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        fmt = _dspy_reply(system)
        if fmt is not None:
            return fmt
        question = [m["content"] for m in messages if m["role"] == "user"][-1].split("\n\n")[0]
        if question not in references:
            return HINT  # a reflection / proposal prompt of the optimizer
        taught = any(m["role"] == "assistant" for m in messages) or HINT in system
        ref = references[question]
        return ref if taught else f"{ref}0"

    return answer


@pytest.mark.parametrize("system", ["dspy-bfrs", "dspy-mipro", "dspy-gepa"])
def test_a_dspy_optimizer_runs_within_the_budget_and_ships_a_skill(tmp_path, system):
    task = load_task(SPEC, seed=0, train_size=6, val_size=6, test_size=2)
    refs = {e.input: str(e.reference) for s in ("train", "val", "test") for e in task.examples(s)}
    counter = CallCounter()
    with FaultServer(_scripted(refs)) as up, counting_proxy(up.base_url, counter) as root:
        job = {
            "system": system,
            "task": {"spec": SPEC, "seed": 0, "train_size": 6, "val_size": 6, "test_size": 2},
            "examples": {
                s: [
                    {"id": e.id, "input": e.input, "reference": str(e.reference)}
                    for e in task.examples(s)
                ]  # fmt: skip
                for s in ("train", "val")
            },
            "seed": 0,
            "seed_prompt": "You are a helpful assistant.",
            "target_url": f"{root}/target/v1",
            "optimizer_url": f"{root}/optimizer/v1",
            "model_name": "fake-model",
            "budget_calls": 40,
            "epochs": 2,
            "batch_size": 4,
            "minibatch_size": 3,
            "max_tokens": 32,
            "analyst_max_tokens": 64,
            "concurrency": 2,
            "timeout_s": 30,
            "out_dir": str(tmp_path / "run"),
        }
        job_path, result_path = tmp_path / "job.json", tmp_path / "result.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        out = subprocess.run(
            [
                str(PEERS_PYTHON),
                str(ROOT / "benchmarks/peers/driver.py"),
                str(job_path),
                str(result_path),
            ],  # fmt: skip
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(result_path.read_text())
    usage = counter.take()
    assert result["system"] == system and result["version"].startswith("3.")
    if system != "dspy-gepa":  # cut at the 41st target call; GEPA keeps its own count
        assert usage["target"]["calls"] <= 40
    skill = split_skill(result["shipped_prompt"])
    # what it ships teaches the scripted target: demos (as turns) or the hint
    assert skill.demos or HINT in skill.rules, result["shipped_prompt"]
    if skill.demos:
        train = {e.input: str(e.reference) for e in task.examples("train")}
        assert all(d.input in train for d in skill.demos)  # demos come from train only
