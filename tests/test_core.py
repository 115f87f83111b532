"""Unit tests of the core pieces: stats, run directory, policy, extraction, gym task, rollouts."""

from __future__ import annotations

import asyncio
import json

import pytest

from selftaught.errors import ConfigError
from selftaught.models.base import AsyncChatModel, Completion, GenerationParams
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.runs import RunDir, RunError, iter_jsonl
from selftaught.stats import (
    mean_interval,
    paired_bootstrap_pvalue,
    sign_test_pvalue,
    wilson_interval,
)
from selftaught.tasks import TaskError, check_disjoint, load_task
from selftaught.tasks.base import Example, Score
from selftaught.tasks.extract import extract_answer, extract_json, extract_number


# ---- stats ---------------------------------------------------------------------------
def test_wilson_interval_known_values():
    lo, hi = wilson_interval(4, 20)
    assert lo == pytest.approx(0.0807, abs=1e-3) and hi == pytest.approx(0.416, abs=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and 0.8 < lo < 0.85
    for n in (7, 40, 100):  # the bound at 0 is exactly 0, so an accuracy of 0 lies inside
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_mean_interval_contains_mean_and_shrinks_with_n():
    small = mean_interval([0.0, 1.0] * 5)
    large = mean_interval([0.0, 1.0] * 500)
    assert small[0] < 0.5 < small[1]
    assert (large[1] - large[0]) < (small[1] - small[0])


def test_sign_test():
    assert sign_test_pvalue(1, 0) == 0.5  # a one-item gain is not significant
    assert sign_test_pvalue(6, 0) == pytest.approx(1 / 64)
    assert sign_test_pvalue(0, 0) == 1.0


def test_paired_bootstrap_detects_consistent_gain_only():
    old = [0.0] * 30
    assert paired_bootstrap_pvalue([1.0] * 10 + [0.0] * 20, old) < 0.01
    assert paired_bootstrap_pvalue([1.0] + [0.0] * 29, old) > 0.05
    with pytest.raises(ValueError):
        paired_bootstrap_pvalue([1.0], [1.0, 0.0])


# ---- run directory ---------------------------------------------------------------------
def test_history_is_never_duplicated_and_torn_lines_dropped(tmp_path):
    run = RunDir(tmp_path / "run")
    run.append_history({"step": 1, "x": 1})
    run.append_history({"step": 1, "x": 999})  # finished twice (kill before state save)
    run.append_history({"step": 2, "x": 2})
    with open(run.history_path, "a") as f:
        f.write('{"step": 3, "x"')  # a kill mid-write
    assert [r["step"] for r in run.history()] == [1, 2]
    run.append_history({"step": 3, "x": 3})
    rows = [json.loads(line) for line in run.history_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["x"] == 1


def test_config_change_refuses_resume(tmp_path):
    run = RunDir(tmp_path)
    assert run.check_or_write_config({"lr": 1, "epochs": 2}) is False
    assert run.check_or_write_config({"lr": 1, "epochs": 2}) is True
    with pytest.raises(ConfigError, match="epochs"):
        run.check_or_write_config({"lr": 1, "epochs": 3})


def test_iter_jsonl_names_the_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(RunError, match=r"x.jsonl:3"):
        list(iter_jsonl(p))


# ---- extraction --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("The answer is 12.", "12"),
        ("work...\nFinal answer: -7", "-7"),
        ("<answer>yes</answer>", "yes"),
        ("so \\boxed{3/4}", "3/4"),
        ("  19  ", "19"),
    ],
)
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_extract_number_and_json():
    assert extract_number("we get 1,234 apples then 5") == "5"
    assert extract_number("no digits") is None
    assert extract_json('sure: ```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('x {"a": [1, 2]} y') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        extract_json("no json here")


# ---- gym task -----------------------------------------------------------------------------
def test_gym_task_splits_are_disjoint_sized_and_seeded():
    t = load_task("gym:basic_arithmetic", train_size=30, val_size=10, test_size=20)
    assert [len(t.examples(s)) for s in ("train", "val", "test")] == [30, 10, 20]
    check_disjoint(t)
    again = load_task("gym:basic_arithmetic", train_size=30, val_size=10, test_size=20)
    assert [e.input for e in t.examples("test")] == [e.input for e in again.examples("test")]
    other = load_task("gym:basic_arithmetic", seed=1, train_size=30, val_size=10, test_size=20)
    assert [e.input for e in t.examples("test")] != [e.input for e in other.examples("test")]


def test_gym_scores_free_text_with_its_own_scorer():
    t = load_task("gym:basic_arithmetic", train_size=1, val_size=1, test_size=5)
    ex = t.examples("test")[0]
    assert t.score(str(ex.reference), ex).hard == 1
    assert t.score(f"Let me compute. The answer is {ex.reference}.", ex).hard == 1
    wrong = t.score("I think it is 123456789", ex)
    assert wrong.hard == 0 and str(ex.reference) in wrong.feedback


def test_unknown_task_and_generator_list_choices():
    with pytest.raises(TaskError, match="valid forms"):
        load_task("nonsense")
    with pytest.raises(TaskError, match="basic_arithmetic"):
        load_task("gym:basic_arith")
    with pytest.raises(TaskError, match="key=value"):
        load_task("gym:basic_arithmetic?oops")


def test_overlap_fails_closed():
    class Overlapping:
        name, kind, instructions = "overlap", "agent", ""

        def examples(self, split):
            return [Example(f"{split}-0", "same question", "1")]

        def score(self, output, example):
            return Score(1.0, 1.0)

    with pytest.raises(TaskError, match="overlaps training"):
        check_disjoint(Overlapping())


# ---- policy + rollouts ------------------------------------------------------------------
class EchoTask:
    name, kind, instructions = "echo", "agent", "Answer briefly."

    def __init__(self, n=6):
        self._ex = [Example(f"e{i}", f"say {i}", str(i)) for i in range(n)]

    def examples(self, split):
        return self._ex

    def score(self, output, example):
        ok = output.strip() == example.reference
        return Score(float(ok), float(ok), "" if ok else f"expected {example.reference}")


class Scripted(AsyncChatModel):
    name = "scripted"

    def __init__(self, fail_on=(), fatal_on=()):
        self.fail_on, self.fatal_on, self.seen = set(fail_on), set(fatal_on), []

    async def achat(self, messages, params):
        q = messages[-1]["content"].split()[1]
        self.seen.append(messages)
        await asyncio.sleep(0.001 * (7 - int(q)))  # finish out of order
        if q in self.fatal_on:
            raise FatalBackendError("scripted", "key revoked")
        if q in self.fail_on:
            raise TransientBackendError("scripted", "HTTP 503")
        return Completion(q if q != "3" else "wrong", prompt_tokens=5, completion_tokens=1)


def test_policy_assembles_chat_messages():
    task = EchoTask()
    ex = task.examples("test")[0]
    msgs = Policy("Be exact.", "fact: 2+2=4").messages(task, ex)
    assert msgs[0]["role"] == "system" and "Be exact." in msgs[0]["content"]
    assert "fact: 2+2=4" in msgs[0]["content"]
    assert msgs[1] == {"role": "user", "content": "say 0\n\nAnswer briefly."}
    assert Policy().messages(task, ex)[0]["role"] == "user"
    assert Policy("a").skill_hash() != Policy("b").skill_hash()


def test_rollouts_keep_order_and_do_not_score_backend_failures():
    task, model = EchoTask(), Scripted(fail_on={"4"})
    ledger = UsageLedger()
    rs = run_rollouts(
        TrackedModel(model, ledger, "target"),
        Policy(),
        task,
        task.examples("test"),
        RolloutConfig(concurrency=3, progress=False, params=GenerationParams()),
    )
    assert [r.example_id for r in rs] == [f"e{i}" for i in range(6)]
    assert rs[4].error and rs[4].score is None  # a failed call is not a wrong answer
    assert rs[3].score.hard == 0 and "expected 3" in rs[3].score.feedback
    assert sum(r.score.hard for r in rs if r.ok) == 4
    assert ledger.roles["target"].calls == 5 and ledger.roles["target"].errors == 1


def test_fatal_backend_error_stops_the_batch():
    task = EchoTask()
    with pytest.raises(FatalBackendError, match="key revoked"):
        run_rollouts(
            Scripted(fatal_on={"2"}),
            Policy(),
            task,
            task.examples("test"),
            RolloutConfig(progress=False),
        )


class CrashingScorerTask(EchoTask):
    """Its scorer raises on one example: a scorer bug, not a wrong answer."""

    def score(self, output, example):
        if example.id == "e2":
            raise KeyError("no such field")
        return super().score(output, example)


def test_a_crashing_scorer_is_an_error_not_a_zero_and_the_batch_goes_on():
    from selftaught.evaluation import evaluate_split

    task = CrashingScorerTask()
    result = evaluate_split(task, Scripted(), Policy(), rollout=RolloutConfig(progress=False))
    crashed = result.rollouts[2]
    assert crashed.score is None and crashed.error_source == "scorer"
    assert "KeyError" in crashed.error and "e2" in crashed.error
    # counted and shown, not scored: 6 rollouts, 5 scored, of which e3 is wrong
    assert (result.n, result.n_errors, result.n_scorer_errors) == (5, 1, 1)
    assert result.hard == pytest.approx(4 / 5)
    assert "errors 1 (scorer 1)" in result.line()


def test_budget_reserves_calls_so_concurrency_never_overshoots():
    from selftaught.models.usage import Budget, BudgetExhausted

    ledger = UsageLedger(budget=Budget(calls=4))
    task = EchoTask(n=6)
    with pytest.raises(BudgetExhausted, match="4 of 4 calls"):
        run_rollouts(
            TrackedModel(Scripted(), ledger, "target"),
            Policy(),
            task,
            task.examples("test"),
            RolloutConfig(concurrency=6, progress=False),
        )
    u = ledger.roles["target"]
    # the 4 reserved calls, not one more; those in flight finished (they were sent, so
    # they are paid for), none was cancelled into an error
    assert (u.calls, u.errors) == (4, 0)
    assert ledger.exhausted() == "4 of 4 calls used"


def test_budget_validation_and_usd_needs_known_prices():
    from selftaught.models.usage import Budget

    with pytest.raises(ValueError, match="calls must be > 0"):
        Budget(calls=0)
    Budget(usd=1.0).check_priced(["gpt-4o-mini", "local:x"])
    with pytest.raises(ValueError, match="unknown: my-model"):
        Budget(usd=1.0).check_priced(["my-model"])
    Budget(calls=5).check_priced(["my-model"])  # only a USD budget needs prices


def test_budget_roles_narrow_what_counts():
    from selftaught.models.usage import Budget, BudgetExhausted

    ledger = UsageLedger(budget=Budget(calls=2, roles=("target",)))
    target = TrackedModel(Scripted(), ledger, "target")
    analyst = TrackedModel(Scripted(), ledger, "optimizer")
    msgs = [{"role": "user", "content": "say 1"}]
    for _ in range(3):  # the optimizer's calls are free under a target-only budget
        analyst.chat(msgs)
    target.chat(msgs)
    target.chat(msgs)
    with pytest.raises(BudgetExhausted):
        analyst.chat(msgs)  # spent is spent, whoever asks next
    assert ledger.roles["optimizer"].calls == 3 and ledger.roles["target"].calls == 2
