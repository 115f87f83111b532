"""`optimize`: skill optimization of a frozen model (text space)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from selftaught.cli.common import (
    BUDGET_FLAGS,
    GATE_FLAGS,
    SIZED_TASK_FLAGS,
    STOP_FLAGS,
    ApiKeyOpt,
    CacheOpt,
    DeviceOpt,
    ModelOpt,
    TaskOpt,
    TimeoutOpt,
    ValSizeOpt,
    app,
    budget,
    console,
    friendly_errors,
    gate_config,
    model_options,
    out,
    read_skill,
    resolve_val_size,
    warn_unsafe_exec,
)
from selftaught.cli.options import EffectiveConfig, config_file, config_flags

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.errors import InputError
from selftaught.gate import GateConfig
from selftaught.models import ModelOptions
from selftaught.models.errors import CALL_TIMEOUT_S
from selftaught.models.usage import Budget
from selftaught.rollout import rollout_timeout
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.skillset import SkillSetConfig
from selftaught.stops import Stops
from selftaught.tasks.options import TaskOptions

if TYPE_CHECKING:
    from selftaught.evaluation import EvalResult
    from selftaught.results import SplitScore
    from selftaught.skill.result import FrontPoint, SkillRunResult
    from selftaught.skill.skillset import SkillSetResult

# ---- optimize (skill optimization, text space) ----------------------------------------


# SkillOptConfig fields offered as flags: field name -> option name (help and default: the field)
SKILL_FLAGS = {
    "epochs": "epochs",
    "batch_size": "batch_size",
    "max_steps": "max_steps",
    "rollouts_k": "rollouts_k",
    "rollout_temperature": "rollout_temperature",
    "minibatch_size": "minibatch_size",
    "merge_batch_size": "merge_batch_size",
    "edit_budget_max": "edit_budget_max",
    "edit_budget_min": "edit_budget_min",
    "edit_schedule": "edit_schedule",
    "accumulate_steps": "accumulate_steps",  # patches of N batches, one update and one gate
    "demos_max": "demos_max",
    "demo_placement": "demo_placement",
    "demo_sets_per_step": "demo_sets",
    "teacher_demos": "teacher_demos",  # issue 52: the optimizer writes, the scorer verifies
    # issue 52: instruction proposals grounded in a summary of the train set (MIPRO)
    "grounded_proposals": "grounded_proposals",
    "summary_items": "summary_items",
    "pooled_val": "pooled_val",  # issue 52: a second held-out pool for the gate
    "curriculum": "curriculum",  # issue 52: the first epoch easier first
    "proposals": "proposals",
    "pool": "pool",
    "merge": "merge",
    "screen_size": "screen_size",
    "screen_keep": "screen_keep",
    "llm_merge": "llm_merge",
    "reflect_on_successes": "successes",
    "evaluate_test": "test",
    "concurrency": "concurrency",
    "max_tokens": "max_tokens",
    "analyst_max_tokens": "analyst_max_tokens",
    "prompts": "prompts",  # the user's own prompt templates, by file name
    "max_skill_chars": "max_skill_chars",  # a skill package's files count against it
    "report_to": "report_to",
    # the slow update (issue 51): a ledger shared across runs, the consolidation at the end
    "edit_ledger": "edit_ledger",
    "slow_every": "slow_every",
}


# many skills (`--skills DIR`): SkillSetConfig fields offered as flags
SET_FLAGS = {"min_tasks": "min_tasks", "max_skills": "max_skills"}

SkillsOpt = Annotated[
    Path | None,
    typer.Option(
        "--skills",
        help="Many skills: cluster the tasks by intent, train one skill per cluster, starting "
        "from DIR/*/SKILL.md and writing each accepted one to DIR/<name>/SKILL.md.",
    ),
]

WriteBackOpt = Annotated[
    bool,
    typer.Option(
        "--write-back",
        help="With --skill PATH: when the gate ships a new best skill, write it into PATH (a "
        "diff shown, a backup kept), only if PATH is unchanged since the run read it.",
    ),
]

# the skill run's own gate defaults; an unset metric is the gate's default
SKILL_GATE = {**dataclasses.asdict(SkillOptConfig().gate), "metric": None, "objective": None}
# a skill's gate may also weigh what a candidate costs per val item (`--objective`)
SKILL_GATE_FLAGS = {**GATE_FLAGS, "objective": "objective"}


OptimizerModelOpt = Annotated[
    str | None,
    typer.Option(
        help="Analyst model spec (reflects and merges); default: --model. A coding agent "
        "(claude-code, codex, cmd:TEMPLATE) edits the skill package itself instead: "
        "docs/optimize.md#a-coding-agent-as-the-optimizer."
    ),
]

InitialSkillOpt = Annotated[
    Path | None,
    typer.Option(
        help="Initial skill: a document, or a skill package (a folder holding SKILL.md "
        "with its scripts/ and references/) optimized whole (default: empty)."
    ),
]

OptimizeOutputOpt = Annotated[
    Path | None,
    typer.Option(
        help="Run directory (default runs/optimize/<task>); re-running the same command "
        "resumes from the last completed step."
    ),
]

StrictGateOpt = Annotated[
    bool,
    typer.Option(
        help="SkillOpt's plain strict > gate: --gate-margin 0 and no paired test "
        "(--gate-confidence 0)."
    ),
]


@app.command("optimize")
@friendly_errors
@config_file(keys={"val_size": "task_options.val_size"}, into="run_config")
@config_flags(SkillOptConfig, SKILL_FLAGS, into="skill_fields")
@config_flags(GateConfig, SKILL_GATE_FLAGS, into="gate_fields", defaults=SKILL_GATE, section="gate")
@config_flags(Budget, BUDGET_FLAGS, into="budget_fields", section="budget")
@config_flags(Stops, STOP_FLAGS, into="stop_fields", section="stops")
@config_flags(TaskOptions, SIZED_TASK_FLAGS, into="task_fields", section="task_options")
@config_flags(SkillSetConfig, SET_FLAGS, into="set_fields", section="skill_set")
def optimize_cmd(
    task: TaskOpt,
    skill_fields: dict[str, Any],
    gate_fields: dict[str, Any],
    budget_fields: dict[str, Any],
    stop_fields: dict[str, Any],
    task_fields: dict[str, Any],
    set_fields: dict[str, Any],
    run_config: EffectiveConfig,
    model: ModelOpt = "local",
    optimizer_model: OptimizerModelOpt = None,
    skill: InitialSkillOpt = None,
    output: OptimizeOutputOpt = None,
    val_size: ValSizeOpt = None,
    skills: SkillsOpt = None,
    write_back: WriteBackOpt = False,
    strict_gate: StrictGateOpt = False,
    timeout: TimeoutOpt = CALL_TIMEOUT_S,
    cache: CacheOpt = None,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Optimize a skill for a frozen model (SkillOpt); ships the best skill, not the last one.

    Each step: rollout → reflect → aggregate → select under an edit budget → apply → gate on val."""
    from selftaught.api import optimize
    from selftaught.models.errors import FatalBackendError

    gate_fields = {**gate_fields, "margin": 0.0, "confidence": None} if strict_gate else gate_fields
    gate, spend = gate_config(**gate_fields), budget(**budget_fields)
    options = TaskOptions(**task_fields, val_size=resolve_val_size(val_size, gate, spend))
    config = skill_config(
        skill_fields,
        seed=options.seed,
        gate=gate,
        budget=spend,
        stops=Stops(**stop_fields),
        timeout_s=rollout_timeout(timeout),
    )
    warn_unsafe_exec(options.unsafe_exec)
    start = _read_start(skill, skills) if write_back else None
    keyed = (model, optimizer_model, options.judge_model)  # every model --api-key reaches
    models = model_options(api_key, timeout, cache, device, models=keyed)
    if skills is not None:
        args = (task, model, optimizer_model, skill, skills, config, set_fields, output, options)
        return _optimize_skills(*args, models, run_config)
    console.print(f"optimizing a skill for [bold]{task}[/] with {model}")
    try:
        result = optimize(
            task,
            model,
            optimizer_model=optimizer_model,
            initial_skill=start.text if start else read_skill(skill),
            config=config,
            output_dir=output,
            task_options=options,
            model_options=models,
            console=console,
        )
    except FatalBackendError:
        console.print("stopped; the run is resumable: fix the cause and re-run the same command")
        raise
    if result.run_dir is not None:
        run_config.keep(result.run_dir)
    print_optimize(result)
    if start is not None and not write_best_back(start, result.best_skill):
        raise typer.Exit(1)


