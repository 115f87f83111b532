"""Run one skill/prompt optimizer on one benchmark job: `python driver.py JOB.json RESULT.json`.

Systems: selftaught, gepa, skillrl, and DSPy's dspy-bfrs (BootstrapFewShotWithRandomSearch),
dspy-mipro (MIPROv2, auto="light") and dspy-gepa (dspy.GEPA).

`bench_peers.py` writes the job (system, task spec and seed, the very train / val examples,
seed prompt, endpoint URLs, budget, shared generation settings) and starts this script with
the interpreter that has the system installed: the package's own for `selftaught`, the
separate `benchmarks/.venv-peers` (see setup.sh) for `gepa` and `skillrl`, so the package
never imports a peer. The peers' target rollouts use selftaught's prompt assembly
(`Policy.messages`: the prompt as system message, the task's instructions after the question)
and the task's own scorer (reasoning-gym's `score_answer`), so every system optimizes
against the same answer rule. The result names the prompt the system ships; bench_peers.py
scores it itself on val and test.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

from selftaught.policy import Policy
from selftaught.runs import atomic_write_json
from selftaught.tasks import Example, Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the task specs
from bench_tasks import build_task  # noqa: E402

GEPA_COMPONENT = "system_prompt"


class BudgetSpent(BaseException):
    """The job's target-call budget is spent. A BaseException so that a peer's harness that
    turns an `Exception` in a rollout into a 0 score lets it through and the run ends."""


class EndpointFailed(BaseException):
    """The endpoint failed after the client's retries: the run stops, it is not a 0 score."""


# ---- the job ----------------------------------------------------------------------------


def rebuild_task(job: dict[str, Any]) -> Task:
    """The task with its scorer, checked to hold exactly the examples the job hands over."""
    t = job["task"]
    judge = f"{job['judge_url']}#{job['model_name']}" if job.get("judge_url") else None
    task = build_task(
        t["spec"],
        seed=t["seed"],
        train_size=t["train_size"],
        val_size=t["val_size"],
        test_size=t["test_size"],
        judge_model=judge,
        judge_timeout_s=job["timeout_s"],
    )
    for split in ("train", "val"):
        mine = [(e.id, e.input, str(e.reference)) for e in task.examples(split)]
        given = [(e["id"], e["input"], str(e["reference"])) for e in job["examples"][split]]
        if mine != given:
            raise SystemExit(f"the job's {split} examples differ from {t['spec']} seed {t['seed']}")
    return task


def messages_for(task: Task, example: Example, prompt: str) -> list[dict[str, Any]]:
    return [dict(m) for m in Policy(prompt).messages(task, example)]


class TargetCalls:
    """The target model for the peers: one OpenAI client on the job's target URL, the
    shared generation settings, and the budget of target calls."""

    def __init__(self, job: dict[str, Any]):
        import openai

        self.client = openai.OpenAI(
            base_url=job["target_url"], api_key="EMPTY", max_retries=3, timeout=job["timeout_s"]
        )
        self.model = job["model_name"]
        self.max_tokens = job["max_tokens"]
        self.budget = job["budget_calls"]
        self.used = 0
        self._lock = threading.Lock()

    def charge(self) -> None:
        with self._lock:
            if self.used >= self.budget:
                raise BudgetSpent(f"{self.budget} target calls used")
            self.used += 1

    def reply(self, messages: list[dict[str, Any]]) -> str:
        import openai

        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=self.max_tokens,
                temperature=0.0,
                top_p=1.0,
            )
        except openai.OpenAIError as err:
            raise EndpointFailed(f"target call failed: {err}") from err
        return (resp.choices[0].message.content or "") if resp.choices else ""


# ---- selftaught -------------------------------------------------------------------------


