"""ReST sampling through an OpenAI-compatible server that serves the round's model.

Sampling is most of a ReST round's cost, and a server such as vLLM samples far faster than
in-process generation. Each round's model is the base model plus that round's LoRA adapter,
so the server needs the base model once and each adapter as it is trained: vLLM loads one by
name at run time (`POST /v1/load_lora_adapter`, when started with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), after which requests name it as their model:

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve PATH --served-model-name base \\
        --enable-lora --max-lora-rank 16
    selftaught train --method rest --task T --model local:PATH \\
        --sampler-url http://127.0.0.1:8000/v1 --sampler-base-model base

The run directory must be readable by the server at the same path (same machine or a shared
disk). Evaluation stays in process, so every round is scored by the same engine."""

from __future__ import annotations

from pathlib import Path

from selftaught.models.base import ChatModel
from selftaught.models.errors import FatalBackendError
from selftaught.weights.config import RestConfig

_loaded: set[tuple[str, str]] = set()  # (server, adapter name) loaded by this process


def adapter_name(run_root: Path, r: int) -> str:
    """A name unique to this run and round (servers keep adapters across runs)."""
    import hashlib

    run_id = hashlib.sha256(str(run_root.resolve()).encode()).hexdigest()[:8]
    return f"selftaught-{run_id}-round{r}"


def load_adapter(base_url: str, name: str, adapter_dir: Path, *, timeout_s: float = 120.0) -> None:
    """Ask the server to load `adapter_dir` as model `name` (already loaded: fine)."""
    import httpx

    if (base_url, name) in _loaded:
        return
    url = f"{base_url.rstrip('/')}/load_lora_adapter"
    body = {"lora_name": name, "lora_path": str(adapter_dir.resolve())}
    try:
        response = httpx.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise FatalBackendError(base_url, f"could not reach {url} to load {name}: {err}") from err
    if response.status_code >= 400 and "already" not in response.text.lower():
        raise FatalBackendError(
            base_url,
            f"the sampler could not load adapter {adapter_dir} ({response.status_code}: "
            f"{response.text[:200]}); start vLLM with --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
            status=response.status_code,
        )
    _loaded.add((base_url, name))


def served_round_model(config: RestConfig, run_root: Path, r: int) -> ChatModel:
    """Round r's model on the sampler server: the base model for round 0, else the base
    plus round r's adapter, loaded into the server by name first."""
    from selftaught.models.openai_compat import OpenAICompatModel

    assert config.sampler_url is not None
    base_url = config.sampler_url.rstrip("/")
    name = config.sampler_base_model
    if r > 0:
        name = adapter_name(run_root, r)
        load_adapter(base_url, name, run_root / "rounds" / str(r) / "adapter")
    return OpenAICompatModel(name, base_url=base_url, api_key="unused")
