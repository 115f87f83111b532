"""SkillTrainer end to end with scripted models: known gate decisions, artifacts, the val
cache, bad analyst output, fail-closed overlap, fatal errors, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selftaught.gate import GateConfig
from selftaught.models.base import Completion
from selftaught.models.errors import FatalBackendError
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.tasks.base import TaskError
from tests.scripted import (
    POISON,
    ScriptedModel,
    ToyTask,
    append,
    canned_analyst,
    edits_json,
    fatal,
    rule_answer,
    rule_target,
    schedule_of_rules,
    system_of,
    user_of,
)

RULES = ("rule delta", "rule alpha", POISON, "rule gamma")
EXPECTED = ["accept", "accept_new_best", "reject", "accept_new_best"]
ROOT = Path(__file__).resolve().parents[1]


def make(tmp: Path, target=None, analyst=None, **cfg) -> SkillTrainer:
    # The scripted decisions are designed around the margin gate (a 6-item val set is too
    # small for the default paired test).
    # rules only: these scripts test the reflection loop (demos have their own tests)
    defaults = {
        "epochs": 2,
        "batch_size": 4,
        "concurrency": 4,
        "gate": GateConfig(),
        "demos_max": 0,
        "pool": False,
    }
    config = SkillOptConfig(**{**defaults, **cfg})
    return SkillTrainer(
        config,
        ToyTask(),
        target or rule_target(),
        analyst or canned_analyst(failure=schedule_of_rules(*RULES)),
        "# Skill\n",
        output_dir=tmp,
        progress=False,
    )


def decisions(run: Path) -> list[str]:
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(len(rows)))  # contiguous, no duplicates
    return [r["gate"]["decision"] for r in rows[1:]]


def test_known_gate_decisions_and_every_artifact(tmp_path):
    analyst = canned_analyst(failure=schedule_of_rules(*RULES))
    result = make(tmp_path, analyst=analyst).train()
    assert decisions(tmp_path) == EXPECTED
    # delta alone is +1 val item: accepted as current, not shipped as best (margin > 1)
    best = (tmp_path / "best_skill.md").read_text()
    assert best == "# Skill\nrule delta\nrule alpha\nrule gamma\n" == result.best_skill
    assert result.best_version == "v0004"
    assert result.val_initial.solved == 0 and result.val_best.solved == 8
    test = json.loads((tmp_path / "test_results.json").read_text())
    assert test["initial"]["solved"] == 0 and test["best"]["solved"] == 7
    assert test["paired"]["wins"] == 7 and test["paired"]["sign_test_p"] < 0.01
    assert test["best"]["hard_ci"][0] > 0.3
    for name in (
        "config.json",
        "state.json",
        "summary.json",
        "current_skill.md",
        "README.txt",
        "val_cache.json",
        "test_rollouts.jsonl",
    ):
        assert (tmp_path / name).exists(), name
    assert sorted(p.name for p in (tmp_path / "skills").iterdir()) == [
        f"v000{i}.md" for i in range(5)
    ]
    diag = json.loads((tmp_path / "diagnostics" / "step_0003.json").read_text())
    assert diag["gate"]["decision"] == "reject"
    assert diag["analyst_calls"][0]["raw_reply"] and diag["edit_reports"][0]["status"] == "applied"
    assert all(set(v) >= {"id", "reply_head", "hard", "soft", "why"} for v in diag["val"])
    assert any("rule" in (v["why"] or "") for v in diag["val"])
    # the rejected edit is in the buffer and the analyst saw it at the next step
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["rejected"][0]["content"] == POISON
    step4_prompts = [user_of(m) for m in analyst.calls if "## Failed attempts" in user_of(m)]
    assert POISON in step4_prompts[-1].split("## Edits already tried", 1)[1]
    row = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[4])
    assert row["edits"]["applied"] == 1 and row["usage"]["target"]["calls"] > 0
    assert row["usage"]["optimizer"]["calls"] >= 1 and row["val"]["hard_ci"]
    # every call is counted, the analyst's too
    assert result.usage["optimizer"]["calls"] == len(analyst.calls)
    assert result.analyst.rate() == 1.0


def test_strict_gate_ships_the_one_item_gain(tmp_path):
    make(tmp_path, gate=GateConfig(margin=0.0)).train()
    assert decisions(tmp_path)[0] == "accept_new_best"


def test_unchanged_skill_is_never_re_evaluated(tmp_path):
    def flip(messages):
        skill = user_of(messages).split("<skill>", 1)[1].split("</skill>", 1)[0]
        old, new = ("use A", "use B") if "use A" in skill else ("use B", "use A")
        return edits_json({"op": "replace", "target": old, "content": new})

    target = rule_target()
    trainer = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4, reflect_on_successes=False),
        ToyTask(),
        target,
        canned_analyst(failure=flip),
        "# Skill\n- use A\n",
        output_dir=tmp_path,
        progress=False,
    )
    trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["val_cached"] for r in rows[1:]] == [False, True]  # step 2 is the initial text
    val_inputs = {e.input for e in ToyTask().examples("val")}
    val_calls = [m for m in target.calls if user_of(m).split("\n\n")[0] in val_inputs]
    n_val = len(val_inputs)
    assert len(val_calls) == 2 * n_val  # baseline + step 1 only, not step 2


def test_bad_analyst_output_rejects_and_never_crashes(tmp_path):
    analyst = canned_analyst(
        failure="Add a rule about tens!", success="{not json", repair="still not json"
    )
    result = make(tmp_path, analyst=analyst).train()
    assert decisions(tmp_path) == ["reject"] * 4
    assert result.analyst.rate() == 0.0 and result.best_version == "v0000"
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert diag["gate"]["reason"].startswith("empty patch")
    call = diag["analyst_calls"][0]
    assert call["status"] == "invalid_json" and call["raw_reply"] == "Add a rule about tens!"
    assert call["repair_reply"] == "still not json"
    assert not (tmp_path / "skills" / "v0001.md").exists()  # nothing to evaluate

    # edits whose target is not found: reported per edit, the step rejects
    miss = canned_analyst(failure=edits_json({"op": "replace", "target": "nope", "content": "x"}))
    make(tmp_path / "miss", analyst=miss).train()
    diag = json.loads((tmp_path / "miss" / "diagnostics" / "step_0001.json").read_text())
    assert diag["edit_reports"][0]["status"] == "target_not_found"
    assert diag["gate"]["decision"] == "reject"


def test_overlapping_validation_fails_closed(tmp_path):
    target = rule_target()
    trainer = SkillTrainer(
        SkillOptConfig(), ToyTask(overlap=True), target, output_dir=tmp_path, progress=False
    )
    with pytest.raises(TaskError, match="overlaps training"):
        trainer.train()
    assert target.calls == [] and not (tmp_path / "history.jsonl").exists()


def strip_volatile(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    for r in rows:
        for k in ("time_s", "step_time_s", "usage"):
            r.pop(k, None)
    return rows


def test_fatal_backend_error_stops_with_cause_and_resumes(tmp_path):
    make(tmp_path / "ref").train()
    target = rule_target()
    target.fail_at[40] = fatal("401 Incorrect API key provided")  # inside step 2
    with pytest.raises(FatalBackendError, match="401"):
        make(tmp_path / "run", target=target).train()
    err = json.loads((tmp_path / "run" / "error.json").read_text())
    assert "401" in err["cause"] and err["after_step"] >= 0
    assert not (tmp_path / "run" / "summary.json").exists()
    make(tmp_path / "run").train()  # same settings: resumes
    assert not (tmp_path / "run" / "error.json").exists()
    assert strip_volatile(tmp_path / "run") == strip_volatile(tmp_path / "ref")


@pytest.mark.parametrize("kill_at", [3, 12, 27, 45, 60])
def test_resume_after_interrupt_at_any_call(tmp_path, kill_at):
    make(tmp_path / "ref").train()
    target = rule_target()
    target.fail_after, target.interrupt = kill_at, RuntimeError("killed")
    with pytest.raises(RuntimeError, match="killed"):
        make(tmp_path / "run", target=target).train()
    result = make(tmp_path / "run").train()
    assert strip_volatile(tmp_path / "run") == strip_volatile(tmp_path / "ref")
    assert result.best_version == "v0004"


def test_kill_between_state_and_history_loses_nothing(tmp_path):
    make(tmp_path).train()
    hist = tmp_path / "history.jsonl"
    lines = hist.read_text().splitlines(keepends=True)
    hist.write_text("".join(lines[:-1]) + lines[-1][:10])  # torn last row
    make(tmp_path).train()
    assert len(decisions(tmp_path)) == 4


def test_changed_settings_refuse_to_resume(tmp_path):
    from selftaught.errors import ConfigError

    make(tmp_path).train()
    with pytest.raises(ConfigError, match="batch_size"):
        make(tmp_path, batch_size=2).train()


SLOW_RUN = """
import sys, time
sys.path.insert(0, {root!r})
from tests.scripted import *
from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
slow = lambda fn: (lambda m: (time.sleep(0.02), fn(m))[1])
target = ScriptedModel(slow(rule_answer), "scripted-target")
analyst = canned_analyst(failure=schedule_of_rules(*{rules!r}))
cfg = SkillOptConfig(epochs=2, batch_size=4, concurrency=4, gate=GateConfig(),
                     demos_max=0, pool=False)