def _read_start(path: Path | None, skills: Path | None) -> Any:
    """--skill PATH as read (text and sha256) for --write-back."""
    from selftaught.sleep.adoption.placement import read_document

    if path is None or skills is not None:
        raise typer.BadParameter(
            "--write-back needs --skill PATH, the file the best skill goes back into (--skills "
            "DIR writes its skills back by itself)"
        )
    if path.is_dir():
        raise typer.BadParameter(
            f"{path} is a skill package: --write-back writes one file back; the best package "
            "is written to RUN/best_package/ for you to compare and copy",
            param_hint="--skill",
        )
    doc = read_document(path)
    if not doc.usable:
        raise typer.BadParameter(f"{doc.path}: {doc.problem}", param_hint="--skill")
    return doc


def write_best_back(start: Any, best: str) -> bool:
    """--write-back: the shipped best skill into the file it started from, only while that
    file is what the run read; False when it was left as it is (changed, or out of bounds)."""
    from selftaught.sleep.adoption.placement import DocumentEdit, write_documents

    if best.strip() == start.text.strip():
        out.print(f"nothing written back: the gate shipped no new skill; {start.path} unchanged")
        return True
    result = write_documents([DocumentEdit(start, best)])
    (done,) = result.files
    if done.action not in ("written", "unchanged"):
        out.print(f"[bold yellow]not written back:[/] {done.path}: {done.reason}", soft_wrap=True)
        return False
    out.print(f"wrote the best skill back into {done.path} (previous bytes in {result.backup})",
              soft_wrap=True, markup=False)  # fmt: skip
    if done.diff:
        out.print(done.diff.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    return True


def _optimize_skills(
    task: str,
    model: str,
    optimizer_model: str | None,
    skill: Path | None,
    skills: Path,
    config: SkillOptConfig,
    set_fields: dict[str, Any],
    output: Path | None,
    options: TaskOptions,
    models: ModelOptions,
    run_config: EffectiveConfig,
) -> None:
    """`optimize --skills DIR`: many skills, then the per-skill table."""
    from selftaught.api import optimize_skills
    from selftaught.models.errors import FatalBackendError

    if skill is not None:
        raise typer.BadParameter("--skill and --skills: the skills in DIR are the start")
    try:
        set_config = SkillSetConfig(**set_fields)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"optimizing many skills for [bold]{task}[/] with {model} in {skills}")
    try:
        result = optimize_skills(
            task,
            model,
            skills_dir=skills,
            optimizer_model=optimizer_model,
            config=config,
            set_config=set_config,
            output_dir=output,
            task_options=options,
            model_options=models,
            console=console,
        )
    except FatalBackendError:
        console.print("stopped; the run is resumable: fix the cause and re-run the same command")
        raise
    if result.run_dir is not None:
        run_config.keep(result.run_dir)
    print_skill_set(result)


