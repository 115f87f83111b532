"""vLLM as the engine: its runtime LoRA API (load, check, unload) and the command that starts it.

vLLM started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` loads an adapter
folder while it runs (`POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, a 400 when the
name is already loaded), lists it in `GET /v1/models` (`id` the name, `root` the path it was
loaded from, `parent` the base model), answers a request that names it as its model (the
reply's `model` is the name) and drops it on `POST /v1/unload_lora_adapter {"lora_name"}` (a
404 when the name is unknown). Without the variable those two routes do not exist (404).

A name is no proof of weights: a server that kept another adapter under the name answers
requests for it from those weights without a word (OpenPipe ART #661: rollouts silently used
stale adapters). So each load is checked: the server must list the name with the path just
loaded, and a name it already held passes only when it lists that same path; anything else is
a `StaleAdapter` error, never a fall-back to the base model. ReST's sampler
(`weights.served`) and the proxy's `--lora` (`sleep.adoption.serving.LoraRoute`) share this.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from selftaught.errors import InputError, MissingDependency
from selftaught.models.errors import FatalBackendError, server_detail

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's `--max-lora-rank` takes (`vllm.config.lora.MaxLoRARanks`)."""
ENABLE_HINT = f"start vLLM with --enable-lora and {RUNTIME_LORA_ENV}=True"


class StaleAdapter(FatalBackendError):
    """The server serves something else than the adapter asked for under its name."""


def _backend(base_url: str) -> str:
    return f"vllm {base_url}"


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


async def served_models(
    client: Any, base_url: str, headers: dict[str, str] | None = None
) -> dict[str, str | None]:
    """`GET /v1/models` as {model id: the path it was loaded from (`root`; None if unsaid)}."""
    try:
        response = await client.get(f"{base_url}/models", headers=headers)
    except Exception as err:  # noqa: BLE001 - httpx's network errors
        raise FatalBackendError(_backend(base_url), f"could not list the models: {err}") from err
    if response.status_code >= 400:
        raise FatalBackendError(
            _backend(base_url),
            f"listing the models failed (HTTP {response.status_code}: "
            f"{server_detail(response.text)})",
            status=response.status_code,
        )
    try:
        cards = response.json()["data"]
        return {str(c["id"]): (str(c["root"]) if c.get("root") else None) for c in cards}
    except (ValueError, KeyError, TypeError) as err:
        raise FatalBackendError(
            _backend(base_url), f"/models answered no model list: {server_detail(response.text)}"
        ) from err


async def check_lora(
    client: Any, base_url: str, name: str, path: str, headers: dict[str, str] | None = None
) -> None:
    """That the server serves `path` under `name` (`/v1/models` lists the name with that
    path), else `StaleAdapter` naming what it serves instead."""
    served = await served_models(client, base_url, headers)
    if name not in served:
        raise StaleAdapter(
            _backend(base_url),
            f"adapter {name!r} is not among the served models ({', '.join(served) or 'none'}); "
            "was the server restarted, or the adapter unloaded by someone else?",
        )
    root = served[name]
    if root is None or not _same_path(root, path):
        raise StaleAdapter(
            _backend(base_url),
            f"the server serves {name!r} from {root or 'a path it does not list'}, not {path}: "
            "requests for it would get another adapter's weights; unload it "
            "(POST /v1/unload_lora_adapter) or restart the server",
        )


async def load_lora(
    client: Any, base_url: str, name: str, path: str, headers: dict[str, str] | None = None
) -> None:
    """Load the adapter folder `path` as model `name`, then `check_lora` it. A name the server
    already holds passes only when it holds this path (a resumed run, a restarted proxy)."""
    body = {"lora_name": name, "lora_path": path}
    url = f"{base_url}/load_lora_adapter"
    try:
        response = await client.post(url, json=body, headers=headers)
    except Exception as err:  # noqa: BLE001 - httpx's network errors
        raise FatalBackendError(
            _backend(base_url), f"could not reach {url} to load adapter {name!r}: {err}"
        ) from err
    already = response.status_code == 400 and "already" in response.text.lower()
    if response.status_code >= 400 and not already:
        raise FatalBackendError(
            _backend(base_url),
            f"the server refused to load adapter {path} (HTTP {response.status_code}: "
            f"{server_detail(response.text)}); {ENABLE_HINT}",
            status=response.status_code,
        )
    await check_lora(client, base_url, name, path, headers)


async def unload_lora(
    client: Any, base_url: str, name: str, headers: dict[str, str] | None = None
) -> None:
    """Drop adapter `name` from the server (one it no longer holds: nothing to do)."""
    url = f"{base_url}/unload_lora_adapter"
    try:
        response = await client.post(url, json={"lora_name": name}, headers=headers)
    except Exception as err:  # noqa: BLE001 - httpx's network errors
        raise FatalBackendError(
            _backend(base_url), f"could not reach {url} to unload adapter {name!r}: {err}"
        ) from err
    if response.status_code >= 400 and response.status_code != 404:
        raise FatalBackendError(
            _backend(base_url),
            f"the server refused to unload adapter {name!r} (HTTP {response.status_code}: "
            f"{server_detail(response.text)})",
            status=response.status_code,
        )


# ---- the command that starts it ----------------------------------------------------------------


def lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM takes that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise InputError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({LORA_RANKS[-1]})")


def adapter_rank(adapter: Path) -> int:
    """The largest rank of a peft adapter folder (`r` and any per-module `rank_pattern`)."""
    config_file = adapter / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        ranks = [int(config["r"]), *(int(v) for v in (config.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{adapter} is not a LoRA adapter folder ({config_file}: {err})") from None
    return max(ranks)


@dataclass(frozen=True)
class VllmCommand:
    """A `vllm serve` command line and the environment it needs beside the caller's."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """The command as one shell line (the environment first)."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, shlex.join(self.argv)])


def serve_command(
    model_path: Path,
    *,
    purpose: Literal["rest", "grpo"] = "rest",
    served_name: str = "base",
    max_lora_rank: int = 16,
    host: str = "127.0.0.1",
    port: int = 8000,
    extra: tuple[str, ...] = (),
) -> VllmCommand:
    """The command that serves `model_path` for a purpose. `rest` (sampling and evaluating
    ReST rounds, serving adopted adapters behind the proxy): the base model under
    `served_name`, runtime LoRA loading on, room for adapters up to `max_lora_rank`. `grpo`:
    TRL's own command for its server mode (`trl.scripts.vllm_serve.build_command`: the weight
    transfer the trainer pushes its weights through, processed logprobs)."""
    if purpose == "grpo":
        from trl.scripts.vllm_serve import ScriptArguments, build_command

        trl = build_command(ScriptArguments(model=str(model_path), host=host, port=port))
        serve = trl.index("serve")  # `python -m vllm.entrypoints.cli.main serve ...`
        return VllmCommand(("vllm", *trl[serve:], *extra), {"VLLM_SERVER_DEV_MODE": "1"})
    argv = (
        "vllm",
        "serve",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--enable-lora",
        "--max-lora-rank",
        str(lora_rank(max_lora_rank)),
        *extra,
    )
    return VllmCommand(argv, {RUNTIME_LORA_ENV: "True"})


def require_vllm(what: str) -> None:
    """Refuse, in one sentence, what needs vLLM on a machine without it."""
    if importlib.util.find_spec("vllm") is None:
        raise MissingDependency(
            f"{what} needs vLLM, which is not installed here: `pip install vllm` on a machine "
            "with a GPU"
        )