SkillTrainer(cfg, ToyTask(), target, analyst, "# Skill\\n", output_dir={out!r},
             progress=False).train()
"""


def test_resume_after_sigkill(tmp_path):
    make(tmp_path / "ref").train()
    out = tmp_path / "run"
    code = SLOW_RUN.format(root=str(ROOT), rules=RULES, out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    hist = out / "history.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if hist.exists() and len(hist.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    make(out).train()
    assert strip_volatile(out) == strip_volatile(tmp_path / "ref")


def test_budget_ends_the_run_cleanly_and_a_bigger_budget_resumes(tmp_path):
    from selftaught.models.usage import Budget

    # baseline val (11 calls) + step 1 (4 rollouts, 1 reflection, 11 val) = 27 calls; step 2
    # starts and runs out: it is dropped, the best skill so far ships and is tested apart
    result = make(tmp_path, budget=Budget(calls=30)).train()
    assert result.steps == 1 and str(result.stopped_by).startswith("budget (30 of 30 calls")
    assert result.llm_calls + sum(u["errors"] for u in result.usage.values()) == 30
    assert result.test.best.n == len(ToyTask().examples("test"))
    assert result.test_usage["target"]["calls"] > 0  # reported apart, outside the budget
    assert decisions(tmp_path) == EXPECTED[:1]
    # the same directory with a larger budget continues from step 1, nothing redone
    result = make(tmp_path, budget=Budget(calls=1000)).train()
    assert result.stopped_by is None and decisions(tmp_path) == EXPECTED


def test_budget_too_small_for_the_baseline_is_refused_up_front(tmp_path):
    from selftaught.models.usage import Budget

    with pytest.raises(ValueError, match="cannot cover even the baseline"):
        make(tmp_path, budget=Budget(calls=3)).train()
    assert not (tmp_path / "history.jsonl").exists()


class CoinTarget(ScriptedModel):
    """Sampled attempts: right when its seed is even, unless the skill holds 'rule steady'
    (then always right); greedy calls follow the rule target."""

    def __init__(self):
        super().__init__(rule_answer, "coin-target")
        self.seeds: dict[str, list[int]] = {}  # question -> seeds of its sampled attempts

    async def achat(self, messages, params):
        if params.temperature > 0:
            self.seeds.setdefault(user_of(messages), []).append(params.seed)
        if params.temperature == 0 or "rule steady" in system_of(messages):
            return await super().achat(messages, params)
        reply = rule_answer([{"role": "system", "content": "rule alpha rule beta"}, *messages])
        if params.seed % 2:
            reply = "Answer: -1"
        self.calls.append(messages)
        return Completion(text=reply, model=self.name)


def test_rollouts_k_reflects_on_the_contrast_between_attempts(tmp_path):
    target = CoinTarget()
    analyst = canned_analyst(contrast=edits_json(append("rule steady")))
    result = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4, rollouts_k=4, reflect_on_successes=False),
        ToyTask(),
        target,
        analyst,
        output_dir=tmp_path,
        progress=False,
    ).train()
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert len(diag["batch"]) == 4 * 4  # K attempts of each of the 4 tasks
    kinds = [c["kind"] for c in diag["analyst_calls"]]
    assert "contrast" in kinds and "failure" not in kinds  # every task had mixed attempts
    contrast_prompt = next(
        user_of(m) for m in analyst.calls if "## Solved and failed attempts" in user_of(m)
    )
    assert "Solved attempt:" in contrast_prompt and "Failed attempt:" in contrast_prompt
    assert "rule steady" in (tmp_path / "current_skill.md").read_text()
    # each task's K attempts got K different seeds, so they can differ
    assert all(len(set(seeds)) == len(seeds) == 4 for seeds in target.seeds.values())
    assert result.steps == 2


def test_a_memory_document_trains_with_the_skill_held_fixed(tmp_path):
    target = rule_target()
    analyst = canned_analyst(failure=edits_json(append("rule beta")))
    result = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8),
        ToyTask(),
        target,
        analyst,
        "",
        document="memory",
        other_document="rule alpha",
        output_dir=tmp_path,
        progress=False,
    ).train()
    assert result.document == "memory"
    assert (tmp_path / "best_memory.md").read_text().strip() == "rule beta"
    # the target saw the fixed skill and the trained memory together
    system = system_of(target.calls[-1])
    assert "rule alpha" in system and "## Memory" in system and "rule beta" in system
    prompt = user_of(analyst.calls[0])
    assert "You improve a MEMORY" in prompt and "<memory>" in prompt


def test_an_append_only_run_applies_no_other_edit(tmp_path):
    # the analyst rewrites the skill's heading and appends a rule: only the append is applied
    edit = {"op": "replace", "target": "# Skill", "content": "# Rewritten", "rationale": "x"}
    analyst = canned_analyst(failure=edits_json(edit, append("rule alpha")))
    result = make(tmp_path, analyst=analyst, epochs=1, max_steps=1, edit_ops=("append",)).train()
    assert "rule alpha" in result.best_skill and "# Skill" in result.best_skill
    assert "# Rewritten" not in result.best_skill
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert rows[1]["edits"]["dropped"] == {"replace is not allowed": 1}


def test_preferences_in_the_config_reach_the_analyst(tmp_path):
    analyst = canned_analyst(failure=edits_json(append("rule alpha")))
    SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8, max_steps=1, preferences="Reply in French."),
        ToyTask(),
        rule_target(),
        analyst,
        output_dir=tmp_path,
        progress=False,
    ).train()
    reflections = [user_of(m) for m in analyst.calls if "## Failed attempts" in user_of(m)]
    assert reflections and all("Reply in French." in p for p in reflections)
    assert json.loads((tmp_path / "config.json").read_text())["preferences"] == "Reply in French."


def test_a_run_resumed_in_another_dtype_scores_its_skills_again(tmp_path):
    """Val scores are kept per dtype the target answers in (bf16 replies differ from
    float32's): a run killed while its local target answered in bfloat16 and resumed in
    float32 scores the skills it goes on from again instead of reading the bf16 scores; one
    resumed in the same dtype reads them."""
    bf16 = rule_target()
    bf16.answer_dtype = "bfloat16"  # what a LocalModel says it answers in
    bf16.fail_after, bf16.interrupt = 27, RuntimeError("killed")
    with pytest.raises(RuntimeError, match="killed"):
        make(tmp_path, target=bf16).train()
    initial = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[0])["skill_hash"]
    scored = json.loads((tmp_path / "val_cache.json").read_text())
    assert f"{initial}@bfloat16" in scored and initial not in scored

    fp32 = rule_target()  # float32: its keys are the skill hashes alone, as before
    make(tmp_path, target=fp32).train()
    assert decisions(tmp_path) == EXPECTED
    scored = json.loads((tmp_path / "val_cache.json").read_text())
    assert set(scored[initial]) == set(scored[f"{initial}@bfloat16"])  # every val item again
    asked = [user_of(m) for m in fp32.calls]
    assert len(asked) > len(set(asked))  # the same val questions, for more than one skill