def print_skill_set(result: SkillSetResult) -> None:
    """One row per skill: its tasks, own-val and whole-val scores, the gate's decision."""

    def acc(s: SplitScore | None) -> str:
        return "-" if s is None else f"{s.hard:.3f} (n={s.n})"

    table = Table(title=f"skills: {result.task}")
    for name in ("skill", "tasks (train/val)", "own val", "whole val", "decision"):
        table.add_column(name, justify="right" if name in ("own val", "whole val") else "left")
    for o in result.outcomes:
        own = f"{acc(o.own_before)} → {acc(o.own_after)}" if o.trained else "-"
        whole = "-"
        if o.whole_val is not None:
            whole = f"{acc(o.whole_val.before)} → {acc(o.whole_val.after)}"
        decision = "[green]accepted[/]" if o.accepted else "not accepted"
        table.add_row(
            o.name + (" (existing)" if o.cluster.start is not None else ""),
            f"{len(o.cluster.train_ids)}/{len(o.cluster.val_ids)}",
            own,
            whole,
            f"{decision}: {o.reason}",
        )
    out.print(table)
    out.print(
        f"whole val served with routing: {acc(result.base_score)} → {acc(result.shipped_score)}"
        f" · unrouted: {len(result.unrouted_train)} train, {len(result.unrouted_val)} val"
    )
    for path in result.written:
        out.print(f"written: {path}")
    for refused in result.refused:
        out.print(f"[bold yellow]not written:[/] {refused.path}: {refused.reason}")


