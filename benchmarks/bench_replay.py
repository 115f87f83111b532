"""Replay fidelity: a tool-using deployment simulated through `selftaught proxy`, mined and
replayed. Does every replayed episode send the logged tools, and does a replay of the logged
replies themselves score what they scored live?

The deployment: a fixed, seeded stream of conversations of a function-calling agent with two
tools (`calculator`, `lookup_price`). A scripted upstream (an OpenAI-compatible app, called
through the proxy in-process) answers each request with the next turn of its conversation's
script: tool calls (one, or two in parallel), then a final answer; half the conversations
stream (some with tool-call deltas that leave out `index`, as some servers do), one kind
starts with `tool_choice: "required"`. The client (the "agent app", plain httpx) runs the real
tools, sends the results back as `tool` turns, and gives feedback as a user would: the right
answer as the reference, or a corrected tool call (JSON in the reference, its keys in another
order than the agent wrote them). Its live score is computed from what it saw (the final
answer against the reference, its calls against the corrected one).

Then the log is mined (`selftaught.sleep.night.mine`) and every task replayed as an episode
(`selftaught.sleep.night.replay`) twice: with a model that answers exactly the logged replies
(fidelity: the same score as live, per conversation, and no `not recorded` call), and with a
model that changes every tool call's arguments (a control: each changed call is answered
`not recorded` and counts against the episode). Every replayed request is checked to carry
exactly the logged tools.

    python benchmarks/bench_replay.py                 # 48 conversations
    python benchmarks/bench_replay.py --conversations 12

Results: benchmarks/results/replay.json and the bench_replay section of benchmarks/README.md.
Scripted models only: it runs in seconds.
"""

# No `from __future__ import annotations`: FastAPI reads the upstream's annotations at runtime.
import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams  # noqa: E402
from selftaught.sleep.intake.log import TaskLog  # noqa: E402
from selftaught.sleep.night.replay import call_key  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402
from selftaught.tasks.scorers import reference_scorer, score_reference  # noqa: E402
from selftaught.tasks.tools.calculator import calculate  # noqa: E402

PROJECT = "replay"
FEEDBACK_KEY = "bench-operator-feedback-key"  # the simulated feedback is the operator's
OPERATOR = {"x-api-key": FEEDBACK_KEY}
MODEL = "scripted-agent"
PRICES = {"apples": "1.25", "pears": "2.5", "plums": "0.75", "figs": "3.5", "kiwis": "0.5"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup_price",
            "description": "The unit price of an item, in a currency.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "currency": {"type": "string"}},
                "required": ["item"],
            },
        },
        "strict": False,
    },
]
KINDS = ("calc", "wrong_expression", "price", "parallel", "no_tool", "wrong_item")


# ---- the stream -----------------------------------------------------------------------------


@dataclass
class Plan:
    """One conversation: the request, the agent's turns (the upstream's script), the feedback."""

    kind: str
    question: str
    answer: str  # the right final answer
    turns: list[dict[str, Any]]  # {"content", "calls": [(name, arguments dict)]}
    corrected: dict[str, Any] | None = None  # {"name", "arguments"}: the call the user wanted
    correct_on_first_step: bool = False  # feedback given on the first step's row
    stream: bool = False
    omit_index: bool = False
    tool_choice: str = "auto"
    ids: list[str] = field(default_factory=list)  # the proxy's interaction id of each step
    live: Score | None = None


