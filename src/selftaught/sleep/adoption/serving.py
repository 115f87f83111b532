"""Serving what a sleep project adopted: its LoRA adapters, switched without a restart.

`AdapterShelf` keeps merged copies of one local base, one per adapter folder, resident at
once: a request for an adapter already on the shelf is answered by its copy with no load, and
an adapter is merged (`models.adapters.with_adapter`, seconds) only the first time it is
asked for, or again after it was evicted. At most `max_resident` copies stay (the least
recently used one goes first; requests already running on it finish there). A merged copy
costs what the base's weights cost. Measured for the embedded SmolLM2-135M (134.5 M
parameters) on a CPU in bfloat16: 257 MiB of parameters, 230-265 MiB more resident memory per
copy, 1.4 s to merge; float32 doubles the memory. The default bound of 4 copies so holds
about 1 GiB (2 GiB in float32) besides the base (docs/sleep-nights.md, "Many skills").

`FollowAdopted` wraps a local base model for `selftaught serve --project` and the proxy's
local upstream. Before each request it reads the project's adopted version (three `stat`
calls when nothing changed, `paths.read_adopted`) and answers from the shelf's copy for its
adapter (the base when it has none), so an adopt or a rollback applies from the next request.
The proxy asks the same shelf for a request's routed skill's adapter (each skill's unit has
its own versions and adapter, `adoption/skill_units.py`) and for a canary's staged one.

`LoraRoute` does the same for a vLLM upstream started with `--enable-lora` (and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): each adapter is loaded once through vLLM's
`POST /v1/load_lora_adapter`, the project's under the name `<project>-v<N>`, a skill's under
`<project>-<skill>-v<N>`, checked to be the one vLLM serves under that name
(`models.vllm.load_lora`: a restarted proxy finds it loaded and goes on; a server holding
another adapter under the name is refused), and requests are sent to that name; a version
without an adapter is sent to the base model.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError
from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.fingerprint import fingerprint_path
from selftaught.models.local import LocalModel
from selftaught.models.vllm import load_lora
from selftaught.sleep.adoption.inject import RoutedSkill
from selftaught.sleep.paths import read_adopted

DEFAULT_MAX_ADAPTERS = 4  # merged copies resident at once (module doc: what one costs)

Merge = Callable[[LocalModel, Path], LocalModel]


def _adapter_key(folder: Path, memo: dict[Path, str]) -> str:
    """What identifies an adapter: its files' fingerprint (a text-only adopt copies the same
    adapter into a new version folder, which must not rebuild it). Version folders never
    change once written, so each is hashed once."""
    if folder not in memo:
        memo[folder] = fingerprint_path(folder)
    return memo[folder]


def _merge(base: LocalModel, folder: Path) -> LocalModel:
    from selftaught.models.adapters import with_adapter

    return with_adapter(base, folder)


class AdapterShelf:
    """Merged copies of `base` with an adapter each, at most `max_resident` at once (the least
    recently used evicted first), keyed by the adapter's files; `loads` counts the merges."""

    def __init__(
        self, base: LocalModel, max_resident: int = DEFAULT_MAX_ADAPTERS, merge: Merge = _merge
    ) -> None:
        if max_resident < 1:
            raise ConfigError(f"max_adapters must be >= 1, got {max_resident}")
        self.base, self.max_resident, self._merge = base, max_resident, merge
        self._models: OrderedDict[str, LocalModel] = OrderedDict()
        self._keys: dict[Path, str] = {}
        self._lock = threading.Lock()
        self.loads = 0

    def key(self, folder: Path) -> str:
        return _adapter_key(folder, self._keys)

    def resident(self, folder: Path | None) -> LocalModel | None:
        """The model for `folder` when it needs no load (the base for None), else None."""
        if folder is None:
            return self.base
        key = self.key(folder)
        with self._lock:
            found = self._models.get(key)
            if found is not None:
                self._models.move_to_end(key)
            return found

    def get(self, folder: Path | None) -> LocalModel:
        """The model for `folder`, merged now when it is not on the shelf (seconds: call it
        off the event loop then, `aget`)."""
        found = self.resident(folder)
        if found is not None or folder is None:
            return found or self.base
        key = self.key(folder)
        with self._lock:  # one merge at a time: two requests for a new adapter merge it once
            found = self._models.get(key)
            if found is None:
                found = self._merge(self.base, folder)
                self.loads += 1
                self._models[key] = found
                while len(self._models) > self.max_resident:
                    self._models.popitem(last=False)  # freed once its requests are answered
            self._models.move_to_end(key)
            return found

    async def aget(self, folder: Path | None) -> LocalModel:
        found = self.resident(folder)
        return found if found is not None else await asyncio.to_thread(self.get, folder)

    def keys(self) -> list[str]:
        """The resident adapters' keys, least recently used first."""
        with self._lock:
            return list(self._models)


