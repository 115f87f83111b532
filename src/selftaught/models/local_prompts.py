"""The local model's prompt format: how chat messages (and the tools a request offers) become
the text and token ids the model sees, and how a finished sequence's tokens become a reply.

Needs only a tokenizer with a chat template, no weights: `ChatFormat(tokenizer)` renders a
conversation exactly as `LocalModel.format_prompt` does. `LocalModel` (selftaught.models.local)
builds one when its weights are loaded (`selftaught.models.local_weights`)."""

from __future__ import annotations

from typing import Any

from selftaught.errors import InputError
from selftaught.models.base import Completion, GenerationParams, Message
from selftaught.models.batching import GenSequence
from selftaught.models.errors import FatalBackendError
from selftaught.models.tools import (
    check_tool_choice,
    check_tool_messages,
    check_tools,
    render_prompt,
)

BACKEND = "local"  # the backend's name in every error of the local model
_VALID_ROLES = {"system", "user", "assistant", "tool"}


class ChatFormat:
    """The chat template of `tokenizer` and the tokens that end a reply.

    Args:
        tokenizer: a transformers tokenizer; with `chat_template` given, its template is
            replaced by that one (the tokenizer is otherwise not modified: it may be a
            trainer's).
        model: the model the tokenizer serves, if any: its generation config may name
            end-of-reply tokens the tokenizer does not.
        name: the model's name in error messages.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        model: Any = None,
        name: str = "the local model",
        chat_template: str | None = None,
    ) -> None:
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if not getattr(tokenizer, "chat_template", None):
            raise FatalBackendError(
                BACKEND,
                f"{name} has no chat template (a base model?); prompts must go through "
                "one, so pass chat_template=... or use an instruction-tuned model",
            )
        eos_ids = eos_token_ids(tokenizer, model)
        if not eos_ids:
            raise FatalBackendError(BACKEND, f"{name}: the tokenizer has no eos token")
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def text(self, messages: list[Message], params: GenerationParams | None = None) -> str:
        """The chat template's text for `messages`, with the offered tools: rendered by the
        template itself when it has a tools section, else by the documented fallback (a
        system-prompt section; past calls and results as text), see `models.tools`."""
        try:
            return render_prompt(
                self.tokenizer,
                messages,
                params.tools if params else None,
                params.tool_choice if params else None,
            )
        except Exception as err:  # jinja errors: e.g. a template that rejects a role order
            raise FatalBackendError(
                BACKEND, f"the chat template rejected these messages: {err}"
            ) from err

    def encode(self, messages: list[Message], params: GenerationParams | None = None) -> list[int]:
        """The prompt's token ids: the chat template's text, no special tokens added (the
        template already holds them, e.g. <|im_start|>)."""
        text = self.text(messages, params)
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        """Token ids as text, special tokens left out (the engine's streaming decode)."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def completion(self, seq: GenSequence, prompt_tokens: int, model_name: str) -> Completion:
        """The reply of a finished sequence: the text before a stop string or the
        end-of-turn token, and its token counts (the end-of-turn token counts)."""
        tokens = seq.tokens
        if seq.stop_text is not None:  # a stop string ended it: the text before it
            text = seq.stop_text
            completion_tokens = len(self.tokenizer.encode(text, add_special_tokens=False))
        elif tokens and tokens[-1] in self.eos_ids:  # the end-of-turn token counts
            text = self.tokenizer.decode(tokens[:-1], skip_special_tokens=True)
            completion_tokens = len(tokens)
        else:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            completion_tokens = len(tokens)
        return Completion(
            text=text,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=completion_tokens,
            finish_reason=seq.finish_reason or "length",
            model=model_name,
        )


def eos_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """End-of-reply tokens: the generation config's and the tokenizer's (chat models often
    end a turn with a token only one of them names)."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.append(configured)
    elif isinstance(configured, (list, tuple)):
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return list(dict.fromkeys(ids))


def check_messages(messages: Any) -> None:
    """Refuse what is not a chat: a non-empty list of {'role', 'content'} dicts (content
    None with tool calls, as OpenAI sends), tool messages that answer a call."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        calls_only = isinstance(m, dict) and m.get("content") is None and m.get("tool_calls")
        if not isinstance(m, dict) or "role" not in m or ("content" not in m and not calls_only):
            raise InputError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in _VALID_ROLES:
            raise InputError(f"message {i} has unknown role {m['role']!r}")
        if not isinstance(m.get("content"), str) and not calls_only:  # OpenAI: null with calls
            raise InputError(f"message {i} content must be a string")
    check_tool_messages(messages)


def check_params(params: GenerationParams) -> None:
    """Refuse generation settings the local engine cannot honour."""
    if params.max_tokens < 1:
        raise InputError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise InputError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.tools is not None:
        check_tools(params.tools)
    check_tool_choice(params.tool_choice, params.tools)
