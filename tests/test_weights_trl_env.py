"""GRPO on episodes through TRL's own `environment_factory`: our environments as TRL's, the
fallback template that renders tools exactly as the local backend does, and the episode
reward (failed calls cost soft score, a crashed tool is an error, never a 0)."""

from __future__ import annotations

import json
import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")

from selftaught.models.tools import render_prompt  # noqa: E402
from selftaught.policy import Policy  # noqa: E402
from selftaught.tasks.base import Example  # noqa: E402
from selftaught.tasks.tools.calculator import CalculatorTask  # noqa: E402
from selftaught.tasks.tools.kvstore import KVStoreTask  # noqa: E402
from selftaught.weights.rl import EpisodeReward  # noqa: E402
from selftaught.weights.trl_env import (  # noqa: E402
    SCHEMAS_KWARG,
    environment_factories,
    episode_from_completion,
    trl_tokenizer,
)
from tests.test_episodes import Broken, LookupTask  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from selftaught.models.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


def trl_call(name: str, **arguments: object) -> dict:
    """A tool call as TRL's parser returns it (arguments decoded, no id)."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Move 3 from a to b."},
    {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [trl_call("get", key="a"), trl_call("set", key="b", value=3)],
    },
    {"role": "tool", "name": "get", "content": "7"},
    {"role": "tool", "name": "set", "content": "done"},
    {"role": "assistant", "content": "Answer: 3"},
]


def ours(messages: list[dict]) -> list[dict]:
    """The same conversation as our episodes hold it (arguments as JSON strings, ids)."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for k, c in enumerate(m.get("tool_calls") or []):
            c["id"] = f"c{k}"
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return out