def skill_config(fields: dict[str, Any], **rest: Any) -> SkillOptConfig:
    """The run's config from the generated flags plus the ones built here (gate, budget)."""
    try:
        return SkillOptConfig(**fields, **rest)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


def print_optimize(result: SkillRunResult) -> None:
    table = Table(title=f"skill optimization: {result.task}")
    table.add_column("")
    table.add_column("initial skill", justify="right")
    table.add_column("best skill", justify="right")

    def acc(s: EvalResult | None) -> str:
        if s is None:
            return "-"
        lo, hi = s.hard_ci
        return f"{s.hard:.3f} ({s.solved}/{s.n}, 95% CI {lo:.2f}-{hi:.2f})"

    test = result.test
    table.add_row("val accuracy", acc(result.val_initial), acc(result.val_best))
    table.add_row(
        "test accuracy", acc(test.initial if test else None), acc(test.best if test else None)
    )
    out.print(table)
    rate = result.analyst.rate()
    out.print(
        f"steps {result.steps}/{result.total_steps} · gate "
        + ", ".join(f"{k} {v}" for k, v in sorted(result.decisions.items()))
        + f" · analyst replies parsed {'-' if rate is None else f'{rate:.0%}'} of "
        f"{result.analyst.calls} · LLM calls {result.llm_calls} · tokens "
        f"{result.tokens} · {result.seconds:.0f} s"
    )
    if result.stopped_by:
        out.print(f"[bold yellow]stopped early:[/] {result.stopped_by} (the same command resumes)")
    if test:
        out.print(f"test paired sign test p = {test.paired.sign_test_p:.3f}")
    for line in front_lines(result.front):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    best_path = Path(result.run_dir or ".") / f"best_{result.document}.md"
    demos = result.best_demos
    carries = f", with {len(demos)} worked example{'s' * (len(demos) != 1)}" if demos else ""
    out.print(f"best {result.document} ({result.best_version}{carries}): {best_path}")


def front_lines(front: list[FrontPoint]) -> list[str]:
    """Score against cost per val item for the skills on the front, the start and the shipped
    one, and what the shipped skill costs over the start: a skill that grew must say so."""
    measured = [(p, p.cost) for p in front if p.cost is not None]
    if not measured:
        return []
    lines = ["score against cost per val item (* the front: no skill scores as well for less):"]
    for p, cost in measured:
        start = p.version == "v0000"
        if not (p.on_front or p.shipped or start):
            continue
        usd = "" if cost.usd is None else f", ${cost.usd:.6f}"
        marks = " (start)" * start + " (shipped)" * p.shipped + " *" * p.on_front
        lines.append(
            f"  {p.version}: val {p.val:.3f} at {cost.tokens:,.0f} tokens, "
            f"{cost.latency_s:.2f} s{usd}{marks}"
        )
    costs = {p.version: cost for p, cost in measured}
    shipped = next((p.version for p, _ in measured if p.shipped), None)
    if "v0000" in costs and shipped not in (None, "v0000") and costs["v0000"].tokens > 0:
        before, after = costs["v0000"].tokens, costs[str(shipped)].tokens
        lines.append(
            f"the shipped skill costs {after:,.0f} tokens per val item, "
            f"{after - before:+,.0f} ({(after - before) / before:+.0%}) against the start"
        )
    return lines