def _n(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _plan(kind: str, i: int, rng: random.Random) -> Plan:
    a, b, c = _n(rng, 4), _n(rng, 4), _n(rng, 3)
    calc = "calculator"
    if kind in ("calc", "wrong_expression"):
        right = f"{a} * {b} + {c}"
        said = right if kind == "calc" else f"{a} * {b} - {c}"
        value = calculate(said)
        plan = Plan(
            kind,
            f"Order {i}: what is {a} * {b} + {c}?",
            calculate(right),
            [{"calls": [(calc, {"expression": said})]}, {"content": f"Answer: {value}"}],
        )
        if kind == "wrong_expression":
            plan.corrected = {"name": calc, "arguments": {"expression": right}}
        return plan
    if kind in ("price", "wrong_item"):
        item, other = rng.sample(sorted(PRICES), 2)
        k = rng.randint(2, 40)
        asked = item if kind == "price" else other
        value = calculate(f"{k} * {PRICES[asked]}")
        plan = Plan(
            kind,
            f"Order {i}: how much do {k} {item} cost in EUR?",
            calculate(f"{k} * {PRICES[item]}"),
            [
                {"calls": [("lookup_price", {"item": asked, "currency": "EUR"})]},
                {"calls": [(calc, {"expression": f"{k} * {PRICES[asked]}"})]},
                {"content": f"Answer: {value}"},
            ],
            tool_choice="required",
        )
        if kind == "wrong_item":  # the user corrects the first call (keys in another order)
            plan.corrected = {
                "name": "lookup_price",
                "arguments": {"currency": "EUR", "item": item},
            }
            plan.correct_on_first_step = True
        return plan
    if kind == "parallel":
        x, y = calculate(f"{a} * {b}"), calculate(f"{c} * {b}")
        total = calculate(f"{x} + {y}")
        return Plan(
            kind,
            f"Order {i}: what is {a} * {b} plus {c} * {b}?",
            total,
            [
                {
                    "calls": [
                        (calc, {"expression": f"{a} * {b}"}),
                        (calc, {"expression": f"{c} * {b}"}),
                    ]
                },
                {"calls": [(calc, {"expression": f"{x} + {y}"})]},
                {"content": f"Answer: {total}"},
            ],
        )
    right = calculate(f"{a} * {b}")
    return Plan(
        kind, f"Order {i}: what is {a} * {b}?", right, [{"content": f"Answer: {a * 10000}"}]
    )


def make_stream(n: int, seed: int = 0) -> list[Plan]:
    """`n` conversations, the kinds in turn, half streamed (every other streamed one without
    tool-call indexes)."""
    rng = random.Random(f"bench_replay:{seed}")
    plans = []
    for i in range(n):
        plan = _plan(KINDS[i % len(KINDS)], i, rng)
        plan.stream = i % 2 == 1
        plan.omit_index = i % 4 == 3
        plans.append(plan)
    return plans


# ---- the scripted upstream -----------------------------------------------------------------------


def _turn_index(messages: list[dict[str, Any]]) -> int:
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    return sum(1 for m in messages[last_user:] if m.get("role") == "assistant")


def _message(plan: Plan, turn: int) -> dict[str, Any]:
    spec = plan.turns[min(turn, len(plan.turns) - 1)]
    message: dict[str, Any] = {"role": "assistant", "content": spec.get("content")}
    if spec.get("calls"):
        message["tool_calls"] = [
            {
                "id": f"call_{zlib.crc32(plan.question.encode()):08x}_{turn}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for k, (name, args) in enumerate(spec["calls"])
        ]
    return message


def _events(message: dict[str, Any], omit_index: bool) -> Iterator[dict[str, Any]]:
    yield {"role": "assistant", "content": ""}
    text = message.get("content") or ""
    for start in range(0, len(text), 7):
        yield {"content": text[start : start + 7]}
    for k, call in enumerate(message.get("tool_calls") or []):
        head = {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        args = call["function"]["arguments"]
        pieces = [args[j : j + 9] for j in range(0, len(args), 9)]
        for delta in [head] + [{"function": {"arguments": p}} for p in pieces]:
            if not omit_index:
                delta = {"index": k, **delta}
            elif "id" not in delta:
                delta = {"id": call["id"], **delta}  # index-less servers repeat the id
            yield {"tool_calls": [delta]}


def upstream_app(plans: list[Plan]) -> Any:
    """An OpenAI-compatible app that plays each conversation's script."""
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    by_question = {p.question: p for p in plans}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        messages = body["messages"]
        question = next(m["content"] for m in messages if m.get("role") == "user")
        plan = by_question[question]
        message = _message(plan, _turn_index(messages))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return {"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                    "choices": [choice], "usage": usage}  # fmt: skip

        def sse() -> Iterator[bytes]:
            base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            for delta in _events(message, plan.omit_index):
                chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            yield f"data: {json.dumps(end)}\n\n".encode()
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app


# ---- the agent app (the proxy's client) ---------------------------------------------------------


def _read_stream(lines: Iterator[str]) -> dict[str, Any]:
    """The assistant message of a streamed reply (calls grouped by index, or by id without)."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for line in lines:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices") or []:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                if "index" in part:
                    while len(calls) <= part["index"]:
                        calls.append({"id": None, "name": "", "arguments": ""})
                    slot = calls[part["index"]]
                elif not calls or calls[-1]["id"] != part.get("id"):
                    slot = {"id": None, "name": "", "arguments": ""}
                    calls.append(slot)
                else:
                    slot = calls[-1]
                slot["id"] = part.get("id") or slot["id"]
                fn = part.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]  # fmt: skip
    return message


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    if name == "calculator":
        return calculate(arguments["expression"])
    return PRICES.get(arguments.get("item", ""), "unknown item")


def _live_score(plan: Plan, final: str, calls: list[tuple[str, str]]) -> Score:
    """What the user's feedback makes of the live conversation (same checks as a mined task)."""
    example = Example(id=plan.question, input="", reference=plan.answer)
    scores = [score_reference(final, example, reference_scorer(plan.answer))]
    if plan.corrected is not None:
        want = call_key(plan.corrected["name"], plan.corrected["arguments"])
        made = any(call_key(name, args) == want for name, args in calls)
        scores.append(Score(float(made), float(made), ""))
    return Score(float(all(s.hard for s in scores)), sum(s.soft for s in scores) / len(scores))


def converse(client: Any, url: str, plan: Plan) -> None:
    """One conversation through the proxy: request, run the calls, send the results, repeat."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a shop assistant. Use the tools."},
        {"role": "user", "content": plan.question},
    ]
    made: list[tuple[str, str]] = []
    for step in range(10):
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": plan.stream,
                "tool_choice": plan.tool_choice if step == 0 else "auto"}  # fmt: skip
        if plan.stream:
            with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                plan.ids.append(response.headers["x-selftaught-interaction-id"])
                message = _read_stream(response.iter_lines())
        else:
            response = client.post(f"{url}/chat/completions", json=body)
            plan.ids.append(response.headers["x-selftaught-interaction-id"])
            message = response.json()["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            plan.live = _live_score(plan, message.get("content") or "", made)
            return
        for call in message["tool_calls"]:
            fn = call["function"]
            made.append((fn["name"], fn["arguments"]))
            result = run_tool(fn["name"], json.loads(fn["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError(f"conversation {plan.question!r} did not end")


def give_feedback(client: Any, url: str, plan: Plan) -> None:
    """The user's feedback: the right answer, and the corrected call where the agent got one
    wrong (on the first step's row for `wrong_item`, with the answer on the last)."""
    if plan.corrected is None:
        fb = {
            "id": plan.ids[-1],
            "reference": plan.answer,
            "thumb": "up" if plan.live.hard else "down",
        }
        client.post(f"{url}/feedback", json=fb, headers=OPERATOR).raise_for_status()
        return
    call = {"name": plan.corrected["name"], "arguments": plan.corrected["arguments"]}
    if plan.correct_on_first_step:
        first = {"id": plan.ids[0], "reference": json.dumps(call)}
        client.post(f"{url}/feedback", json=first, headers=OPERATOR)
        last = {"id": plan.ids[-1], "reference": plan.answer}
        client.post(f"{url}/feedback", json=last, headers=OPERATOR)
    else:
        ref = {"tool_calls": [call], "answer": plan.answer}
        fb = {"id": plan.ids[-1], "reference": ref, "thumb": "down"}
        client.post(f"{url}/feedback", json=fb, headers=OPERATOR)


@contextlib.contextmanager
def deployment(log_path: Path, plans: list[Plan], home: Path) -> Iterator[tuple[str, Any]]:
    """The proxy (in a thread, logging to `log_path`) in front of the scripted upstream."""
    import httpx

    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background

    transport = httpx.ASGITransport(app=upstream_app(plans))
    upstream = Upstream(httpx.AsyncClient(transport=transport), "http://upstream/v1", None,
                        False, None, False)  # fmt: skip
    config = ProxyConfig(upstream="http://upstream/v1#" + MODEL, project=PROJECT, port=0,
                         log_path=log_path, home=home, inject=False,
                         feedback_key=FEEDBACK_KEY)  # fmt: skip
    with proxy_in_background(config, upstream=upstream) as (url, app):
        yield url, app


def simulate(log_path: Path, plans: list[Plan], home: Path) -> None:
    """Run the stream through the proxy and give the feedback; every row is in the log after."""
    import httpx

    with deployment(log_path, plans, home) as (url, app), httpx.Client(timeout=30) as client:
        for plan in plans:
            converse(client, url, plan)
        assert app.state.proxy.writer.flush(30), "the proxy's log writer did not drain"
        for plan in plans:
            give_feedback(client, url, plan)


# ---- replay --------------------------------------------------------------------------------


class LoggedReplies(AsyncChatModel):
    """Answers each replayed turn with the turn the deployed agent logged (then an empty
    answer); `perturb` changes every call's arguments. Records what each request carried."""

    name = "logged-replies"

    def __init__(self, logged: dict[str, list[dict[str, Any]]], perturb: bool = False):
        self.logged = logged  # the user request -> the logged assistant turns
        self.perturb = perturb
        self.requests: list[tuple[str, GenerationParams]] = []

    async def achat(self, messages: list[dict[str, Any]], params: GenerationParams) -> Completion:
        cut = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        question = str(messages[cut]["content"])
        self.requests.append((question, params))
        turns = self.logged[question]
        k = sum(1 for m in messages[cut:] if m.get("role") == "assistant")
        if k >= len(turns):
            return Completion(text="", prompt_tokens=1, completion_tokens=1)
        turn = turns[k]
        calls = [dict(c, function=dict(c["function"])) for c in turn.get("tool_calls") or []]
        for c in calls if self.perturb else []:
            c["function"]["arguments"] = json.dumps({"expression": "1 + 1", "item": "stones"})
        return Completion(
            text=str(turn.get("content") or ""),
            tool_calls=calls or None,
            finish_reason="tool_calls" if calls else "stop",
            prompt_tokens=1,
            completion_tokens=1,
        )


def mine_log(log_path: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The night's mining over the whole log: (task, tasks, mining report)."""
    from selftaught.sleep.night.cycle import mine
    from selftaught.sleep.night.mine import MineConfig
    from selftaught.sleep.night.replay import night_task

    with TaskLog(log_path) as log:
        rows = log.query()
    tasks, report = mine(rows, MineConfig())
    for t in tasks:
        t.split = "train"
    return night_task(PROJECT, {"train": tasks, "val": [], "test": []}), tasks, report.to_dict()


def replay(task: Any, model: LoggedReplies) -> dict[str, Any]:
    """Every task replayed once by `model`: per task the score, calls and failed calls."""
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, run_rollouts

    cfg = RolloutConfig(concurrency=8, progress=False)
    rollouts = run_rollouts(model, Policy(), task, task.examples("train"), cfg)
    return {r.example_id: r for r in rollouts}


def run(n: int, seed: int = 0) -> dict[str, Any]:
    """Simulate, mine, replay; the figures (and the per-conversation rows)."""
    from selftaught.sleep.night.replay import score_logged

    plans = make_stream(n, seed)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        t0 = time.perf_counter()
        simulate(Path(tmp) / "log.db", plans, Path(tmp) / "home")
        simulated_s = time.perf_counter() - t0
        with TaskLog(Path(tmp) / "log.db") as log:
            rows = {r.id: r for r in log.query()}
        task, tasks, mining = mine_log(Path(tmp) / "log.db")
    examples = {ex.id: ex for ex in task.examples("train")}
    logged = {t.prompt: [m for m in t.state.logged if m["role"] == "assistant"] for t in tasks}
    faithful, perturbed = LoggedReplies(logged), LoggedReplies(logged, perturb=True)
    t0 = time.perf_counter()
    same, wrong = replay(task, faithful), replay(task, perturbed)
    replay_s = time.perf_counter() - t0
    by_question = {p.question: p for p in plans}
    table = []
    for t in tasks:
        plan = by_question[t.prompt]
        r, bad = same[t.id], wrong[t.id]
        table.append({
            "kind": plan.kind, "task": t.id, "steps": len(t.sources), "stream": plan.stream,
            "live": plan.live.soft, "logged": score_logged(examples[t.id]).soft,
            "replay": r.score.soft if r.ok else None, "replay_error": r.error,
            "not_recorded": sum("not recorded" in str(m.get("content")) for m in r.trajectory),
            "perturbed": bad.score.soft if bad.ok else None,
            "perturbed_failed_calls": bad.tool_errors,
        })  # fmt: skip
    tool_rows = {t.prompt: rows[t.sources[0]] for t in tasks}
    exact = sum(p.tools == tool_rows[q].tools == TOOLS for q, p in faithful.requests)
    return {
        "conversations": n,
        "logged_rows": len(rows),
        "rows_with_tool_calls": sum(bool(r.tool_calls) for r in rows.values()),
        "mining": mining,
        "tasks": len(tasks),
        "replayed_requests": len(faithful.requests),
        "requests_with_exactly_the_logged_tools": exact,
        "scores_equal_live": sum(row["replay"] == row["live"] for row in table),
        "hard_live": sum(p.live.hard for p in plans) / n,
        "soft_live": sum(p.live.soft for p in plans) / n,
        "soft_replay": sum(row["replay"] or 0.0 for row in table) / len(table),
        "not_recorded_in_faithful_replay": sum(row["not_recorded"] for row in table),
        "soft_perturbed": sum(row["perturbed"] or 0.0 for row in table) / len(table),
        "perturbed_failed_calls": sum(row["perturbed_failed_calls"] for row in table),
        "simulate_s": round(simulated_s, 2),
        "replay_s": round(replay_s, 2),
        "rows": table,
    }


def _readme(result: dict[str, Any]) -> str:
    from common import markdown_table

    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in result["rows"]:
        kinds.setdefault(row["kind"], []).append(row)
    table = markdown_table(
        ["kind", "conversations", "steps each", "live soft", "replay soft", "equal",
         "perturbed soft"],
        [
            [k, len(rs), rs[0]["steps"], f"{sum(r['live'] for r in rs) / len(rs):.2f}",
             f"{sum(r['replay'] or 0 for r in rs) / len(rs):.2f}",
             f"{sum(r['replay'] == r['live'] for r in rs)}/{len(rs)}",
             f"{sum(r['perturbed'] or 0 for r in rs) / len(rs):.2f}"]
            for k, rs in kinds.items()
        ],
    )  # fmt: skip
    m = result["machine"]
    return (
        f"{result['conversations']} conversations ({result['logged_rows']} logged requests, "
        f"{result['rows_with_tool_calls']} of them answered with tool calls) mined into "
        f"{result['tasks']} tasks. Replayed requests carrying exactly the logged tools: "
        f"**{result['requests_with_exactly_the_logged_tools']}/{result['replayed_requests']}**. "
        f"Replay of the logged replies scoring what they scored live: "
        f"**{result['scores_equal_live']}/{result['tasks']}** (mean soft live "
        f"{result['soft_live']:.3f}, replay {result['soft_replay']:.3f}; `not recorded` calls: "
        f"{result['not_recorded_in_faithful_replay']}). Control, every call's arguments changed: "
        f"mean soft {result['soft_perturbed']:.3f}, {result['perturbed_failed_calls']} calls "
        f"answered `not recorded`.\n\n{table}\n\n"
        f"Simulation {result['simulate_s']} s, both replays {result['replay_s']} s; "
        f"{m['date']}, {m['cpu_count']} CPUs, load {m['loadavg']}. `{result['command']}`"
    )


def main() -> None:
    from common import RESULTS, command_line, machine_info, write_tables

    from selftaught.runs import atomic_write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    result = run(args.conversations, args.seed)
    result.update(machine=machine_info(), command=command_line())
    atomic_write_json(RESULTS / "replay.json", result)
    if not args.no_readme:
        write_tables()
    print(_readme(result))


if __name__ == "__main__":
    main()