@pytest.mark.parametrize("cut", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("system", [True, False])
def test_the_fallback_template_renders_as_the_local_backend(tokenizer, cut, system) -> None:  # type: ignore[no-untyped-def]
    kv = KVStoreTask(train_size=1)
    schemas = kv.environment(kv.examples("train")[0]).schemas()
    trl_tok = trl_tokenizer(tokenizer)
    messages = CONVERSATION[:cut] if system else CONVERSATION[1:cut]
    for gen in (True, False):
        expected = render_prompt(tokenizer, ours(messages), schemas, add_generation_prompt=gen)
        got = trl_tok.apply_chat_template(
            messages,
            tools=schemas,
            tokenize=False,
            add_generation_prompt=gen,
            **{SCHEMAS_KWARG: {s["function"]["name"]: s for s in schemas}},
        )
        assert got == expected
    assert tokenizer.chat_template != trl_tok.chat_template  # the model's own is untouched


def test_trl_accepts_the_fallback_template_and_parses_its_calls(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    assert not supports_tool_calling(tokenizer)  # SmolLM2's own template drops tools
    trl_tok = trl_tokenizer(tokenizer)
    assert supports_tool_calling(trl_tok) and is_chat_template_prefix_preserving(trl_tok)
    reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    prompt = trl_tok.apply_chat_template([{"role": "user", "content": "?"}], tokenize=False)
    ids = trl_tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    prefix = trl_tok(prompt + "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    parsed = parse_response(trl_tok, ids, prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "2*3"},
    }


def test_environments_as_trl_sees_them() -> None:
    from transformers.utils import get_json_schema

    task = LookupTask()
    classes, env_of, schemas = environment_factories(task, task.examples("test"))
    [cls] = classes.values()
    assert env_of == {"q0": next(iter(classes))} and schemas["lookup"] == Broken().schemas()[0]
    env = cls()
    schema = get_json_schema(env.lookup)  # what TRL derives from the method
    assert schema["function"]["name"] == "lookup"
    assert schema["function"]["parameters"]["required"] == ["key"]
    env.reset(example_id="q0", prompt=[])
    assert env.lookup(key="x") == "value-x"
    assert env.lookup(key="bad") == "error: no such entry"  # refused: a failed call
    assert env.lookup(nokey="x").startswith("error: invalid arguments for lookup")
    assert env.crash is None
    env.lookup(key="crash")
    assert "database is down" in (env.crash or "")
    env.reset(example_id="q0")  # TRL reuses instances: reset forgets the last episode
    assert env.records == [] and env.crash is None


def test_examples_with_different_tool_sets_get_one_environment_each() -> None:
    class Mixed(LookupTask):
        def examples(self, split: str) -> list[Example]:
            return [Example("a", "x", "value-x"), Example("b", "y", "value-y")]

        def environment(self, example: Example):  # type: ignore[no-untyped-def]
            env = Broken()
            if example.id == "b":
                env.tools = ()
            return env

    with pytest.raises(Exception, match="offers no tools"):
        environment_factories(Mixed(), Mixed().examples("test"))
    calc = CalculatorTask(train_size=2, val_size=0, test_size=0)
    kv = KVStoreTask(train_size=2, val_size=0, test_size=0)

    class Both(CalculatorTask):
        def environment(self, example: Example):  # type: ignore[no-untyped-def]
            return (
                kv.environment(kv.examples("train")[0])
                if example.id.endswith("1")
                else (calc.environment(example))
            )

    classes, env_of, schemas = environment_factories(Both(train_size=2), calc.examples("train"))
    assert len(classes) == 2 and len(set(env_of.values())) == 2
    assert {"calculator", "get", "set", "list_keys"} <= set(schemas)


def played(task, example, turns):  # type: ignore[no-untyped-def]
    """Run TRL-shaped turns against our environment as TRL's loop would; returns the
    environment and the completion messages."""
    classes, _, _ = environment_factories(task, [example])
    env = next(iter(classes.values()))()
    env.reset(example_id=example.id)
    completion = []
    for turn in turns:
        completion.append(turn)
        for call in turn.get("tool_calls") or []:
            fn = call["function"]
            method = getattr(env, fn["name"], None)
            result = method(**fn["arguments"]) if method else {"error": "Tool not found."}
            completion.append({"role": "tool", "name": fn["name"], "content": str(result)})
    return env, completion


def test_episode_reward_scores_whole_episodes() -> None:
    task = CalculatorTask(train_size=4, val_size=0, test_size=0)
    examples = task.examples("train")
    ex = examples[0]
    expr = re.sub(r"^What is |\?$", "", str(ex.input))
    if not str(ex.input).startswith("What is "):
        expr = " * ".join(re.findall(r"\d+", str(ex.input))[:2])
    answer = {"role": "assistant", "content": f"Answer: {ex.reference}"}
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [trl_call("calculator", expression=expr)],
    }
    bad = {
        "role": "assistant",
        "content": "",
        "tool_calls": [trl_call("calculator", expression="x")],
    }
    unknown = {"role": "assistant", "content": "", "tool_calls": [trl_call("abacus", a=1)]}
    malformed = {
        "role": "assistant",
        "content": f'<tool_call>{{"name": </tool_call> Answer: {ex.reference}',
    }
    cases = [
        [call, answer],  # solved
        [bad, call, answer],  # a refused input, then recovered
        [unknown, call, answer],  # a tool TRL found no method for
        [malformed],  # a block TRL's parser could not read: failed, not an answer
    ]
    envs, completions = zip(*(played(task, ex, c) for c in cases), strict=True)
    reward = EpisodeReward(task, examples, max_iterations=3, max_completion_length=256)
    values = reward(
        [None] * 4, list(completions), [ex.id] * 4, [[0] * 10] * 4, environments=list(envs)
    )
    assert values == [1.0, 0.75, 0.75, 0.0]
    assert reward.errors == 0
    episode, truncated = episode_from_completion(
        completions[3], envs[3], max_iterations=3, truncated=False
    )
    assert episode.final == "" and episode.tool_errors[0].startswith("malformed tool call")
    assert episode.tool_calls == 1 and not truncated
    episode, _ = episode_from_completion(completions[1], envs[1], max_iterations=3, truncated=False)
    assert [m["role"] for m in episode.trajectory] == ["assistant", "tool"] * 2 + ["assistant"]
    ids = [m["tool_calls"][0]["id"] for m in episode.trajectory if m.get("tool_calls")]
    assert [m["tool_call_id"] for m in episode.trajectory if m["role"] == "tool"] == ids
    assert episode.calls()[1][2] == ex.reference and episode.stop == "answer"


def test_a_crashed_tool_is_an_error_not_a_reward() -> None:
    task = LookupTask()
    [ex] = task.examples("test")
    crash = {"role": "assistant", "content": "", "tool_calls": [trl_call("lookup", key="crash")]}
    good = {"role": "assistant", "content": "", "tool_calls": [trl_call("lookup", key="x")]}
    final = {"role": "assistant", "content": "value-x"}
    e1, c1 = played(task, ex, [crash, final])
    e2, c2 = played(task, ex, [good, final])
    e3, c3 = played(task, ex, [good, good, good])  # never answers: the turn cap
    reward = EpisodeReward(task, [ex], max_iterations=2, max_completion_length=256)
    values = reward([None] * 3, [c1, c2, c3], ["q0"] * 3, [[0]] * 3, environments=[e1, e2, e3])
    assert values == [0.5, 1.0, 0.0]  # the crash gets its group's mean: advantage zero
    assert reward.errors == 1 and "database is down" in reward.error_messages[0]


def test_format_and_judge_rewards_read_the_answer_an_episode_ended_on() -> None:
    """An episode has the format when it ends on an answer (not on a tool call, not cut);
    the judge grades that answer, never the tool traffic."""
    from selftaught.weights.rewards import FormatReward, JudgeReward
    from tests.scripted import ScriptedModel

    task = LookupTask()
    [ex] = task.examples("test")
    call = {"role": "assistant", "content": "", "tool_calls": [trl_call("lookup", key="x")]}
    final = {"role": "assistant", "content": "value-x"}
    answered = played(task, ex, [call, final])
    stuck = played(task, ex, [call, call])  # the turn cap: it never answered
    envs, completions = zip(answered, stuck, answered, strict=True)
    ids = [[1] * 10, [1] * 10, [1] * 256]  # the third reached the cap: cut
    reward = FormatReward(task, [ex], max_completion_length=256)
    values = reward([None] * 3, list(completions), ["q0"] * 3, ids, environments=list(envs))
    assert values == [1.0, 0.0, 0.0]
    graded: list[str] = []

    def grade(messages):  # type: ignore[no-untyped-def]
        graded.append(messages[0]["content"].split("## Reply to grade\n\n")[1].split("\n")[0])
        return '{"score": 10, "reason": "right"}'

    judge = JudgeReward([ex], ScriptedModel(grade))
    assert judge([None], [completions[0]], ["q0"], [[1]], environments=[envs[0]]) == [1.0]
    assert graded == ["value-x"]


@pytest.mark.slow
def test_grpo_plays_episodes_through_trls_environment_loop(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One real GRPO step on the embedded model with TRL's own tool loop; generation is
    scripted (the 135M model rarely calls a tool) so the loop is exercised for sure."""
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from selftaught.models.embedded import embedded_model_dir
    from selftaught.runs import RunDir
    from selftaught.weights.config import BackendConfig, RLConfig
    from selftaught.weights.rl import RLTrainer

    torch.set_num_threads(1)
    monkeypatch.setenv("SELFTAUGHT_THREADS", "1")  # the local model keeps to it too
    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    task = CalculatorTask(train_size=2, val_size=1, test_size=1)
    questions = [str(ex.input) for ex in task.examples("train")]
    seen: list[str] = []

    def scripted(self, prompt_ids, images, fields, num_generations, has_tool_images=False):  # type: ignore[no-untyped-def]
        out = []
        for k, ids in enumerate(prompt_ids):
            text = tok.decode(ids)
            seen.append(text)
            if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
                result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)[-1]
                reply = f"Answer: {result}"
            elif k % 2:
                reply = "Answer: 12"  # a wrong guess without the tool: the group has signal
            else:
                question = next(q for q in questions if q in text)
                if question.startswith("What is "):
                    expr = re.sub(r"^What is |\?$", "", question)
                else:  # "... holds A crates of B items each ..."
                    expr = " * ".join(re.findall(r"\d+", question)[:2])
                call = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
                reply = f"<tool_call>\n{call}\n</tool_call>"
            out.append(tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"])
        return out, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    cfg = RLConfig(
        steps=1,
        num_generations=2,
        prompts_per_step=2,
        max_completion_length=96,
        eval_max_tokens=8,
        backend=BackendConfig(lora_r=2, lora_alpha=4),
    )
    from tests.test_contract import Recorder

    recorder = Recorder()
    result = RLTrainer(
        cfg, task, output_dir=tmp_path / "run", callbacks=[recorder], progress=False
    ).train()
    [row] = RunDir(tmp_path / "run").history()
    # TRL's logged step reaches our callbacks between the start and the trained evaluation
    assert recorder.events == [
        ("start", "grpo"),
        ("evaluate", 0, "val", "base"),
        ("evaluate", 0, "test", "base"),
        ("step", 1),
        ("evaluate", 1, "val", "trained"),
        ("gate", 1, result.gate.decision),
        ("end",),
    ]
    assert recorder.results == [result] and result.method == "grpo"
    assert row["tool_calls_per_completion"] > 0 and row["reward"] == pytest.approx(0.5)
    # every prompt TRL generated from is the one the local backend renders for that turn
    tools = task.environment(task.examples("train")[0]).schemas()
    firsts = [s for s in seen if "<tool_response>" not in s]
    for ex in task.examples("train"):
        expected = render_prompt(tok, Policy().messages(task, ex), tools)
        assert expected in firsts
    followups = [s for s in seen if "<tool_response>" in s]
    assert len(followups) == 2 and all(s.endswith("<|im_start|>assistant\n") for s in followups)
