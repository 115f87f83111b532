"""Model spec strings a user can type:

local                               the embedded SmolLM2-135M-Instruct
local:/path/to/folder-or.gguf       any local transformers folder or GGUF file
openai:gpt-4o-mini                  OpenAI (or OPENAI_BASE_URL) with OPENAI_API_KEY
http://127.0.0.1:8000/v1#my-model   any OpenAI-compatible endpoint (vLLM, SGLang,
                                    llama.cpp server, Ollama, `selftaught serve`)
"""

from __future__ import annotations

from dataclasses import dataclass

from selftaught.errors import InputError

SPEC_FORMS = (
    "local",
    "local:/path/to/model-folder-or-file.gguf",
    "openai:MODEL (e.g. openai:gpt-4o-mini)",
    "http://HOST:PORT/v1#MODEL",
)


class ModelSpecError(InputError):
    """A model spec that names no known backend or model."""


@dataclass(frozen=True)
class ModelSpec:
    backend: str  # "local" | "openai"
    model: str = ""  # model name (openai) or path (local; "" = embedded)
    base_url: str | None = None


def parse_model_spec(spec: str) -> ModelSpec:
    s = spec.strip()
    if s == "local":
        return ModelSpec("local")
    if s.startswith("local:"):
        return ModelSpec("local", s[len("local:") :])
    if s.startswith("openai:"):
        name = s[len("openai:") :]
        if not name:
            raise ModelSpecError("openai: needs a model name, e.g. openai:gpt-4o-mini")
        return ModelSpec("openai", name)
    if s.startswith(("http://", "https://")):
        base, _, name = s.partition("#")
        return ModelSpec("openai", name, base_url=base.rstrip("/"))
    raise ModelSpecError(f"unknown model spec {spec!r}; valid forms: " + "; ".join(SPEC_FORMS))
