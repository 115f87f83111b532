"""The local model's identity and weights: its name and spec, the folder (or GGUF file, or the
embedded model) it loads from, or a model already in memory; loading and unloading them; the
fingerprint that tells two models of one name apart; the chat format of its tokenizer.

No serving here: `LocalWeights` answers "which model, which weights" without starting a
scheduler (`selftaught.models.local_scheduler`) or loading anything it does not have to (a
folder's name, spec and fingerprint come from its files)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError, InputError, MissingDependency
from selftaught.models.errors import FatalBackendError
from selftaught.models.local_prompts import BACKEND, ChatFormat
from selftaught.models.threads import governor


class LocalWeights:
    """A transformers causal LM and its tokenizer, named, loaded on demand.

    Args:
        path: a transformers model folder, a `.gguf` file (converted once into a cache
            folder), or None for the embedded SmolLM2-135M-Instruct. Checked now (a typo
            fails before anything else starts); nothing is loaded until `load()`.
        model, tokenizer: a model already in memory (a peft-wrapped one too) and its
            tokenizer, instead of `path`.
        name: the model's name (default: from the folder or the model's config).
        dtype, device: for a loaded model (see `LocalModel`); an in-memory model stays where
            it is.
        chat_template: a Jinja chat template to use when the tokenizer has none.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        dtype: Any = None,
        device: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        if (model is None) != (tokenizer is None):
            raise ConfigError("pass both model= and tokenizer= (or neither)")
        if model is not None and path:
            raise ConfigError("pass either a path or an in-memory model, not both")
        self.requested_path = path
        self.in_memory = model is not None
        self.closed = False  # an in-memory model let go of: it cannot be loaded again
        self.model: Any = None  # None until loaded
        self.tokenizer: Any = None
        self.chat: ChatFormat | None = None  # the tokenizer's format, once loaded
        self._device_arg = device
        self._dtype_arg = dtype
        self._chat_template = chat_template
        self._path: Path | None = None
        self._fingerprint: str | None = None
        self._fingerprint_version: tuple[tuple[int, int], ...] = ()
        self._load_lock = threading.Lock()
        self._placement: tuple[str, Any] | None = None  # (device, dtype), once decided
        if model is not None:
            config_name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
            self.name = name or f"local:{Path(config_name).name or 'in-memory'}"
            self.adopt(model, tokenizer)
        elif path:
            self.name = name or f"local:{Path(path).expanduser().name.removesuffix('.gguf')}"
            if not Path(path).expanduser().exists():
                raise FatalBackendError(
                    BACKEND,
                    f"local model path {path} does not exist",
                    exit_code=InputError.exit_code,
                )
            if not str(path).endswith(".gguf"):
                _ = self.path  # cheap for a folder: fail now if it is not a model
        else:
            from selftaught.models.embedded import EMBEDDED_NAME

            self.name = name or f"local:{EMBEDDED_NAME}"

    @property
    def spec(self) -> str | None:
        """The model spec that loads these weights again: `local` (the embedded model) or
        `local:PATH`; None for a model in memory (it has no files)."""
        if self.in_memory:
            return None
        return f"local:{self.requested_path}" if self.requested_path else "local"

    @property
    def path(self) -> Path:
        """The resolved transformers folder (converting a GGUF / the embedded model once)."""
        if self.in_memory:
            raise AttributeError(f"{self.name} is an in-memory model; it has no folder")
        if self._path is None:
            self._path = self._resolve_path()
        return self._path

    def _resolve_path(self) -> Path:
        from selftaught.models.embedded import EmbeddedModelMissing, resolve_local_path

        try:
            return resolve_local_path(self.requested_path)
        except EmbeddedModelMissing as err:
            raise FatalBackendError(BACKEND, str(err), exit_code=err.exit_code) from err
        except (FileNotFoundError, ValueError) as err:  # the path the user gave
            raise FatalBackendError(BACKEND, str(err), exit_code=InputError.exit_code) from err
        except ImportError as err:
            raise FatalBackendError(
                BACKEND, missing_extra(err), exit_code=MissingDependency.exit_code
            ) from err
        except Exception as err:  # e.g. a corrupt .gguf failing to convert
            raise FatalBackendError(
                BACKEND,
                f"could not prepare {self.requested_path or 'the embedded model'}: "
                f"{type(err).__name__}: {err}",
            ) from err

    @property
    def chat_format(self) -> ChatFormat:
        """The loaded tokenizer's chat format (loads the model)."""
        self.load()
        chat = self.chat
        if chat is None:  # closed by another thread meanwhile
            raise FatalBackendError(BACKEND, f"{self.name} was closed; wrap the model again")
        return chat

    def context_length(self) -> int | None:
        """The longest sequence the loaded model takes (its config's), if it says."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def fingerprint(self) -> str:
        """A hash of the weights (of the files for a folder, of the parameters for an
        in-memory model). An in-memory model's is taken again once its parameters changed
        in place (a training step), which torch's tensor version counters tell cheaply."""
        from selftaught.models.device import dtype_name
        from selftaught.models.fingerprint import fingerprint_module, fingerprint_path

        if not self.in_memory:
            if self._fingerprint is None:
                # the dtype too (replies differ by it); float32 keeps the key it always had
                dtype = dtype_name(self.placement()[1])
                suffix = "" if dtype == "float32" else f":{dtype}"
                self._fingerprint = f"local:files:{fingerprint_path(self.path)}{suffix}"
            return self._fingerprint
        self.load()
        version = weights_version(self.model)
        if self._fingerprint is None or version != self._fingerprint_version:
            self._fingerprint = f"local:module:{fingerprint_module(self.model)}"
            self._fingerprint_version = version
        return self._fingerprint

    def load(self) -> None:
        """Load the model and tokenizer once (thread-safe; at once when loaded). The torch
        threads are chosen while it loads (`selftaught.models.threads`)."""
        if self.model is not None:
            return
        if self.closed:
            raise FatalBackendError(BACKEND, f"{self.name} was closed; wrap the model again")
        with self._load_lock:
            if self.model is not None:
                return
            path = self.path
            first = governor().start()  # the busy reading spans the load
            device, dtype = self.placement()
            try:
                from transformers import AutoModelForCausalLM, AutoTokenizer
            except ImportError as err:
                raise FatalBackendError(
                    BACKEND, missing_extra(err), exit_code=MissingDependency.exit_code
                ) from err
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                # Any, as `adopt` takes it: mypy reads transformers' wrapped `to` unbound
                model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except Exception as err:  # OSError, ValueError, safetensors errors, ...
                raise FatalBackendError(
                    BACKEND, f"could not load a causal language model from {path}: {err}"
                ) from err
            model.to(device)
            model.eval()
            self.adopt(model, tokenizer)
            governor().on_load(first)

    def placement(self) -> tuple[str, Any]:
        """The device and torch dtype a folder model loads in, decided once (the fingerprint
        names the dtype before anything loads): `dtype=`, else `SELFTAUGHT_DTYPE`, through
        `selftaught.models.device.inference_dtype`."""
        if self._placement is None:
            from selftaught.models.device import inference_dtype, resolve_device

            try:
                device = resolve_device(self._device_arg)[0]
                self._placement = (device, inference_dtype(device, self._dtype_arg))
            except ImportError as err:  # torch itself
                raise FatalBackendError(
                    BACKEND, missing_extra(err), exit_code=MissingDependency.exit_code
                ) from err
            except ValueError as err:  # the --device / dtype / SELFTAUGHT_DTYPE the user gave
                raise FatalBackendError(BACKEND, str(err), exit_code=InputError.exit_code) from err
        return self._placement

    def adopt(self, model: Any, tokenizer: Any) -> None:
        """Check and keep a model + tokenizer (the tokenizer is not modified beyond a given
        chat template: it may be a trainer's)."""
        chat = ChatFormat(tokenizer, model=model, name=self.name, chat_template=self._chat_template)
        self.chat = chat
        self.tokenizer = tokenizer
        self.model = model

    def unload(self) -> None:
        """Let go of the model (a folder model is loaded again on the next `load()`; an
        in-memory one cannot be used again)."""
        with self._load_lock:
            self.model = self.tokenizer = self.chat = None
            self.closed = self.in_memory

    def after_fork(self) -> None:
        """In a forked child (the caller checked): a fresh lock (one may have been held at
        the fork)."""
        self._load_lock = threading.Lock()


def weights_version(model: Any) -> tuple[tuple[int, int], ...]:
    """Identity and in-place version counter of every parameter: changes after an optimizer
    step, `load_state_dict`, or swapped modules."""
    return tuple((id(p), p._version) for p in model.parameters())


def missing_extra(err: ImportError) -> str:
    return (
        f'the local backend needs the [local] extra ({err}); run: pip install "selftaught[local]"'
    )
