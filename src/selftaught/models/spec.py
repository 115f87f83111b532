"""Model spec strings a user can type:

local                               the embedded SmolLM2-135M-Instruct
local:/path/to/folder-or.gguf       any local transformers folder or GGUF file
openai:gpt-4o-mini                  OpenAI (or OPENAI_BASE_URL) with OPENAI_API_KEY
anthropic:claude-sonnet-4-6         Anthropic's Messages API (the `anthropic` SDK, extra
                                    `anthropic`) with ANTHROPIC_API_KEY
gemini:gemini-2.5-flash             Google's Gemini API (the `google-genai` SDK, extra `gemini`)
                                    with GEMINI_API_KEY or GOOGLE_API_KEY
http://127.0.0.1:8000/v1#my-model   any OpenAI-compatible endpoint (vLLM, SGLang,
                                    llama.cpp server, Ollama, `selftaught serve`); its key is
                                    the one given (`--api-key`), never OPENAI_API_KEY
claude-code / claude-code:MODEL     the Claude Code CLI, run once per call in a workspace
codex / codex:MODEL                 the Codex CLI, likewise
cmd:TEMPLATE                        any CLI agent: TEMPLATE split like a shell would (never run
                                    by one), {prompt} replaced by the prompt, else it is stdin;
                                    refused where the prompt could run as code (command_guard)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from selftaught.errors import InputError
from selftaught.models.errors import ModelSpecError as ModelSpecError

SPEC_FORMS = (
    "local",
    "local:/path/to/model-folder-or-file.gguf",
    "openai:MODEL (e.g. openai:gpt-4o-mini)",
    "anthropic:MODEL (e.g. anthropic:claude-sonnet-4-6)",
    "gemini:MODEL (e.g. gemini:gemini-2.5-flash)",
    "http://HOST:PORT/v1#MODEL",
    "claude-code[:MODEL]",
    "codex[:MODEL]",
    "cmd:TEMPLATE (e.g. 'cmd:my-agent --ask {prompt}'; without {prompt} the prompt is stdin)",
)


# Hosted APIs called through their vendor's SDK: the spec's prefix, and an example spec.
NATIVE_PROVIDERS = {
    "openai": "openai:gpt-4o-mini",
    "anthropic": "anthropic:claude-sonnet-4-6",
    "gemini": "gemini:gemini-2.5-flash",
}


@dataclass(frozen=True)
class ModelSpec:
    backend: str  # "local" | "openai" | "anthropic" | "gemini" | "claude-code" | "codex" | "cmd"
    model: str = ""  # model name (openai, agents), path (local; "" = embedded), cmd's template
    base_url: str | None = None


def parse_model_spec(spec: str) -> ModelSpec:
    s = spec.strip()
    if s == "local":
        return ModelSpec("local")
    if s.startswith("local:"):
        return ModelSpec("local", s[len("local:") :])
    for provider, example in NATIVE_PROVIDERS.items():
        if s.startswith(provider + ":"):
            name = s[len(provider) + 1 :]
            if not name:
                raise ModelSpecError(f"{provider}: needs a model name, e.g. {example}")
            return ModelSpec(provider, name)
    for agent in ("claude-code", "codex"):
        if s == agent or s.startswith(agent + ":"):
            name = s[len(agent) + 1 :]
            if s.endswith(":") and not name:
                raise ModelSpecError(f"{agent}: needs a model name after the colon")
            return ModelSpec(agent, name)
    if s.startswith("cmd:"):
        from selftaught.models.agents.command import parse_template

        template = s[len("cmd:") :]
        try:
            parse_template(template)
        except InputError as err:
            raise ModelSpecError(str(err)) from None
        return ModelSpec("cmd", template)
    if s.startswith(("http://", "https://")):
        base, _, name = s.partition("#")
        return ModelSpec("openai", name, base_url=base.rstrip("/"))
    raise ModelSpecError(f"unknown model spec {spec!r}; valid forms: " + "; ".join(SPEC_FORMS))


def key_destination(spec: str) -> str | None:
    """Where a key given for this model (`--api-key`) is sent: its vendor (openai, anthropic,
    gemini) or its endpoint's base URL; None for a model that takes no key (local, an agent)."""
    parsed = parse_model_spec(spec)
    if parsed.backend in NATIVE_PROVIDERS:
        return parsed.base_url or parsed.backend
    return None


def check_one_key_destination(specs: Iterable[object]) -> None:
    """Refuse one key for models that would send it to more than one place (one vendor's key
    sent to another vendor, or to a self-hosted endpoint). Of `specs` only spec strings count:
    None is no model, and a model object was built with its own key."""
    named = [spec for spec in specs if isinstance(spec, str)]
    places = sorted({d for spec in named if (d := key_destination(spec))})
    if len(places) > 1:
        raise ModelSpecError(
            f"--api-key (SELFTAUGHT_API_KEY) is one key, and this command's models would send "
            f"it to {' and '.join(places)}: leave it unset and give each vendor its own "
            "variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY)"
        )
