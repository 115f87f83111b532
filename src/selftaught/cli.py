"""The `selftaught` command: parses arguments and wires library objects. No logic lives here."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="selftaught: LLM agents that improve themselves on their own tasks, safely.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
out = Console()
F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """Known failures (bad input, fatal backend errors) become one sentence and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from selftaught.models.embedded import EmbeddedModelMissing
        from selftaught.models.errors import BackendError
        from selftaught.models.spec import ModelSpecError
        from selftaught.runs import RunError
        from selftaught.tasks.base import TaskError

        try:
            return fn(*args, **kwargs)
        except (BackendError, TaskError, ModelSpecError, RunError, EmbeddedModelMissing) as err:
            console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
            raise typer.Exit(2) from None
        except FileNotFoundError as err:
            console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "run"


def read_text_file(path: Path | None, what: str) -> str:
    if path is None:
        return ""
    if not path.exists():
        raise FileNotFoundError(f"{what} file {path} does not exist")
    return path.read_text(encoding="utf-8")


# Options shared by several commands.
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="Task spec; see `selftaught tasks`.")]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Model spec: local | local:PATH | openai:NAME | http://HOST:PORT/v1#NAME",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="SELFTAUGHT_API_KEY", help="API key (else OPENAI_API_KEY)."),
]
SeedOpt = Annotated[int, typer.Option(help="Seed for task splits and sampling.")]
TrainSizeOpt = Annotated[int | None, typer.Option(help="Train split size (task default if unset).")]
ValSizeOpt = Annotated[int | None, typer.Option(help="Val split size (task default if unset).")]
TestSizeOpt = Annotated[int | None, typer.Option(help="Test split size (task default if unset).")]
UnsafeExecOpt = Annotated[
    bool,
    typer.Option(
        "--unsafe-exec",
        help="Where bubblewrap is missing, run model-written code with resource limits only "
        "(it can read your files and use the network); without this such tasks refuse.",
    ),
]


def warn_unsafe_exec(unsafe_exec: bool) -> None:
    if unsafe_exec:
        from selftaught.tasks.sandbox import UNSAFE_EXEC_WARNING

        console.print(f"[bold yellow]warning:[/] {UNSAFE_EXEC_WARNING}", soft_wrap=True)


# ---- tasks / eval / serve (foundation) ------------------------------------------------


@app.command("tasks")
def tasks_cmd(
    gym: Annotated[
        bool, typer.Option("--gym", help="Also list every reasoning-gym generator.")
    ] = False,
) -> None:
    """List the built-in tasks (and, with --gym, all reasoning-gym generators)."""
    from selftaught.tasks.gym import gym_generators
    from selftaught.tasks.registry import BUILTIN_TASKS, TASK_FORMS

    table = Table(title="built-in tasks")
    table.add_column("task")
    table.add_column("what")
    for name, what in BUILTIN_TASKS.items():
        table.add_row(name, what)
    out.print(table)
    out.print("task spec forms: " + "; ".join(TASK_FORMS))
    gens = gym_generators()
    if gym:
        out.print(f"reasoning-gym generators ({len(gens)}): " + ", ".join(gens))
    else:
        out.print(f"{len(gens)} reasoning-gym generators: use gym:NAME (list them with --gym)")


