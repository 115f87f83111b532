"""The models of a night: each role loaded from its spec (the target, else the upstream the
operator's proxy logged), `cmd:` models refused without their opt-in, the night's calls marked
so a proxy in front relays them instead of logging them, each spec loaded once a night."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from selftaught.errors import ConfigError
from selftaught.models.base import ChatModel
from selftaught.sleep import replay_mark
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.night.config import (
    MINER_OFF,
    NightConfig,
    NightModels,
    check_cmd_replay,
)
from selftaught.sleep.paths import (
    sleep_home,
)

ModelLoader = Callable[[str], ChatModel]


def load_models(
    config: NightConfig,
    project_rows: list[Interaction],
    loader: ModelLoader,
    cache: dict[str, ChatModel],
) -> NightModels:
    target = config.model or logged_upstream(project_rows)
    if target is None:
        raise ConfigError(
            "no --model given and no proxy traffic names its upstream: pass --model (the model "
            "your agent uses, not the proxy)"
        )

    def load(spec: str) -> ChatModel:
        if spec not in cache:
            cache[spec] = loader(spec)
        return cache[spec]

    optimizer = config.optimizer_model or target
    wanted = config.miner_model or optimizer
    miner = None if wanted == MINER_OFF else wanted
    roles = {
        "model": target,
        "optimizer_model": optimizer,
        "judge_model": config.judge_model,
        "miner_model": miner,
    }
    check_cmd_replay(roles, config.allow_cmd_replay)  # the target may be the logged upstream
    return NightModels(
        load(target),
        target,
        load(optimizer),
        optimizer,
        load(config.judge_model) if config.judge_model else None,
        config.judge_model,
        miner=load(miner) if miner else None,
        miner_spec=miner,
    )


def logged_upstream(rows: list[Interaction]) -> str | None:
    """The upstream the operator's proxy forwarded to, as the proxy itself recorded it. Only
    rows the proxy logged count: an imported row's `meta.upstream` once sent a night (other
    users' prompts) to the host a file named, so a row of any other source picks nothing
    (an untrusted import is stored with source "import" and without it)."""
    ups = Counter(
        it.meta.get("upstream")
        for it in rows
        if it.source == "proxy" and isinstance(it.meta, dict) and it.meta.get("upstream")
    )
    return ups.most_common(1)[0][0] if ups else None


def default_loader(config: NightConfig, marks: replay_mark.NightMarks) -> ModelLoader:
    """`load_model` with the config's options; the night's calls carry its mark (`marks`, for
    the project whose night runs), so a proxy in front relays them instead of logging them."""
    from selftaught.models import load_model

    return lambda spec: load_model(spec, **config.model_options, sign=marks)


def night_marks(config: NightConfig, home: Path) -> replay_mark.NightMarks:
    return replay_mark.NightMarks(replay_mark.replay_key(home), config.project or "")


def night_models(
    model: NightModels | ChatModel | str | None,
    config: NightConfig,
    loader: ModelLoader | None = None,
) -> NightModels | None:
    """The night's models from a trainer's `model`: every role given, or the target (the
    config's specs load the other roles; the analyst defaults to the target)."""
    if isinstance(model, NightModels):
        check_cmd_replay(model.commands(), config.allow_cmd_replay)
        return model
    if model is None:
        return None
    loader = loader or default_loader(config, night_marks(config, config.home or sleep_home()))
    if isinstance(model, str):
        config = dataclasses.replace(config, model=model)
        return load_models(config, [], loader, {})
    optimizer = loader(config.optimizer_model) if config.optimizer_model else model
    judge = loader(config.judge_model) if config.judge_model else None
    models = NightModels(model, model.name, optimizer, config.optimizer_model or model.name,
                         judge, config.judge_model)  # fmt: skip
    check_cmd_replay(models.commands(), config.allow_cmd_replay)
    return models


def cached_loader(loader: ModelLoader) -> ModelLoader:
    """`loader` loading each spec once (a night's projects share their models)."""
    loaded: dict[str, ChatModel] = {}

    def load(spec: str) -> ChatModel:
        if spec not in loaded:
            loaded[spec] = loader(spec)
        return loaded[spec]

    return load