def run_selftaught(job: dict[str, Any], task: Task) -> dict[str, Any]:
    import selftaught
    from selftaught.gate import GateConfig
    from selftaught.models.usage import Budget
    from selftaught.skill import SkillOptConfig

    config = SkillOptConfig(
        epochs=job["epochs"],
        batch_size=job["batch_size"],
        minibatch_size=job["minibatch_size"],
        seed=job["seed"],
        # no gate given: the package's default for optimize
        gate=GateConfig(**job["gate"]) if job.get("gate") else SkillOptConfig().gate,
        budget=Budget(calls=job["budget_calls"], roles=("target",)),
        max_tokens=job["max_tokens"],
        analyst_max_tokens=job["analyst_max_tokens"],
        concurrency=job["concurrency"],
        timeout_s=job["timeout_s"],
        evaluate_test=False,  # bench_peers.py scores every system's shipped prompt itself
        **job.get("config", {}),  # bench_peers.py --config: defaults being swept
    )
    name = job["model_name"]
    run = selftaught.optimize(
        task,
        f"{job['target_url']}#{name}",
        optimizer_model=f"{job['optimizer_url']}#{name}",
        initial_skill=job["seed_prompt"],
        config=config,
        output_dir=job["out_dir"],
        model_options={"timeout_s": job["timeout_s"]},
        progress=False,
    )  # a typed SkillRunResult
    seed_val, shipped_val = run.val_initial, run.val_best
    return {
        "shipped_prompt": run.best_skill,
        "own_val": {
            "seed": seed_val.hard if seed_val else None,
            "shipped": shipped_val.hard if shipped_val else None,
        },
        "steps": run.steps,
        "accepted": run.decisions.get("accept_new_best", 0),
        "decisions": dict(run.decisions),
        "stopped_by": str(run.stopped_by) if run.stopped_by else None,  # text, as its peers
        "analyst": run.analyst.to_dict(),
    }


# ---- GEPA -------------------------------------------------------------------------------


class GymAdapter:
    """GEPA adapter (its `GEPAAdapter` protocol): one component, the system prompt; a batch
    is rolled out concurrently on the endpoint and scored by the task's scorer, whose
    feedback is what GEPA's reflection reads."""

    propose_new_texts = None  # GEPA's default reflective proposer

    def __init__(self, task: Task, target: TargetCalls, concurrency: int):
        self.task = task
        self.target = target
        self.concurrency = concurrency
        self.by_id = {e.id: e for s in ("train", "val") for e in task.examples(s)}

    def _rollout(self, prompt: str, item: dict[str, Any]) -> tuple[str, Any]:
        example = self.by_id[item["id"]]
        self.target.charge()
        reply = self.target.reply(messages_for(self.task, example, prompt))
        return reply, self.task.score(reply, example)

    def evaluate(
        self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces=False
    ):
        from gepa.core.adapter import EvaluationBatch

        prompt = candidate[GEPA_COMPONENT]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            done = list(pool.map(lambda item: self._rollout(prompt, item), batch))
        traces = None
        if capture_traces:
            traces = [
                {"input": item["input"], "reply": reply, "feedback": score.feedback}
                for item, (reply, score) in zip(batch, done, strict=True)
            ]
        return EvaluationBatch(
            outputs=[reply for reply, _ in done],
            scores=[float(score.hard) for _, score in done],
            trajectories=traces,
        )

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        records = [
            {"Inputs": t["input"], "Generated Outputs": t["reply"], "Feedback": t["feedback"]}
            for t in eval_batch.trajectories or []
        ]
        return {component: records for component in components_to_update}


