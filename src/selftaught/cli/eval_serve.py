"""`tasks`, `eval` and `serve`: list tasks, score a model, serve one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, cast

import typer
from rich.table import Table

from selftaught.cli.common import (
    DEFAULT_MAX_BODY_MB,
    TASK_FLAGS,
    ApiKeyOpt,
    CacheOpt,
    DeviceOpt,
    MaxBodyOpt,
    ModelOpt,
    TaskOpt,
    TimeoutOpt,
    app,
    console,
    friendly_errors,
    model_options,
    out,
    read_skill,
    read_text_file,
    warn_unsafe_exec,
)
from selftaught.cli.options import EffectiveConfig, config_file, config_flags

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.errors import InputError
from selftaught.http_guard import LOOPBACK
from selftaught.models.base import GenerationParams
from selftaught.models.errors import CALL_TIMEOUT_S
from selftaught.rollout import RolloutConfig, rollout_timeout
from selftaught.tasks.options import TaskOptions

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
@config_file(into="run_config")
@config_flags(RolloutConfig, ["concurrency"], into="rollout_fields", section="rollout")
@config_flags(
    GenerationParams, ["max_tokens", "temperature"], into="params", section="rollout.params"
)
@config_flags(TaskOptions, TASK_FLAGS, into="task_fields", section="task_options")
def eval_cmd(
    task: TaskOpt,
    rollout_fields: dict[str, Any],
    params: dict[str, Any],
    task_fields: dict[str, Any],
    run_config: EffectiveConfig,
    model: ModelOpt = "local",
    skill: Annotated[
        Path | None,
        typer.Option(help="Skill document (system prompt), or a skill package's folder."),
    ] = None,
    memory: Annotated[Path | None, typer.Option(help="Memory document.")] = None,
    split: Annotated[str, typer.Option(help="train | val | test")] = "test",
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N examples.")] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Per-example JSONL (default runs/eval/<task>-<split>.jsonl)."),
    ] = None,
    timeout: TimeoutOpt = CALL_TIMEOUT_S,
    cache: CacheOpt = None,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Score a model (+ skill) on a task split: hard/soft accuracy with 95% CIs, tokens used."""
    from selftaught.api import evaluate
    from selftaught.runs import slug

    if split not in ("train", "val", "test"):
        raise typer.BadParameter(f"--split must be train, val or test, not {split!r}")
    options = TaskOptions(**task_fields)
    warn_unsafe_exec(options.unsafe_exec)
    path = output or Path("runs") / "eval" / f"{slug(task)}-{split}.jsonl"
    run_config.keep(path.parent, f"{path.stem}.config.toml")  # beside its results
    result = evaluate(
        task,
        model,
        skill=read_skill(skill),
        memory=read_text_file(memory, "memory"),
        split=cast(Literal["train", "val", "test"], split),  # checked above
        limit=limit,
        rollout=RolloutConfig(
            **rollout_fields,
            timeout_s=rollout_timeout(timeout),
            params=GenerationParams(**params, seed=options.seed),
            description=f"eval {task} [{split}]",
        ),
        task_options=options,
        model_options=model_options(
            api_key, timeout, cache, device, models=(model, options.judge_model)
        ),
        output=path,
    )
    print_eval(result)
    out.print(f"per-example results: {path}")
    if result.n == 0:
        console.print("[bold red]error:[/] every call failed; no example was scored")
        raise typer.Exit(1)