@app.command("eval")
@friendly_errors
def eval_cmd(
    task: TaskOpt,
    model: ModelOpt = "local",
    skill: Annotated[Path | None, typer.Option(help="Skill document (system prompt).")] = None,
    memory: Annotated[Path | None, typer.Option(help="Memory document.")] = None,
    split: Annotated[str, typer.Option(help="train | val | test")] = "test",
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N examples.")] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Per-example JSONL (default runs/eval/<task>-<split>.jsonl)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Concurrent requests.")] = 8,
    max_tokens: Annotated[
        int, typer.Option(help="Reply length cap (truncation is reported).")
    ] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")] = 0.0,
    timeout: Annotated[float, typer.Option(help="Seconds per model call.")] = 120.0,
    cache: Annotated[
        Path | None, typer.Option(help="SQLite cache of temperature-0 replies.")
    ] = None,
    scorer: Annotated[str | None, typer.Option(help="Scorer for JSONL tasks.")] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Judge model spec for the llm_judge scorer.")
    ] = None,
    rubric: Annotated[
        Path | None, typer.Option(help="Rubric file for the llm_judge scorer.")
    ] = None,
    seed: SeedOpt = 0,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    api_key: ApiKeyOpt = None,
    unsafe_exec: UnsafeExecOpt = False,
) -> None:
    """Score a model (+ skill) on a task split: hard/soft accuracy with 95% CIs, tokens used."""
    from selftaught.evaluation import evaluate
    from selftaught.models import GenerationParams, TrackedModel, UsageLedger, load_model
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig
    from selftaught.runs import atomic_write_json, write_jsonl
    from selftaught.tasks import load_task

    if split not in ("train", "val", "test"):
        raise typer.BadParameter(f"--split must be train, val or test, not {split!r}")
    warn_unsafe_exec(unsafe_exec)
    ledger = UsageLedger()
    judge = None
    if judge_model:
        judge = TrackedModel(load_model(judge_model, api_key=api_key), ledger, "judge")
    the_task = load_task(
        task,
        seed=seed,
        train_size=train_size,
        val_size=val_size,
        test_size=test_size,
        scorer=scorer,
        judge_model=judge,
        rubric=read_text_file(rubric, "rubric") or None,
        unsafe_exec=unsafe_exec,
    )
    target = TrackedModel(
        load_model(model, api_key=api_key, timeout_s=timeout, cache_path=cache), ledger, "target"
    )
    policy = Policy(read_text_file(skill, "skill"), read_text_file(memory, "memory"))
    params = GenerationParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    cfg = RolloutConfig(
        concurrency=concurrency,
        timeout_s=timeout * 10,
        params=params,
        description=f"eval {the_task.name} [{split}]",
    )
    result = evaluate(the_task, target, policy, split=split, limit=limit, rollout=cfg)  # type: ignore[arg-type]

    path = output or Path("runs") / "eval" / f"{slug(the_task.name)}-{split}.jsonl"
    write_jsonl(path, [r.to_dict() for r in result.rollouts])
    summary = {**result.summary(), "usage": ledger.to_dict()}
    atomic_write_json(path.with_suffix(".summary.json"), summary)

    table = Table(title=f"{the_task.name} [{split}] with {result.model}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("examples scored", str(result.n))
    table.add_row(
        "hard accuracy",
        f"{result.hard:.3f}  (95% CI {result.hard_ci[0]:.3f}-{result.hard_ci[1]:.3f})",
    )
    table.add_row(
        "soft score", f"{result.soft:.3f}  (95% CI {result.soft_ci[0]:.3f}-{result.soft_ci[1]:.3f})"
    )
    table.add_row("tokens in / out", f"{result.prompt_tokens} / {result.completion_tokens}")
    table.add_row("truncated replies", str(result.truncated))
    table.add_row("backend errors (not scored)", str(result.n_errors))
    table.add_row("retries", str(result.retries))
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    for role, u in ledger.to_dict().items():
        if role != "target":
            table.add_row(
                f"{role} calls / tokens",
                f"{u['calls']} / {u['prompt_tokens'] + u['completion_tokens']}",
            )
    out.print(table)
    out.print(f"per-example results: {path}")
    if result.n == 0:
        console.print("[bold red]error:[/] every call failed; no example was scored")
        raise typer.Exit(1)


@app.command("serve")
@friendly_errors
def serve_cmd(
    model: ModelOpt = "local",
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    name: Annotated[
        str | None, typer.Option(help="Model name clients use (default: the model's name).")
    ] = None,
    max_batch_size: Annotated[int, typer.Option(help="Requests batched into one generate.")] = 8,
    allow_remote: Annotated[
        bool, typer.Option(help="Allow binding a non-loopback interface.")
    ] = False,
    api_key: ApiKeyOpt = None,
) -> None:
    """Serve a model behind an OpenAI-compatible HTTP endpoint (POST /v1/chat/completions)."""
    from selftaught.models import load_model
    from selftaught.serve import check_host, run_server

    try:  # before loading the model: a refused host should cost nothing
        check_host(host, allow_remote)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--host") from None
    the_model = load_model(model, api_key=api_key, max_batch_size=max_batch_size)
    served = name or the_model.name.split(":")[-1]
    console.print(
        f"serving [bold]{served}[/] at http://{host}:{port}/v1 "
        f"(use --model http://{host}:{port}/v1#{served})"
    )
    run_server(the_model, served, host=host, port=port, allow_remote=allow_remote)


# ---- optimize (skill optimization, text space) ----------------------------------------


@app.command("optimize")
@friendly_errors
def optimize_cmd(
    task: TaskOpt,
    model: ModelOpt = "local",
    optimizer_model: Annotated[
        str | None,
        typer.Option(help="Analyst model spec (reflects and merges); default: --model."),
    ] = None,
    skill: Annotated[
        Path | None, typer.Option(help="Initial skill document (default: empty).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            help="Run directory (default runs/optimize/<task>); re-running the same command "
            "resumes from the last completed step."
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the train split.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Train examples per step.")] = 40,
    max_steps: Annotated[int | None, typer.Option(help="Stop after N steps in all.")] = None,
    minibatch_size: Annotated[int, typer.Option(help="Trajectories per analyst call.")] = 8,
    merge_batch_size: Annotated[int, typer.Option(help="Patches per merge call.")] = 8,
    edit_budget_max: Annotated[int, typer.Option(help="Edits applied at the first step.")] = 4,
    edit_budget_min: Annotated[int, typer.Option(help="Edits applied at the last step.")] = 2,
    edit_schedule: Annotated[str, typer.Option(help="constant | linear | cosine")] = "cosine",
    gate_metric: Annotated[str, typer.Option(help="hard | soft | mixed")] = "hard",
    gate_margin: Annotated[
        float,
        typer.Option(help="A new best must gain MORE than this many val items (0 = strict >)."),
    ] = 1.0,
    gate_confidence: Annotated[
        float | None,
        typer.Option(help="Also require a one-sided paired test with p <= 1 - C (e.g. 0.9)."),
    ] = None,
    strict_gate: Annotated[
        bool, typer.Option(help="SkillOpt's plain strict > gate (same as --gate-margin 0).")
    ] = False,
    llm_merge: Annotated[
        bool, typer.Option(help="Merge patches with the analyst (else deterministic).")
    ] = True,
    successes: Annotated[
        bool, typer.Option(help="Also reflect on solved examples (success-driven edits).")
    ] = True,
    test: Annotated[
        bool, typer.Option(help="Evaluate the initial and best skill on test at the end.")
    ] = True,
    concurrency: Annotated[int, typer.Option(help="Concurrent model calls.")] = 8,
    max_tokens: Annotated[int, typer.Option(help="Target reply length cap.")] = 256,
    analyst_max_tokens: Annotated[int, typer.Option(help="Analyst reply length cap.")] = 768,
    timeout: Annotated[float, typer.Option(help="Seconds per model call.")] = 120.0,
    cache: Annotated[
        Path | None, typer.Option(help="SQLite cache of temperature-0 replies.")
    ] = None,
    scorer: Annotated[str | None, typer.Option(help="Scorer for JSONL tasks.")] = None,
    seed: SeedOpt = 0,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    api_key: ApiKeyOpt = None,
    unsafe_exec: UnsafeExecOpt = False,
) -> None:
    """Optimize a skill document for a frozen model (SkillOpt): rollout → reflect → aggregate →
    select under an edit budget → apply → gate on val; ships the best skill, not the last."""
    from selftaught.models import load_model
    from selftaught.models.errors import FatalBackendError
    from selftaught.skill import SkillOptConfig, SkillTrainer, default_output_dir
    from selftaught.tasks import load_task

    try:
        config = SkillOptConfig(
            epochs=epochs,
            batch_size=batch_size,
            max_steps=max_steps,
            seed=seed,
            minibatch_size=minibatch_size,
            merge_batch_size=merge_batch_size,
            reflect_on_successes=successes,
            llm_merge=llm_merge,
            edit_budget_max=edit_budget_max,
            edit_budget_min=edit_budget_min,
            edit_schedule=edit_schedule,
            gate_metric=gate_metric,
            gate_margin=0.0 if strict_gate else gate_margin,
            gate_confidence=None if strict_gate else gate_confidence,
            concurrency=concurrency,
            max_tokens=max_tokens,
            analyst_max_tokens=analyst_max_tokens,
            timeout_s=timeout * 10,
            evaluate_test=test,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    warn_unsafe_exec(unsafe_exec)
    the_task = load_task(
        task,
        seed=seed,
        train_size=train_size,
        val_size=val_size,
        test_size=test_size,
        scorer=scorer,
        unsafe_exec=unsafe_exec,
    )
    target = load_model(model, api_key=api_key, timeout_s=timeout, cache_path=cache)
    analyst = target
    if optimizer_model and optimizer_model != model:
        analyst = load_model(optimizer_model, api_key=api_key, timeout_s=timeout, cache_path=cache)
    run_dir = output or default_output_dir(the_task.name)
    trainer = SkillTrainer(
        config, the_task, target, analyst, read_text_file(skill, "skill"), output_dir=run_dir
    )
    console.print(
        f"optimizing a skill for [bold]{the_task.name}[/] with {target.name} "
        f"(analyst {analyst.name}) in {run_dir}"
    )
    try:
        summary = trainer.train()
    except FatalBackendError:
        console.print(f"stopped; {run_dir} is resumable: fix the cause and re-run the same command")
        raise

    table = Table(title=f"skill optimization: {the_task.name}")
    table.add_column("")
    table.add_column("initial skill", justify="right")
    table.add_column("best skill", justify="right")

    def acc(s: dict[str, Any] | None) -> str:
        if not s:
            return "-"
        lo, hi = s["hard_ci95"]
        return f"{s['hard']:.3f} ({s['solved']}/{s['n']}, 95% CI {lo:.2f}-{hi:.2f})"

    test_res = summary["test"] or {}
    table.add_row("val accuracy", acc(summary["val_initial"]), acc(summary["val_best"]))
    table.add_row("test accuracy", acc(test_res.get("initial")), acc(test_res.get("best")))
    out.print(table)
    analyst_stats = summary["analyst"]
    rate = analyst_stats["parse_rate"]
    out.print(
        f"steps {summary['steps']}/{summary['total_steps']} · gate "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["decisions"].items()))
        + f" · analyst replies parsed {'-' if rate is None else f'{rate:.0%}'} of "
        f"{analyst_stats['calls']} · LLM calls {summary['llm_calls']} · tokens "
        f"{summary['tokens']} · {summary['elapsed_s']:.0f} s"
    )
    if test_res:
        out.print(f"test paired sign test p = {test_res['paired']['sign_test_p']:.3f}")
    out.print(f"best skill ({summary['best_version']}): {run_dir / 'best_skill.md'}")


# ---- train (weight space) -------------------------------------------------------------


def _default_train_dir(method: str, task: str, backend: str, seed: int) -> Path:
    # deterministic, so running the same command again resumes the run
    return Path("runs") / slug(f"train-{method}-{task}-{backend}-s{seed}")


@app.command()
@friendly_errors
def train(
    ctx: typer.Context,
    task: TaskOpt,
    method: Annotated[
        str, typer.Option(help="rest (ReST-EM) | sft (on references) | grpo | gspo")
    ] = "rest",
    model: ModelOpt = "local",
    backend: Annotated[str, typer.Option(help="lora | full | scratch (games only)")] = "lora",
    rounds: Annotated[int, typer.Option(help="ReST rounds (base model = round 0).")] = 3,
    samples_per_prompt: Annotated[
        int, typer.Option("--samples-per-prompt", "-k", help="k samples per train prompt.")
    ] = 4,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature (rest 0.8, grpo/gspo 1.0).")
    ] = None,
    elite_fraction: Annotated[
        float | None, typer.Option(help="Top fraction kept per prompt (agent 1.0, game 0.25).")
    ] = None,
    min_score: Annotated[
        float | None, typer.Option(help="Keep samples scoring >= this (agent 1.0, game none).")
    ] = None,
    max_per_prompt: Annotated[int, typer.Option(help="Cap of elite samples per prompt.")] = 2,
    continue_training: Annotated[
        bool,
        typer.Option(
            "--continue-training",
            help="Fine-tune the last round's model instead of the base each round.",
        ),
    ] = False,
    epochs: Annotated[float, typer.Option(help="SFT epochs per round.")] = 2.0,
    lr: Annotated[
        float | None, typer.Option("--lr", help="Learning rate (default per backend and method).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="SFT batch size (val must hold at least one batch).")
    ] = 8,
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha.")] = 32,
    lora_dropout: Annotated[float, typer.Option(help="LoRA dropout.")] = 0.05,
    target_modules: Annotated[
        str, typer.Option(help="LoRA targets: all-linear or q_proj,v_proj,...")
    ] = "all-linear",
    dora: Annotated[bool, typer.Option("--dora", help="DoRA instead of plain LoRA.")] = False,
    num_layers: Annotated[int | None, typer.Option(help="Train only the last N layers.")] = None,
    scratch_layers: Annotated[int, typer.Option(help="Layers of the from-scratch model.")] = 2,
    scratch_width: Annotated[int, typer.Option(help="Width of the from-scratch model.")] = 128,
    teacher_skill: Annotated[
        Path | None,
        typer.Option(help="Skill file in the system prompt while sampling only (distillation)."),
    ] = None,
    beta: Annotated[float, typer.Option(help="GRPO/GSPO KL coefficient.")] = 0.04,
    num_generations: Annotated[int, typer.Option(help="GRPO/GSPO group size.")] = 4,
    max_completion_length: Annotated[
        int, typer.Option(help="GRPO/GSPO completion token cap.")
    ] = 64,
    steps: Annotated[int, typer.Option(help="GRPO/GSPO optimizer steps.")] = 20,
    max_tokens: Annotated[int, typer.Option(help="Token cap for sampling and evaluation.")] = 64,
    train_size: TrainSizeOpt = None,
    val_size: ValSizeOpt = None,
    test_size: TestSizeOpt = None,
    seed: SeedOpt = 0,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (fewer is faster on a busy machine).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Run directory (default: runs/train-...; the same command resumes).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
    unsafe_exec: UnsafeExecOpt = False,
) -> None:
    """Train the weights of a local model on a task: ReST-EM / SFT / GRPO / GSPO."""
    from selftaught.models.spec import parse_model_spec
    from selftaught.tasks.registry import load_task
    from selftaught.weights.config import (
        BackendConfig,
        ConfigError,
        RestConfig,
        RLConfig,
        SFTTrainConfig,
        check_method_options,
    )

    given = {
        "--" + name.replace("_", "-")
        for name in ctx.params
        # typer may vendor click, so compare the source by name
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT")
        not in ("DEFAULT", "DEFAULT_MAP")
    }
    try:
        check_method_options(method, given)
        spec = parse_model_spec(model)
        if spec.backend != "local":
            raise ConfigError(
                f"train changes weights, so --model must be local or local:PATH, got {model!r}"
            )
        if threads:
            import torch

            torch.set_num_threads(threads)
        warn_unsafe_exec(unsafe_exec)
        the_task = load_task(
            task,
            seed=seed,
            train_size=train_size,
            val_size=val_size,
            test_size=test_size,
            unsafe_exec=unsafe_exec,
        )
        backend_cfg = BackendConfig(
            backend=backend,  # type: ignore[arg-type]
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=target_modules,
            use_dora=dora,
            num_layers=num_layers,
            scratch_layers=scratch_layers,
            scratch_width=scratch_width,
        )
        run_dir = output or _default_train_dir(method, the_task.name, backend, seed)
        console.print(f"run directory: {run_dir}")
        if method in ("grpo", "gspo"):
            from selftaught.weights.rl import RLTrainer

            rl_cfg = RLConfig(
                method=method,  # type: ignore[arg-type]
                steps=steps,
                beta=beta,
                num_generations=num_generations,
                max_completion_length=max_completion_length,
                temperature=1.0 if temperature is None else temperature,
                learning_rate=lr,
                seed=seed,
                eval_max_tokens=max_tokens,
                backend=backend_cfg,
            )
            rl_result = RLTrainer(
                the_task,
                rl_cfg,
                run_dir,
                model_path=spec.model or None,
                progress=not quiet,
                console=console,
            ).train()
            out.print_json(data=rl_result.to_dict())
            return
        from selftaught.weights.rest import RestTrainer

        rest_cfg = RestConfig(
            rounds=1 if method == "sft" and "--rounds" not in given else rounds,
            samples_per_prompt=samples_per_prompt,
            temperature=0.8 if temperature is None else temperature,
            max_tokens=max_tokens,
            min_score=min_score,
            elite_fraction=elite_fraction,
            max_per_prompt=max_per_prompt,
            continue_training=continue_training,
            teacher_skill=read_text_file(teacher_skill, "teacher skill") or None,
            seed=seed,
            sft=SFTTrainConfig(epochs=epochs, learning_rate=lr, batch_size=batch_size),
            backend=backend_cfg,
        )
        result = RestTrainer(
            the_task,
            rest_cfg,
            run_dir,
            model_path=spec.model or None,
            method=method,
            progress=not quiet,
            console=console,
        ).train()
    except ConfigError as err:
        console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
        raise typer.Exit(2) from None
    b, s = result.base_test, result.shipped_test
    console.print(f"base    test {b.line()}")
    shipped = "base model" if result.best_round == 0 else f"round {result.best_round}"
    console.print(f"shipped test {s.line()}  ({shipped}, {result.gain:+.3f})")
    if result.best_dir:
        console.print(f"shipped model: {result.best_dir}  (use --model local:{result.best_dir})")
    out.print_json(data=result.to_dict())


def main() -> None:  # pragma: no cover
    app()
