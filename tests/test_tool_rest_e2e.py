"""A ReST round on trajectories with the embedded model: `tool:calculator` episodes sampled
by SmolLM2 (with a teacher skill whose worked examples show the call format), trained on the
assistant turns alone, rendered as the local backend renders them."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("trl")


def demo(id: str, question: str, expression: str) -> str:
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    reply = f"<tool_call>\n{call}\n</tool_call>"
    return json.dumps({"id": id, "source": "reference", "input": question, "reply": reply})


TEACHER = "\n".join(
    [
        "Use the calculator tool for the arithmetic: reply with only the tool call. When the "
        "tool responds, reply with: Answer: <the result>",
        "",
        "<!-- selftaught:demos placement=turns -->",
        demo("demo-1", "What is 1234 * 5678?", "1234 * 5678"),
        demo("demo-2", "A shop holds 312 boxes of 45 pens each. How many pens?", "312 * 45"),
        "<!-- /selftaught:demos -->",
        "",
    ]
)


def spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.slow
def test_a_rest_round_on_calculator_episodes_trains_assistant_turns_only(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import torch

    import selftaught
    from selftaught.models.tools import render_prompt, tool_calls_text
    from selftaught.runs import RunDir
    from selftaught.weights import sft
    from selftaught.weights.config import RestConfig, SFTTrainConfig

    torch.set_num_threads(1)
    monkeypatch.setenv("SELFTAUGHT_THREADS", "1")  # the local model keeps to it too
    trained: list[tuple[list, object]] = []
    real = sft.samples_to_dataset

    def recording(samples, tokenizer=None, render=None):  # type: ignore[no-untyped-def]
        dataset = real(samples, tokenizer, render)
        trained.append((list(samples), dataset))
        return dataset

    monkeypatch.setattr(sft, "samples_to_dataset", recording)
    cfg = RestConfig(
        rounds=1,
        samples_per_prompt=2,
        max_tokens=48,
        min_score=0.0,  # keep every scored episode: this test is about what is trained on
        keep_truncated=True,
        teacher_skill=TEACHER,
        gen_batch_size=8,
        sft=SFTTrainConfig(epochs=1, batch_size=2, max_length=1024),
    )
    result = selftaught.train(
        "tool:calculator",
        "local",
        method="rest",
        config=cfg,
        output_dir=tmp_path / "run",
        task_options={"train_size": 3, "val_size": 2, "test_size": 2},
        progress=False,
    )
    rows = RunDir(tmp_path / "run").history()
    assert [r["round"] for r in rows] == [0, 1] and rows[1]["trained"]
    assert rows[1]["sample_tool_use"]["call_share"] > 0  # the teacher got episodes calling it
    assert result.base_test.n == 2
    [(samples, dataset)] = trained
    assert "assistant_masks" in dataset.column_names and len(samples) == len(dataset)
    from transformers import AutoTokenizer

    from selftaught.models.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    calls_trained = 0
    for sample, row in zip(samples, dataset, strict=True):
        ids, mask = row["input_ids"], row["assistant_masks"]
        turns = [m for m in sample.trajectory if m["role"] == "assistant"]
        assert len(spans(mask)) == len(turns)  # one trained span per assistant turn
        for (start, end), turn in zip(spans(mask), turns, strict=True):
            # exactly the turn the model wrote (its calls in the reply format), nothing else
            text = tok.decode(ids[start:end])
            assert tok.decode(ids[:start]).endswith("<|im_start|>assistant\n")
            written = [turn["content"]] if turn["content"] else []
            if turn.get("tool_calls"):
                calls_trained += 1
                written.append(tool_calls_text(turn["tool_calls"]))
            assert text == "\n".join(written) + "<|im_end|>\n"
        # the prompt trained on is the student's (no teacher skill), as the backend renders it
        prompt = render_prompt(tok, sample.train_messages, sample.tools)
        assert tok.decode(ids).startswith(prompt) and "reply with only the tool call" not in prompt
        untrained = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        for m in sample.trajectory:
            if m["role"] == "tool":
                assert f"<tool_response>\n{m['content']}\n</tool_response>" in untrained
    assert calls_trained > 0
