"""A tool-using interaction logged through `selftaught proxy` with the embedded model
(SmolLM2-135M, `--upstream local`) upstream, then a night that replays it as an episode. The
mechanics are asserted (the log holds the tools and tool turns, every replayed request carried
the logged tools, the night ended with a status and diagnostics), not a gain."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.sleep.intake.log import TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ID_HEADER, ProxyConfig, proxy_in_background  # noqa: E402
from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night  # noqa: E402
from selftaught.sleep.night.split import SplitConfig  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402

pytestmark = pytest.mark.local
CALC = [
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
    }
]


@pytest.fixture
def embedded_available():
    pytest.importorskip("transformers")
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")


def conversation(a: int, b: int) -> list[dict]:
    """An agent's request after its calculator call came back: the model has to answer."""
    call = {
        "id": f"call_{a}",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{a} * {b}"})},
    }
    return [
        {"role": "system", "content": "Use the calculator tool, then answer 'Answer: N'."},
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{a}", "content": str(a * b)},
    ]


@pytest.mark.slow  # the embedded model answers every replayed turn: ~1-2 min on 2 busy cores
def test_a_tool_using_interaction_through_the_proxy_is_replayed_by_a_night(
    tmp_path, embedded_available
):
    home, log_path = tmp_path / "home", tmp_path / "log.db"
    config = ProxyConfig(upstream="local", port=0, project="tools", log_path=log_path, home=home)
    pairs = [(1234, 5678), (4321, 8765), (2468, 1357)]
    with (
        FakeUpstream(lambda _: '{"edits": []}') as analyst,
        proxy_in_background(config) as (
            url,
            app,
        ),
    ):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        ids = []
        for a, b in pairs:
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=conversation(a, b),
                tools=CALC,
                max_tokens=16,
                temperature=0,
            )
            ids.append(raw.headers[ID_HEADER])
        assert app.state.proxy.writer.flush(30)
        for (a, b), iid in zip(pairs, ids, strict=True):
            fb = {"id": iid, "reference": str(a * b)}
            assert loopback.post(f"{url}/feedback", json=fb).status_code == 200
        log = TaskLog(log_path)
        rows = [log.get(i) for i in ids]
        assert all(r.tools == CALC and r.messages[-1]["role"] == "tool" for r in rows)
        assert rows[0].messages[2]["tool_calls"][0]["function"]["name"] == "calculator"

        training = dataclasses.replace(night_training_defaults(), max_tokens=48, concurrency=4)
        night_config = NightConfig(
            project="tools",
            home=home,
            log_path=log_path,
            optimizer_model=f"{analyst.base_url}#fake-model",
            documents=("skill",),
            split=SplitConfig(min_train=1, min_val=2),
            training=training,
        )
        (night,) = run_night(night_config)  # the target: `local`, the upstream the proxy logged
    assert night.models.target == "local"
    assert night.status in ("no_proposal", "staged"), night.reason
    assert night.mining.tasks == 3 and night.mining.by_check == {"reference": 3}
    d = night.night_dir
    evidence = [json.loads(line) for line in (d / "evidence.jsonl").read_text().splitlines()]
    target = [e for e in evidence if e["role"] == "target"]
    assert target and all(e["params"]["tools"] == CALC for e in target)  # the logged tools
    assert all(e["messages"][-1]["role"] in ("user", "tool") for e in target)
    diag = json.loads((d / "diagnostics.json").read_text())
    assert diag["val_before"] and all("trajectory" in row for row in diag["val_before"])
    tasks = [json.loads(line) for line in (d / "tasks.jsonl").read_text().splitlines()]
    assert all("episode: 1 tools, 1 recorded results" in t["checks"] for t in tasks)