def print_eval(result: Any) -> None:
    table = Table(title=f"{result.task} [{result.split}] with {result.model}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("examples scored", str(result.n))
    table.add_row(
        "hard accuracy",
        f"{result.hard:.3f}  (95% CI {result.hard_ci[0]:.3f}-{result.hard_ci[1]:.3f})",
    )
    soft_ci = result.soft_ci or (0.0, 1.0)  # a live evaluation always has one
    table.add_row("soft score", f"{result.soft:.3f}  (95% CI {soft_ci[0]:.3f}-{soft_ci[1]:.3f})")
    table.add_row("tokens in / out", f"{result.prompt_tokens} / {result.completion_tokens}")
    table.add_row("truncated replies", str(result.truncated))
    table.add_row("errors (not scored)", str(result.n_errors))
    table.add_row("  of which scorer errors", str(result.n_scorer_errors))
    table.add_row("retries", str(result.retries))
    episodes = [r for r in result.rollouts if r.is_episode]
    if episodes:  # tasks with tools
        n = len(episodes)
        turns, calls = sum(r.turns for r in episodes), sum(r.tool_calls for r in episodes)
        table.add_row("turns / tool calls per episode", f"{turns / n:.2f} / {calls / n:.2f}")
        table.add_row("episodes that called a tool", str(sum(r.tool_calls > 0 for r in episodes)))
        table.add_row("failed tool calls", str(sum(r.tool_errors for r in episodes)))
        table.add_row(
            "  tool errors (not scored)", str(sum(r.error_source == "tool" for r in episodes))
        )
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    for role, u in result.usage.items():
        if role != "target":
            table.add_row(
                f"{role} calls / tokens",
                f"{u['calls']} / {u['prompt_tokens'] + u['completion_tokens']}",
            )
    out.print(table)


def follow_project(model: Any, project: str) -> Any:
    """The model serving the project's adopted adapter (a local model only)."""
    from selftaught.models.local import LocalModel
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.paths import check_project

    if not isinstance(model, LocalModel):
        raise typer.BadParameter(
            f"only a local model can serve an adopted adapter, not {model.name}",
            param_hint="--project",
        )
    followed = FollowAdopted(model, check_project(project))
    served = followed.adapter
    console.print(
        f"project {project}: serving {'adapter ' + str(served) if served else 'the base'}"
    )
    return followed


@app.command("serve")
@friendly_errors
@config_file()
def serve_cmd(
    model: ModelOpt = "local",
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = LOOPBACK,
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    name: Annotated[
        str | None, typer.Option(help="Model name clients use (default: the model's name).")
    ] = None,
    max_batch_size: Annotated[int, typer.Option(help="Requests batched into one generate.")] = 8,
    allow_remote: Annotated[
        bool,
        typer.Option(help="Allow binding a non-loopback interface and any Host / Origin header."),
    ] = False,
    device: DeviceOpt = None,
    api_key: ApiKeyOpt = None,
    max_body_mb: MaxBodyOpt = DEFAULT_MAX_BODY_MB,
    project: Annotated[
        str | None,
        typer.Option(
            help="Serve this sleep project's adopted LoRA adapter (a local model), switching "
            "on `sleep adopt` / `sleep rollback` without a restart."
        ),
    ] = None,
) -> None:
    """Serve a model behind an OpenAI-compatible HTTP endpoint (POST /v1/chat/completions)."""
    from selftaught.models import load_model
    from selftaught.serve import check_host, run_server

    try:  # before loading the model: a refused host should cost nothing
        check_host(host, allow_remote)
    except InputError as err:
        raise typer.BadParameter(str(err), param_hint="--host") from None
    the_model = load_model(
        model, max_batch_size=max_batch_size, **model_options(api_key, device=device)
    )
    if project is not None:
        the_model = follow_project(the_model, project)
    served = name or the_model.name.split(":")[-1]
    console.print(
        f"serving [bold]{served}[/] at http://{host}:{port}/v1 "
        f"(use --model http://{host}:{port}/v1#{served})"
    )
    run_server(
        the_model,
        served,
        host=host,
        port=port,
        allow_remote=allow_remote,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    )


@app.command("vllm-up", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly_errors
def vllm_up_cmd(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Option(help="The local model vLLM serves: local, local:PATH or a folder.")
    ] = "local",
    purpose: Annotated[
        str,
        typer.Option(
            "--for",
            help="rest: ReST's --sampler-url and the proxy's --lora (runtime LoRA loading on); "
            "grpo: TRL's server mode (--vllm-server; TRL's own command).",
        ),
    ] = "rest",
    adapter: Annotated[
        list[Path] | None,
        typer.Option(help="An adapter folder to make room for (its rank sets --max-lora-rank)."),
    ] = None,
    lora_rank: Annotated[
        int | None,
        typer.Option(help="Largest LoRA rank to serve (default: --adapter's, else 16)."),
    ] = None,
    served_name: Annotated[
        str, typer.Option(help="The base model's name on the server (rest).")
    ] = "base",
    host: Annotated[str, typer.Option(help="Interface to bind.")] = LOOPBACK,
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the command instead of running it.")
    ] = False,
) -> None:
    """Start vLLM for selftaught (or print the command): the model, runtime LoRA, the rank.

    Arguments after `--` go to `vllm serve` as they are."""
    import os
    import sys

    from selftaught.models.embedded import resolve_local_path
    from selftaught.models.spec import parse_model_spec
    from selftaught.models.vllm import adapter_rank, require_vllm, serve_command

    if purpose not in ("rest", "grpo"):
        raise InputError(f"--for takes rest or grpo, got {purpose!r}")
    spec = parse_model_spec(model)
    if spec.backend != "local":
        raise InputError(f"vllm-up serves a local model (local, local:PATH), not {model!r}")
    ranks = [adapter_rank(a) for a in adapter or []]
    rank = max([r for r in (lora_rank, *ranks) if r is not None], default=16)
    command = serve_command(
        resolve_local_path(spec.model or None),
        purpose="grpo" if purpose == "grpo" else "rest",
        served_name=served_name,
        max_lora_rank=rank,
        host=host,
        port=port,
        extra=tuple(ctx.args),
    )
    url = f"http://{host}:{port}"
    out.print(command.line(), markup=False, highlight=False, soft_wrap=True)  # for a script
    uses = (
        [f"selftaught train --method grpo ... --vllm-server {url}"]
        if purpose == "grpo"
        else [
            f"selftaught train --method rest ... --sampler-url {url}/v1 "
            f"--sampler-base-model {served_name}",
            f"selftaught proxy --upstream '{url}/v1#{served_name}' --lora ...",
        ]
    )
    for use in uses:
        console.print(f"then: {use}", markup=False, highlight=False, soft_wrap=True)
    if print_only:
        return
    require_vllm("selftaught vllm-up")
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *command.argv[1:]]
    os.execve(sys.executable, argv, {**os.environ, **command.env})