def optimizer_callable(job: dict[str, Any]) -> Any:
    """GEPA's reflection LM: prompt (text or messages) → reply, on the optimizer URL."""
    import openai

    client = openai.OpenAI(
        base_url=job["optimizer_url"], api_key="EMPTY", max_retries=3, timeout=job["timeout_s"]
    )

    def reflect(prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            resp = client.chat.completions.create(
                model=job["model_name"],
                messages=messages,  # type: ignore[arg-type]
                max_tokens=job["analyst_max_tokens"],
                temperature=0.0,
            )
        except openai.OpenAIError as err:
            raise EndpointFailed(f"optimizer call failed: {err}") from err
        return (resp.choices[0].message.content or "") if resp.choices else ""

    return reflect


def run_gepa(job: dict[str, Any], task: Task) -> dict[str, Any]:
    import gepa

    target = TargetCalls(job)
    target.budget = 10**9  # GEPA enforces its own max_metric_calls (checked per iteration)
    result = gepa.optimize(
        seed_candidate={GEPA_COMPONENT: job["seed_prompt"]},
        trainset=job["examples"]["train"],
        valset=job["examples"]["val"],
        adapter=GymAdapter(task, target, job["concurrency"]),
        reflection_lm=optimizer_callable(job),
        reflection_minibatch_size=job["minibatch_size"],
        max_metric_calls=job["budget_calls"],
        run_dir=job["out_dir"],
        seed=job["seed"],
        display_progress_bar=False,
    )
    best = result.best_candidate
    shipped = best[GEPA_COMPONENT] if isinstance(best, dict) else str(best)
    return {
        "shipped_prompt": shipped,
        "own_val": {
            "seed": result.val_aggregate_scores[0],
            "shipped": result.val_aggregate_scores[result.best_idx],
        },
        "steps": None,  # GEPA reports candidates, not iterations
        "accepted": result.num_candidates - 1,
        "decisions": {"candidates": result.num_candidates},
        "stopped_by": f"max_metric_calls {job['budget_calls']}",
        "metric_calls": result.total_metric_calls,
        "full_val_evals": result.num_full_val_evals,
    }


# ---- skillrl ----------------------------------------------------------------------------


def make_skillrl_env(job: dict[str, Any], task: Task, target: TargetCalls) -> Any:
    from skillrl.envs.base import SkillEnv
    from skillrl.types import RolloutResult

    by_id = {e.id: e for s in ("train", "val") for e in task.examples(s)}

    class GymEnv(SkillEnv):
        name = "reasoning_gym"

        def get_items(self, split: str) -> list[dict]:
            return list(job["examples"].get(split, []))

        def rollout_one(self, *, item: dict, skill: str, target_client: Any) -> RolloutResult:
            example = by_id[item["id"]]
            messages = messages_for(task, example, skill)
            system = messages[0]["content"] if messages[0]["role"] == "system" else ""
            user = messages[-1]["content"]
            target.charge()
            text, usage = target_client.chat(
                system=system,
                user=user,
                max_completion_tokens=job["max_tokens"],
                temperature=0.0,
                stage="rollout",
            )
            if usage.get("error"):
                raise EndpointFailed(f"target call failed: {usage['error']}")
            score = task.score(text, example)
            return RolloutResult(
                id=example.id,
                hard=int(score.hard),
                soft=float(score.soft),
                n_turns=1,
                fail_reason="" if score.hard else score.feedback,
                predicted_answer=text,
                question=str(example.input),
                reference_text=str(example.reference),
                target_system_prompt=system,
                target_user_prompt=user,
                conversation=[*messages, {"role": "assistant", "content": text}],
            )

    return GymEnv()


def run_skillrl(job: dict[str, Any], task: Task) -> dict[str, Any]:
    from skillrl import SkillOptConfig as SkillRLConfig
    from skillrl import SkillOptTrainer
    from skillrl.llm.openai_client import OpenAIChatClient

    target = TargetCalls(job)

    def client(url: str) -> Any:
        return OpenAIChatClient(
            job["model_name"],
            api_key="EMPTY",
            base_url=url,
            default_temperature=0.0,
            timeout=job["timeout_s"],
        )

    out = Path(job["out_dir"])
    config = SkillRLConfig(
        num_epochs=job["epochs"],
        batch_size=job["batch_size"],
        minibatch_size=job["minibatch_size"],
        workers=job["concurrency"],
        seed=job["seed"],
        out_root=str(out),
        eval_test=False,  # bench_peers.py scores the shipped prompt itself
        optimizer_max_completion_tokens=job["analyst_max_tokens"],
    )
    trainer = SkillOptTrainer(
        config=config,
        env=make_skillrl_env(job, task, target),
        optimizer_client=client(job["optimizer_url"]),
        target_client=client(job["target_url"]),
        initial_skill=job["seed_prompt"],
    )
    stopped_by = None
    try:
        trainer.train()
    except BudgetSpent as err:  # the partial step is dropped; best_skill.md is the last step's
        stopped_by = f"budget ({err})"
    history = _read_json(out / "history.json", [])
    state = _read_json(out / "runtime_state.json", {})
    baseline = _read_json(out / "baseline_selection_eval" / "summary.json", {})
    actions = Counter(str(h.get("action")) for h in history)
    return {
        "shipped_prompt": (out / "best_skill.md").read_text(encoding="utf-8"),
        "own_val": {"seed": baseline.get("hard"), "shipped": state.get("best_score")},
        "steps": len(history),
        "accepted": actions.get("accept_new_best", 0),
        "decisions": dict(actions),
        "stopped_by": stopped_by,
    }


def _read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else default


# ---- DSPy -------------------------------------------------------------------------------
# DSPy's program here is one `dspy.Predict` whose signature's instructions start as the seed
# prompt. Its adapter (`SkillAdapter`) builds every target call with selftaught's prompt
# assembly, the instructions as the system prompt and the program's demos as prior chat turns:
# a DSPy program is then exactly a selftaught skill (instructions + a demos block, `turns`
# placement), which is what ships and what bench_peers.py scores, with the same messages the
# optimizer saw. So DSPy optimizes what the others optimize, under the same answer rule.

DSPY_SYSTEMS = {"dspy-bfrs", "dspy-mipro", "dspy-gepa"}


def dspy_setup(job: dict[str, Any], task: Task) -> tuple[Any, Any, Any, Any]:
    """(target LM with the budget, optimizer LM, the seed program, SkillAdapter class)."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    os.environ.setdefault("DSPY_CACHEDIR", str(Path(job["out_dir"]) / ".dspy_cache"))
    import dspy
    from dspy.adapters.chat_adapter import ChatAdapter

    from selftaught.demos import Demo, join_skill

    target = TargetCalls(job)  # the budget; DSPy's own LM client makes the call
    if job["system"] == "dspy-gepa":
        target.budget = 10**9  # GEPA enforces its own max_metric_calls, as for the GEPA peer

    class BudgetLM(dspy.LM):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            target.charge()
            return super().__call__(*args, **kwargs)

    def lm(cls: Any, url: str, max_tokens: int) -> Any:
        return cls(
            f"openai/{job['model_name']}",
            api_base=url,
            api_key="EMPTY",
            temperature=0.0,
            max_tokens=max_tokens,
            cache=False,
            num_retries=3,
            timeout=job["timeout_s"],
        )

    class SkillAdapter(ChatAdapter):
        """The task's program (`question -> answer`): messages = selftaught's
        `Policy(skill).messages`, the whole reply is the answer. Any other signature (the
        optimizers' own proposers) keeps DSPy's ChatAdapter."""

        @staticmethod
        def ours(signature: Any) -> bool:
            return list(signature.input_fields) == ["question"] and list(
                signature.output_fields
            ) == ["answer"]

        def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]):
            if not self.ours(signature):
                return super().format(signature, demos, inputs)
            skill = join_skill(signature.instructions, dspy_demos(demos), "turns")
            example = Example(id="dspy", input=str(inputs["question"]))
            return messages_for(task, example, skill)

        def parse(self, signature: Any, completion: str) -> dict[str, Any]:
            if not self.ours(signature):
                return super().parse(signature, completion)
            return {"answer": completion}

    def dspy_demos(demos: list[Any]) -> list[Demo]:
        return [
            Demo.of(f"d{i}", str(d["question"]), str(d["answer"]), "dspy")
            for i, d in enumerate(demos)
            if d.get("question") is not None and d.get("answer") is not None
        ]

    SkillAdapter.to_demos = staticmethod(dspy_demos)  # type: ignore[attr-defined]
    dspy.configure(adapter=SkillAdapter())
    signature = dspy.Signature("question -> answer", instructions=job["seed_prompt"])
    return (
        lm(BudgetLM, job["target_url"], job["max_tokens"]),
        lm(dspy.LM, job["optimizer_url"], job["analyst_max_tokens"]),
        dspy.Predict(signature),
        SkillAdapter,
    )


def dspy_sets(job: dict[str, Any], task: Task) -> tuple[list[Any], list[Any], dict[str, Example]]:
    """The job's train and val examples as dspy.Examples (question, answer = reference)."""
    import dspy

    by_question: dict[str, Example] = {}
    sets = []
    for split in ("train", "val"):
        rows = []
        for e in task.examples(split):
            by_question[str(e.input)] = e
            rows.append(dspy.Example(question=str(e.input), answer=str(e.reference)))
        sets.append([r.with_inputs("question") for r in rows])
    return sets[0], sets[1], by_question


class BestSoFar:
    """Every full-val evaluation an optimizer runs (DSPy's `Evaluate` on the val set), so
    that a run cut at the budget ships the best program it had fully evaluated, as the
    others ship their best so far. A run that ends on its own ships what DSPy returns."""

    def __init__(self, n_val: int):
        self.n_val = n_val
        self.best: tuple[float, Any] | None = None

    def install(self) -> None:
        import dspy

        original = dspy.Evaluate.__call__
        tracker = self

        def recording(evaluate: Any, program: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(evaluate, program, *args, **kwargs)
            devset = kwargs.get("devset") or evaluate.devset
            if len(devset) == tracker.n_val and (
                tracker.best is None or result.score > tracker.best[0]
            ):
                tracker.best = (float(result.score), program.deepcopy())
            return result

        dspy.Evaluate.__call__ = recording  # type: ignore[method-assign]


def run_dspy(job: dict[str, Any], task: Task) -> dict[str, Any]:
    import dspy

    target_lm, optimizer_lm, student, adapter = dspy_setup(job, task)
    dspy.configure(lm=target_lm)
    trainset, valset, by_question = dspy_sets(job, task)

    def hard(gold: Any, pred: Any) -> Any:
        return task.score(str(pred.answer), by_question[gold.question])

    def metric(gold: Any, pred: Any, trace: Any = None, *rest: Any) -> Any:
        score = hard(gold, pred)
        if job["system"] == "dspy-gepa":
            return dspy.Prediction(score=float(score.hard), feedback=score.feedback)
        return float(score.hard)

    best = BestSoFar(len(valset))
    best.install()
    stopped_by = None
    program = student
    try:
        program = compile_dspy(job, metric, student, trainset, valset, optimizer_lm)
    except BudgetSpent as err:
        stopped_by = f"budget ({err})"
        program = best.best[1] if best.best else student
    predictor = program.predictors()[0]
    shipped = join_skill_of(predictor, adapter)
    return {
        "shipped_prompt": shipped,
        "own_val": None,  # DSPy reports its own scores in its log; bench_peers scores val
        "steps": None,
        "accepted": None,
        "decisions": {},
        "stopped_by": stopped_by or "optimizer finished",
        "version_of": "dspy",
    }


def join_skill_of(predictor: Any, adapter: Any) -> str:
    from selftaught.demos import join_skill

    return join_skill(predictor.signature.instructions, adapter.to_demos(predictor.demos), "turns")


def compile_dspy(
    job: dict[str, Any], metric: Any, student: Any, trainset: list, valset: list, optimizer_lm: Any
) -> Any:
    """One DSPy optimizer, each with its own defaults except what the benchmark holds equal
    (seed, threads, the optimizer model, and for GEPA the metric-call budget)."""
    import dspy

    threads = job["concurrency"]
    system = job["system"]
    if system == "dspy-bfrs":
        opt = dspy.BootstrapFewShotWithRandomSearch(metric=metric, num_threads=threads)
        return opt.compile(student, trainset=trainset, valset=valset)
    if system == "dspy-mipro":
        opt = dspy.MIPROv2(
            metric=metric,
            prompt_model=optimizer_lm,
            auto="light",
            num_threads=threads,
            seed=job["seed"],
        )
        return opt.compile(student, trainset=trainset, valset=valset)
    opt = dspy.GEPA(
        metric=metric,
        max_metric_calls=job["budget_calls"],
        reflection_lm=optimizer_lm,
        reflection_minibatch_size=job["minibatch_size"],
        num_threads=threads,
        seed=job["seed"],
        log_dir=str(Path(job["out_dir"]) / "gepa"),
    )
    return opt.compile(student, trainset=trainset, valset=valset)


# ---- main -------------------------------------------------------------------------------

RUNNERS = {
    "selftaught": run_selftaught,
    "gepa": run_gepa,
    "skillrl": run_skillrl,
    **dict.fromkeys(DSPY_SYSTEMS, run_dspy),
}


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: driver.py JOB.json RESULT.json")
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    system = job["system"]
    if system not in RUNNERS:
        raise SystemExit(f"unknown system {system!r}; valid: {', '.join(RUNNERS)}")
    task = rebuild_task(job)
    t0 = time.perf_counter()
    result = RUNNERS[system](job, task)
    package = result.pop("version_of", system)
    wall_s = round(time.perf_counter() - t0, 2)
    result.update(system=system, version=version(package), wall_s=wall_s)
    atomic_write_json(argv[1], result)


if __name__ == "__main__":
    main(sys.argv[1:])
