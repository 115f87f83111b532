"""ReST on trajectories: episodes become samples with their trajectory, and fine-tuning
trains on the assistant turns only (tool results masked out of the loss)."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.models.base import Message  # noqa: E402
from selftaught.policy import Policy  # noqa: E402
from selftaught.rollout import RolloutConfig, run_rollouts  # noqa: E402
from selftaught.tasks.tools.calculator import CalculatorTask  # noqa: E402
from selftaught.weights.config import ConfigError  # noqa: E402
from selftaught.weights.elite import select_elite  # noqa: E402
from selftaught.weights.sampling import Sample, samples_from_rollouts  # noqa: E402
from selftaught.weights.sft import (  # noqa: E402
    episode_tokens,
    local_render,
    samples_to_dataset,
    template_render,
)
from tests.scripted import ScriptedModel, calculator_agent  # noqa: E402


def chatml_with_tools(messages: list[Message], tools: list | None, gen: bool) -> str:
    """A ChatML renderer that writes tool calls as <tool_call> JSON (as Qwen2.5's does)."""
    out = ""
    if tools:
        out += "<|im_start|>system\nTools: " + json.dumps(tools) + "<|im_end|>\n"
    for m in messages:
        body = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            body += f"<tool_call>{json.dumps({'name': fn['name'], 'arguments': fn['arguments']})}"
            body += "</tool_call>"
        out += f"<|im_start|>{m['role']}\n{body}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" if gen else "")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from selftaught.models.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


@pytest.fixture(scope="module")
def episode_samples() -> list[Sample]:
    task = CalculatorTask(train_size=3, val_size=0, test_size=0)
    examples = task.examples("train")
    rollouts = run_rollouts(
        ScriptedModel(calculator_agent), Policy(), task, examples, RolloutConfig(progress=False)
    )
    return samples_from_rollouts(task, examples, rollouts, Policy())


def test_episodes_become_trajectory_samples(episode_samples: list[Sample]) -> None:
    s = episode_samples[0]
    assert [m["role"] for m in s.trajectory] == ["assistant", "tool", "assistant"]
    assert s.tools and s.tools[0]["function"]["name"] == "calculator"
    assert json.loads(s.target) == s.trajectory and s.hard == 1.0
    assert Sample.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    kept, stats = select_elite(episode_samples + episode_samples)  # dedupe on whole episodes
    assert len(kept) == 3 and stats.duplicates == 3


def test_only_assistant_turns_are_trained_on(tokenizer, episode_samples) -> None:  # type: ignore[no-untyped-def]
    s = episode_samples[0]
    row = episode_tokens(tokenizer, s, chatml_with_tools)
    ids, mask = row["input_ids"], row["assistant_masks"]
    assert len(ids) == len(mask)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call, result, final = s.trajectory
    name = call["tool_calls"][0]["function"]["name"]
    # both assistant turns, with their end-of-turn tokens; not the tool result nor the prompt
    assert trained.count("<|im_end|>") == 2 and f'"name": "{name}"' in trained
    assert final["content"] in trained
    untrained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert f"<|im_start|>tool\n{result['content']}<|im_end|>" in untrained
    assert result["content"] not in trained.replace(final["content"], "")
    assert "What is" not in trained and "<|im_start|>assistant" not in trained


def test_a_template_that_drops_tool_calls_is_refused(tokenizer, episode_samples) -> None:  # type: ignore[no-untyped-def]
    # SmolLM2's own template has no tools section: training would silently drop the calls
    with pytest.raises(ConfigError, match="dropped the tool call 'calculator'"):
        samples_to_dataset(episode_samples, tokenizer, template_render(tokenizer))


def test_episodes_train_on_the_text_the_local_backend_generated_from(
    tokenizer, episode_samples
) -> None:  # type: ignore[no-untyped-def]
    from selftaught.models.tools import render_prompt

    s = episode_samples[0]
    ds = samples_to_dataset(episode_samples, tokenizer)  # default: the local backend's renderer
    row = ds[0]
    ids, mask = row["input_ids"], row["assistant_masks"]
    assert row == episode_tokens(tokenizer, s, local_render(tokenizer))
    # each assistant turn starts right where the prompt the backend generated it from ends,
    # token for token (no merge across the boundary)
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    assert len(starts) == 2
    for start, k in zip(starts, (0, 2), strict=True):
        prompt = render_prompt(tokenizer, s.messages + s.trajectory[:k], s.tools)
        assert ids[:start] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    call, result, final = s.trajectory
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    expr = json.loads(call["tool_calls"][0]["function"]["arguments"])["expression"]
    block = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    assert (
        trained == f"<tool_call>\n{block}\n</tool_call><|im_end|>\n{final['content']}<|im_end|>\n"
    )
    untrained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "# Tools" in untrained and f"<tool_response>\n{result['content']}\n</tool_response>" in (
        untrained
    )


def test_one_step_samples_keep_the_prompt_completion_rows(tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": "1 + 1?"}]
    ds = samples_to_dataset([Sample("e", msgs, msgs, "2", "2", 1.0, 1.0)], tokenizer)
    assert ds.column_names == ["prompt", "completion"]


def test_sft_trains_on_episodes(episode_samples) -> None:  # type: ignore[no-untyped-def]
    import torch

    from selftaught.weights.config import BackendConfig, SFTTrainConfig
    from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer
    from selftaught.weights.sft import sft_train

    torch.set_num_threads(1)
    tok = scratch_tokenizer()
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=2, scratch_width=32, scratch_heads=2), seed=0
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = SFTTrainConfig(
        epochs=1, batch_size=3, learning_rate=1e-2, warmup_ratio=0.0, max_length=512
    )
    stats = sft_train(
        model,
        tok,
        episode_samples,
        cfg,
        backend="scratch",
        progress=False,
        render=chatml_with_tools,
    )
    assert stats["steps"] == 1 and stats["train_samples"] == 3
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
