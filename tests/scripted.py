"""Deterministic scripted chat models and a toy task, for algorithm tests.

- `ScriptedModel(fn)`: a ChatModel whose reply is `fn(messages)`; counts its calls, can fail
  on demand (transient / fatal backend errors, or a hard interrupt after N calls). `fn` may
  return a `Completion` instead of text, e.g. `calls_tools(tool_call("calculator", {...}))`:
  a reply with tool calls in the OpenAI shape (finish_reason "tool_calls").
- `ToyTask`: questions tagged with the rule they need, e.g. "[needs alpha] What is 3 + 4?".
- `rule_target`: a target that answers correctly iff its system prompt mentions the rule the
  question needs (so a skill edit has a known effect on every val example).
- `canned_analyst`: an optimizer whose reply depends on which prompt it got (failure / success
  reflection, merge, repair), with the replies given as strings or callables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message, ToolCall
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.tasks.base import Example, Score

Reply = str | Callable[[list[Message]], str]


class ScriptedModel(AsyncChatModel):
    def __init__(self, fn: Callable[[list[Message]], str | Completion], name: str = "scripted"):
        self.fn = fn
        self.name = name
        self.calls: list[list[Message]] = []
        self.params: list[GenerationParams] = []  # what each call was asked with
        self.fail_at: dict[int, BaseException] = {}  # call index (0-based) -> raised there
        self.fail_after: int | None = None  # raise `interrupt` on every call from this index
        self.interrupt: BaseException = KeyboardInterrupt()

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        i = len(self.calls)
        self.calls.append(messages)
        self.params.append(params)
        if self.fail_after is not None and i >= self.fail_after:
            raise self.interrupt
        if i in self.fail_at:
            raise self.fail_at[i]
        out = self.fn(messages)
        prompt = sum(len(str(m.get("content", ""))) for m in messages)
        if isinstance(out, Completion):
            out.prompt_tokens = out.prompt_tokens or prompt // 4 + 1
            out.completion_tokens = out.completion_tokens or len(out.text) // 4 + 1
            out.model = self.name
            return out
        return Completion(
            text=out,
            prompt_tokens=prompt // 4 + 1,
            completion_tokens=len(out) // 4 + 1,
            model=self.name,
        )


def tool_call(name: str, arguments: dict[str, Any] | str, id: str | None = None) -> ToolCall:
    """One tool call in the OpenAI shape (arguments as a JSON string, or the raw string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call: ToolCall = {"type": "function", "function": {"name": name, "arguments": args}}
    if id is not None:
        call["id"] = id
    return call


def calls_tools(*calls: ToolCall, text: str = "", completion_tokens: int = 0) -> Completion:
    """A reply that calls tools (what a backend returns with finish_reason "tool_calls")."""
    return Completion(
        text=text,
        tool_calls=list(calls),
        finish_reason="tool_calls",
        completion_tokens=completion_tokens,
    )


def tool_results(messages: list[Message]) -> list[str]:
    """The contents of the tool turns in `messages`, in order."""
    return [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]


def system_of(messages: list[Message]) -> str:
    return "\n".join(str(m["content"]) for m in messages if m.get("role") == "system")


def user_of(messages: list[Message]) -> str:
    return "\n".join(str(m["content"]) for m in messages if m.get("role") == "user")


_NEEDS = re.compile(r"\[needs (\w+)\] What is (\d+) \+ (\d+)\?")
POISON = "ALWAYS ANSWER 0"


def rule_answer(messages: list[Message]) -> str:
    """Correct iff the system prompt names the rule the question needs; a POISON rule makes
    every answer wrong."""
    m = _NEEDS.search(user_of(messages))
    if m is None:
        return "I do not know."
    rule, a, b = m.group(1), int(m.group(2)), int(m.group(3))
    system = system_of(messages)
    if POISON in system:
        return "Answer: 0"
    return f"Answer: {a + b}" if f"rule {rule}" in system else f"Answer: {a + b + 1}"


def rule_target(name: str = "scripted-target") -> ScriptedModel:
    return ScriptedModel(rule_answer, name)


def transient(msg: str = "injected 503") -> TransientBackendError:
    return TransientBackendError("scripted", msg, status=503)


def fatal(msg: str = "401 Incorrect API key provided") -> FatalBackendError:
    return FatalBackendError("scripted", msg, status=401)


class ToyTask:
    """Addition questions, each tagged with a rule; `groups` maps rule -> count per split.
    Feedback names the rule, like a real scorer's feedback names what went wrong."""

    kind = "agent"
    instructions = "Reply as 'Answer: N'."

    def __init__(
        self,
        train: dict[str, int] | None = None,
        val: dict[str, int] | None = None,
        test: dict[str, int] | None = None,
        name: str = "toy",
        overlap: bool = False,
    ):
        self.name = name
        self.splits: dict[str, list[Example]] = {}
        sizes = {
            "train": train or {"alpha": 6, "beta": 2},
            "val": val or {"alpha": 5, "beta": 3, "gamma": 2, "delta": 1},
            "test": test or {"alpha": 5, "beta": 3, "gamma": 2},
        }
        offset = {"train": 0, "val": 1000, "test": 2000}
        for split, groups in sizes.items():
            exs = []
            n = 0
            for rule, count in groups.items():
                for _ in range(count):
                    a, b = offset[split] + n, 7 * n + 3
                    if overlap and split == "val" and n == 0:
                        a, b = 0, 3  # the same question as train's first
                    exs.append(
                        Example(
                            id=f"{split}-{n:03d}",
                            input=f"[needs {rule}] What is {a} + {b}?",
                            reference=str(a + b),
                            state={"rule": rule},
                        )
                    )
                    n += 1
            self.splits[split] = exs

    def examples(self, split: str) -> list[Example]:
        return list(self.splits[split])

    def score(self, output: str, example: Example) -> Score:
        m = re.search(r"Answer:\s*(-?\d+)", output)
        got = m.group(1) if m else None
        if got == example.reference:
            return Score(1.0, 1.0, "correct")
        return Score(
            0.0,
            0.0,
            f"expected {example.reference}, got {got!r}: the skill lacks 'rule "
            f"{example.state['rule']}'",
        )


def edits_json(*edits: dict[str, Any]) -> str:
    import json

    return json.dumps({"edits": list(edits)})


def append(content: str) -> dict[str, Any]:
    return {"op": "append", "content": content, "rationale": "scripted"}


def prompt_kind(messages: list[Message]) -> str:
    text = user_of(messages)
    if "## Reply to repair" in text:
        return "repair"
    if "## Proposed edits" in text:
        return "merge"
    if "## Failed attempts" in text:
        return "failure"
    if "## Solved attempts" in text:
        return "success"
    if "## Solved and failed attempts" in text:
        return "contrast"
    return "other"


def canned_analyst(
    failure: Reply = '{"edits": []}',
    success: Reply = '{"edits": []}',
    merge: Reply | None = None,
    repair: Reply = '{"edits": []}',
    contrast: Reply = '{"edits": []}',
    name: str = "scripted-analyst",
) -> ScriptedModel:
    """An optimizer whose reply depends on the prompt kind. `merge=None` returns the first
    proposal's edits unchanged (read back from the merge prompt)."""
    replies = {"failure": failure, "success": success, "repair": repair, "contrast": contrast}

    def answer(messages: list[Message]) -> str:
        kind = prompt_kind(messages)
        if kind == "merge":
            if merge is not None:
                return merge(messages) if callable(merge) else merge
            return _first_proposal(user_of(messages))
        reply = replies.get(kind, "{}")
        return reply(messages) if callable(reply) else reply

    return ScriptedModel(answer, name)


def _first_proposal(prompt: str) -> str:
    import json

    block = prompt.split("### Proposal 1", 1)[1].split("### Proposal 2", 1)[0]
    edits = [json.loads(line[2:]) for line in block.splitlines() if line.startswith("- {")]
    return json.dumps({"edits": edits})


def schedule_of_rules(*rules: str) -> Callable[[list[Message]], str]:
    """Failure reflection that proposes the first rule (in order) that is neither in the skill
    nor in the prompt's rejected-edits section."""

    def answer(messages: list[Message]) -> str:
        text = user_of(messages)
        skill = text.split("<skill>", 1)[1].split("</skill>", 1)[0]
        rejected = ""
        if "## Edits already tried" in text:
            rejected = text.split("## Edits already tried", 1)[1].split("## Your job", 1)[0]
        for rule in rules:
            if rule not in skill and rule not in rejected:
                return edits_json(append(rule))
        return '{"edits": []}'

    return answer


def calculator_agent(messages: list[Message]) -> str | Completion:
    """A correct `tool:calculator` agent: calls the calculator on the question's arithmetic,
    then reports the tool's result."""
    results = tool_results(messages)
    if results:
        return f"Answer: {results[-1]}"
    question = user_of(messages).split("\n\n")[0]
    if question.startswith("What is "):
        expression = question.removeprefix("What is ").rstrip("?")
    else:  # "... holds A crates of B items each ..."
        expression = " * ".join(re.findall(r"\d+", question)[:2])
    return calls_tools(tool_call("calculator", {"expression": expression}))
