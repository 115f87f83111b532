"""What the documentation's examples run against (tests/test_docs_examples.py): every model
spec answered offline by a scripted model, the embedded model's weights a tiny random model.

A `bash` example's processes get the same through `tests/doc_site/sitecustomize.py`, with one
difference: a loopback URL (`http://127.0.0.1:PORT/v1#NAME`) reaches the real server the
example started itself (`selftaught serve`, `selftaught proxy`), so an example that starts a
server and uses it shows that it waits for the server to be ready."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message

TINY_MODEL_ENV = "DOCS_TINY_MODEL"  # the tiny model's folder, for an example's subprocesses
SCRIPTED_ENV = "DOCS_SCRIPTED_MODELS"  # set: an example's subprocesses get scripted models
PROVIDERS = ("openai:", "anthropic:", "gemini:")
LOOPBACK = re.compile(r"^https?://(127\.0\.0\.1|localhost)[:/]")


class DocModel(AsyncChatModel):
    """Any model spec, answered offline: a judge's score, an analyst's edit, else a number."""

    def __init__(self, name: str):
        # named as the real backend names it (prices are looked up by that name)
        name = name.split(":", 1)[1] if name.startswith(PROVIDERS) else name
        self.name = "local:SmolLM2-135M-Instruct" if name == "local" else name

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        text = "\n".join(str(m.get("content") or "") for m in messages)
        if "Score the reply below against the rubric" in text:
            reply = json.dumps({"score": 8, "reason": "scripted judge"})
        elif "<skill>" in text:  # the analyst
            edit = {"op": "append", "content": "Give the final answer only.", "rationale": "doc"}
            reply = json.dumps({"edits": [edit]})
        else:
            numbers = [int(n) for n in re.findall(r"-?\d+", text)[-2:]]
            reply = str(sum(numbers)) if numbers else "blue"
        return Completion(text=reply, prompt_tokens=len(text) // 4 + 1, completion_tokens=2)


def scripted_loader(real: Any, loopback: bool) -> Any:
    """`load_model` answering every spec with a `DocModel` (a loopback URL with `real` when
    `loopback`)."""

    def load(spec: Any, **kwargs: Any) -> Any:
        if loopback and isinstance(spec, str) and LOOPBACK.match(spec):
            return real(spec, **kwargs)
        return DocModel(str(spec))

    return load


def install_in_subprocess() -> None:
    """Called by `tests/doc_site/sitecustomize.py` in every Python process a bash example
    starts."""
    if not os.environ.get(SCRIPTED_ENV):
        return
    import selftaught.models
    import selftaught.models.embedded

    selftaught.models.load_model = scripted_loader(selftaught.models.load_model, loopback=True)
    tiny = os.environ.get(TINY_MODEL_ENV)  # unset: no [local] extra, the weights are absent
    if tiny:
        selftaught.models.embedded.embedded_model_dir = lambda: Path(tiny)
