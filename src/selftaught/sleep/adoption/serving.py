"""Serving what a sleep project adopted: its LoRA adapter, switched without a restart.

`FollowAdopted` wraps a local base model for `selftaught serve --project` and the proxy's
local upstream. Before each request it reads the project's adopted version (three `stat`
calls when nothing changed, `paths.read_adopted`); when the adapter it serves changed (an
adopt or a rollback), it builds the new one (`models.adapters.with_adapter`) and answers
from it from then on. Requests already running finish on the model they started on.

`LoraRoute` does the same for a vLLM upstream started with `--enable-lora` (and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): the adopted adapter is loaded through vLLM's
`POST /v1/load_lora_adapter` under the name `<project>-v<N>`, and requests are sent to that
name; a version without an adapter is sent to the base model.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from selftaught.errors import BackendError
from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.fingerprint import fingerprint_path
from selftaught.models.local import LocalModel
from selftaught.sleep.paths import read_adopted


def _adapter_key(folder: Path, memo: dict[Path, str]) -> str:
    """What identifies an adapter: its files' fingerprint (a text-only adopt copies the same
    adapter into a new version folder, which must not rebuild it). Version folders never
    change once written, so each is hashed once."""
    if folder not in memo:
        memo[folder] = fingerprint_path(folder)
    return memo[folder]


class FollowAdopted(AsyncChatModel):
    """`base`, or `base` with the project's adopted adapter, whichever is adopted now."""

    def __init__(self, base: LocalModel, project: str, home: Path | None = None) -> None:
        self.base, self.project, self.home = base, project, home
        self.name = base.name
        self._lock = threading.Lock()
        self._key: str | None = None  # fingerprint of the adapter serving (None: the base)
        self._current: LocalModel = base
        self._keys: dict[Path, str] = {}
        self.switches = 0  # how many times the served adapter changed

    @property
    def adapter(self) -> Path | None:
        """The adapter folder the adopted version serves now (None: the base)."""
        return read_adopted(self.project, self.home).adapter

    def _wanted(self) -> tuple[Path | None, str | None]:
        folder = self.adapter
        return folder, None if folder is None else _adapter_key(folder, self._keys)

    @property
    def inner(self) -> LocalModel:
        """The model serving now (builds a newly adopted adapter first: seconds)."""
        folder, key = self._wanted()
        with self._lock:
            if key != self._key:
                from selftaught.models.adapters import with_adapter

                self._current = self.base if folder is None else with_adapter(self.base, folder)
                self._key = key
                self.switches += 1
            return self._current

    async def _serving(self) -> LocalModel:
        _, key = self._wanted()
        if key == self._key:  # the usual case: no thread hop
            return self._current
        return await asyncio.to_thread(lambda: self.inner)

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        return await (await self._serving()).achat(messages, params)

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        return await (await self._serving()).achat_n(messages, params, n)

    async def aclose(self) -> None:
        await self.base.aclose()


class LoraRoute:
    """Which model name a vLLM upstream serves the adopted version under, loading it there
    the first time (one load per adapter; a failed load is an error, never the base)."""

    def __init__(self, project: str, home: Path | None, base_model: str | None) -> None:
        self.project, self.home, self.base_model = project, home, base_model
        self._loaded: dict[str, str] = {}  # adapter fingerprint -> its name in vLLM
        self._keys: dict[Path, str] = {}
        self._lock = asyncio.Lock()

    async def model_for(self, client: Any, base_url: str, headers: dict[str, str]) -> str | None:
        adopted = read_adopted(self.project, self.home)
        if adopted.adapter is None:
            return self.base_model
        key = _adapter_key(adopted.adapter, self._keys)
        async with self._lock:
            if key not in self._loaded:
                name = f"{self.project}-v{adopted.version}"
                body = {"lora_name": name, "lora_path": str(adopted.adapter)}
                try:
                    resp = await client.post(
                        f"{base_url}/load_lora_adapter", json=body, headers=headers
                    )
                except Exception as err:  # noqa: BLE001 - httpx's network errors
                    raise BackendError(
                        "vllm", f"could not reach the upstream to load an adapter: {err}"
                    ) from err
                if resp.status_code >= 400:
                    raise BackendError(
                        "vllm",
                        f"the upstream refused to load adapter {adopted.adapter} "
                        f"(HTTP {resp.status_code}: {resp.text[:300]}); is it vLLM started "
                        "with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?",
                    )
                self._loaded[key] = name
            return self._loaded[key]
