"""ReST rounds sampled and evaluated on a vLLM server that serves the base model once.

Sampling is most of a ReST round's cost, and vLLM samples far faster than in-process
generation. Each round's model is the base model plus that round's LoRA adapter, so the
server needs the base model once and each adapter as it is trained: vLLM loads one at run
time (`models.vllm`: `POST /v1/load_lora_adapter`, the server started with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; `selftaught vllm-up` prints or runs that command),
after which requests name it as their model:

    selftaught vllm-up --model local:PATH &
    selftaught train --method rest --task T --model local:PATH \\
        --sampler-url http://127.0.0.1:8000/v1

Round 0 is the base model under its served name (`--sampler-base-model`). Round r's adapter
is loaded once, under a name unique to the run, the round and the adapter's files, checked
before every use (the server must list that name with that folder, and every reply must
name it: a stale adapter or a fall-back to the base stops the run), and unloaded once no
later round can sample from it or ship it. Val and test run on the same server, so every
round, round 0 included, is scored by the same engine. The run directory must be readable
by the server at the same path (the same machine or a shared disk)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from selftaught.models.base import ChatModel, run_sync
from selftaught.models.fingerprint import fingerprint_path


class RoundServer:
    """A ReST run's rounds on one vLLM server. `loads` counts the adapters loaded."""

    def __init__(self, base_url: str, base_model: str, run_root: Path, *, timeout_s: float = 120):
        self.base_url = base_url.rstrip("/")
        self.base_model = base_model
        self.run_root = run_root
        self.timeout_s = timeout_s
        self.loaded: dict[int, tuple[str, str]] = {}  # round -> (name, adapter folder)
        self.loads = 0

    def adapter_dir(self, r: int) -> Path:
        return (self.run_root / "rounds" / str(r) / "adapter").resolve()

    def adapter_name(self, r: int) -> str:
        """Unique to the run, the round and the adapter's files (servers outlive runs, and a
        run started again in the same folder trains other weights under the same round)."""
        run_id = hashlib.sha256(str(self.run_root.resolve()).encode()).hexdigest()[:8]
        return f"selftaught-{run_id}-round{r}-{fingerprint_path(self.adapter_dir(r))[:8]}"

    def model(self, r: int) -> ChatModel:
        """Round r's model on the server, its adapter loaded (once) and checked first."""
        from selftaught.models.openai_compat import OpenAICompatModel

        name = self.base_model if r == 0 else self._ready(r)
        return OpenAICompatModel(name, base_url=self.base_url, strict_model=True)

    def _ready(self, r: int) -> str:
        from selftaught.models.vllm import check_lora, load_lora

        if r in self.loaded:
            name, path = self.loaded[r]
            self._call(check_lora, name, path)
            return name
        name, path = self.adapter_name(r), str(self.adapter_dir(r))
        self._call(load_lora, name, path)
        self.loaded[r] = (name, path)
        self.loads += 1
        return name

    def keep_only(self, rounds: set[int]) -> None:
        """Unload every adapter this run loaded but those of `rounds`."""
        from selftaught.models.vllm import unload_lora

        for r in sorted(set(self.loaded) - rounds):
            name, _ = self.loaded.pop(r)
            self._call(unload_lora, name)

    def close(self) -> None:
        """Unload what this run loaded: the server is left as the run found it."""
        self.keep_only(set())

    def _call(self, fn: Callable[..., Awaitable[None]], *args: str) -> None:
        import httpx

        async def go() -> None:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                await fn(client, self.base_url, *args)

        run_sync(go())