class FollowAdopted(AsyncChatModel):
    """`base`, or `base` with the project's adopted adapter, whichever is adopted now; its
    `shelf` also serves the proxy's other adapters (a routed skill's, a canary's)."""

    def __init__(
        self,
        base: LocalModel,
        project: str,
        home: Path | None = None,
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        merge: Merge = _merge,
    ) -> None:
        self.base, self.project, self.home = base, project, home
        self.name = base.name
        self.shelf = AdapterShelf(base, max_adapters, merge)
        self._lock = threading.Lock()
        self._key: str | None = None  # fingerprint of the adapter serving (None: the base)
        self.switches = 0  # how many times the served adapter changed

    @property
    def adapter(self) -> Path | None:
        """The adapter folder the adopted version serves now (None: the base)."""
        return read_adopted(self.project, self.home).adapter

    def _switched(self, folder: Path | None) -> None:
        key = None if folder is None else self.shelf.key(folder)
        with self._lock:
            if key != self._key:
                self._key = key
                self.switches += 1

    @property
    def inner(self) -> LocalModel:
        """The model serving now (merges a newly adopted adapter first: seconds)."""
        folder = self.adapter
        model = self.shelf.get(folder)
        self._switched(folder)
        return model

    async def _serving(self) -> LocalModel:
        folder = self.adapter
        model = await self.shelf.aget(folder)  # the usual case: resident, no thread hop
        self._switched(folder)
        return model

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
    """Which model name a vLLM upstream serves a request under: its routed skill's adapter,
    else the project's adopted one, loading it there the first time (one load per adapter; a
    failed or unchecked load is an error, never the base)."""

    def __init__(self, project: str, home: Path | None, base_model: str | None) -> None:
        self.project, self.home, self.base_model = project, home, base_model
        self._loaded: dict[str, str] = {}  # adapter fingerprint -> its name in vLLM
        self._keys: dict[Path, str] = {}
        self._lock = asyncio.Lock()

    def _wanted(self, skill: RoutedSkill | None) -> tuple[Path, str] | None:
        """(adapter folder, its name in vLLM) for a request routed to `skill`; None: the base."""
        if skill is not None and skill.adapter is not None:
            return skill.adapter, f"{self.project}-{skill.name}-v{skill.version}"
        adopted = read_adopted(self.project, self.home)
        if adopted.adapter is None:
            return None
        return adopted.adapter, f"{self.project}-v{adopted.version}"

    async def model_for(
        self,
        client: Any,
        base_url: str,
        headers: dict[str, str],
        skill: RoutedSkill | None = None,
    ) -> str | None:
        wanted = self._wanted(skill)
        if wanted is None:
            return self.base_model
        folder, name = wanted
        key = _adapter_key(folder, self._keys)
        async with self._lock:
            if key not in self._loaded:
                await load_lora(client, base_url, name, str(folder), headers)
                self._loaded[key] = name
            return self._loaded[key]
