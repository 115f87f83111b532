"""Batched sampling from an in-process model, scored by the task: k samples per prompt, each
keeping the prompt it was scored on, plus greedy evaluation with a Wilson interval.

Prompts always go through the chat template (raw prompts make chat models ramble and zero
every reward), and truncation by the token cap is recorded on every sample."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.models.base import Completion, GenerationParams, Message
from selftaught.policy import Policy
from selftaught.stats import wilson_interval
from selftaught.tasks.base import Example, Score, Task
from selftaught.tasks.extract import extract_json


class Sampler(Protocol):
    """Anything that answers a batch of chat prompts with k completions each."""

    def generate_batch(
        self, messages_list: Sequence[list[Message]], params: GenerationParams, k: int = 1
    ) -> list[list[Completion]]: ...


class HFGenerator:
    """Batched generation with a transformers causal LM already in memory (left padding,
    chat template, `finish_reason="length"` when the cap cut the reply)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 32):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    def _prompt_text(self, messages: list[Message]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def generate_batch(
        self, messages_list: Sequence[list[Message]], params: GenerationParams, k: int = 1
    ) -> list[list[Completion]]:
        import torch

        tok = self.tokenizer
        out: list[list[Completion]] = []
        # k samples per prompt count against the batch, so chunk prompts accordingly
        per_call = max(1, self.max_batch_size // max(1, k))
        was_training = self.model.training
        self.model.eval()
        eos_ids = self._eos_ids()
        try:
            for start in range(0, len(messages_list), per_call):
                chunk = messages_list[start : start + per_call]
                texts = [self._prompt_text(m) for m in chunk]
                old_side = tok.padding_side
                tok.padding_side = "left"
                enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                tok.padding_side = old_side
                enc = {key: v.to(self.model.device) for key, v in enc.items()}
                sample = params.temperature > 0
                if params.seed is not None:
                    torch.manual_seed(params.seed + start)
                kwargs: dict[str, Any] = {
                    "max_new_tokens": params.max_tokens,
                    "do_sample": sample,
                    "num_return_sequences": k,
                    "pad_token_id": tok.pad_token_id,
                    "eos_token_id": eos_ids,
                }
                if sample:
                    kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
                t0 = time.perf_counter()
                with torch.no_grad():
                    gen = self.model.generate(**enc, **kwargs)
                dt = time.perf_counter() - t0
                prompt_len = enc["input_ids"].shape[1]
                new = gen[:, prompt_len:]
                for i in range(len(chunk)):
                    row: list[Completion] = []
                    n_prompt = int(enc["attention_mask"][i].sum())
                    for j in range(k):
                        ids = new[i * k + j].tolist()
                        stop_at = next((p for p, t in enumerate(ids) if t in eos_ids), None)
                        finish = "stop" if stop_at is not None else "length"
                        ids = ids[:stop_at] if stop_at is not None else ids
                        ids = [t for t in ids if t != tok.pad_token_id]
                        row.append(
                            Completion(
                                text=tok.decode(ids, skip_special_tokens=True),
                                prompt_tokens=n_prompt,
                                completion_tokens=len(ids),
                                latency_s=dt / max(1, len(chunk) * k),
                                finish_reason=finish,
                                model="local",
                            )
                        )
                    out.append(row)
        finally:
            self.model.train(was_training)
        return out

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        for src in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif src:
                ids.update(src)
        return sorted(ids)


class RandomStrategySampler:
    """Round-0 policy of a from-scratch model on a game: the game's own random strategies
    (a random-init transformer cannot write valid JSON, so there would be nothing to keep)."""

    def __init__(self, task: Any, seed: int = 0):
        if not hasattr(task, "random_strategy"):
            raise TypeError(f"task {task.name!r} has no random_strategy(rng); not a game task")
        self.task = task
        self.rng = random.Random(seed)

    def generate_batch(
        self, messages_list: Sequence[list[Message]], params: GenerationParams, k: int = 1
    ) -> list[list[Completion]]:
        return [
            [
                Completion(text=json.dumps(self.task.random_strategy(self.rng)), model="random")
                for _ in range(k)
            ]
            for _ in messages_list
        ]


@dataclass
class Sample:
    """One scored completion. `messages` is the prompt it was sampled and scored on;
    `train_messages` is the prompt it is trained on (the same, except under skill
    distillation, where the teacher skill is dropped); `target` is what is trained on: the
    reply verbatim for agent tasks, the canonical JSON strategy for games."""

    example_id: str
    messages: list[Message]
    train_messages: list[Message]
    completion: str
    target: str
    score: float
    hard: float
    truncated: bool = False
    feedback: str = ""
    completion_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(**d)


def training_target(task: Task, text: str) -> str:
    """Agent tasks train the raw text verbatim; games train the JSON strategy alone."""
    if task.kind != "game":
        return text
    try:
        return json.dumps(extract_json(text), separators=(",", ":"))
    except ValueError:
        return text


def _progress(description: str, total: int, enabled: bool) -> Progress:
    return Progress(
        TextColumn(f"[bold]{description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=True,
    )


def _score(task: Task, text: str, example: Example, truncated: bool) -> Score:
    try:
        score = task.score(text, example)
    except Exception as err:  # a scorer crash on one odd reply is a zero, with the reason
        return Score(0.0, 0.0, f"scorer error: {type(err).__name__}: {err}")
    if truncated and score.hard == 0:
        score = Score(0.0, score.soft, f"{score.feedback} [reply truncated at max_tokens]".strip())
    return score


def sample_and_score(
    sampler: Sampler,
    task: Task,
    examples: Sequence[Example],
    *,
    k: int,
    params: GenerationParams,
    policy: Policy | None = None,
    train_policy: Policy | None = None,
    chunk: int = 32,
    progress: bool = True,
    description: str = "sampling",
) -> list[Sample]:
    """k samples per example from `sampler` with `policy`'s prompt, each scored by the task.
    `train_policy` is the prompt recorded for training (defaults to `policy`)."""
    policy = policy or Policy()
    train_policy = train_policy or policy
    samples: list[Sample] = []
    solved = 0
    per_call = max(1, chunk // max(1, k))
    with _progress(description, len(examples), progress) as bar_ctx:
        bar = bar_ctx.add_task(description, total=len(examples), info="")
        for start in range(0, len(examples), per_call):
            batch = list(examples[start : start + per_call])
            prompts = [policy.messages(task, ex) for ex in batch]
            params_i = GenerationParams(
                **{**params.cache_key(), "seed": (params.seed or 0) + start}
            )
            results = sampler.generate_batch(prompts, params_i, k=k)
            for ex, prompt, completions in zip(batch, prompts, results, strict=True):
                train_prompt = train_policy.messages(task, ex)
                for c in completions:
                    score = _score(task, c.text, ex, c.truncated)
                    solved += int(score.hard)
                    samples.append(
                        Sample(
                            example_id=ex.id,
                            messages=prompt,
                            train_messages=train_prompt,
                            completion=c.text,
                            target=training_target(task, c.text),
                            score=float(score.soft),
                            hard=float(score.hard),
                            truncated=c.truncated,
                            feedback=score.feedback,
                            completion_tokens=c.completion_tokens,
                        )
                    )
            bar_ctx.update(bar, advance=len(batch), info=f"solved {solved}/{len(samples)}")
    return samples


@dataclass
class EvalResult:
    """Greedy evaluation on one split: hard accuracy with its Wilson 95% interval."""

    split: str
    n: int
    solved: int
    accuracy: float
    ci: tuple[float, float]
    mean_soft: float
    truncated: float  # share of replies cut by the token cap
    hard: dict[str, float] = field(default_factory=dict)  # per example id, for paired tests
    seconds: float = 0.0

    def to_dict(self, *, per_example: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = [round(self.ci[0], 4), round(self.ci[1], 4)]
        if not per_example:
            d.pop("hard")
        return d

    def line(self) -> str:
        lo, hi = self.ci
        return (
            f"{self.split}: {self.accuracy:.3f} ({self.solved}/{self.n}, 95% CI {lo:.3f}-{hi:.3f})"
            f", truncated {self.truncated:.0%}"
        )


def evaluate(
    sampler: Sampler,
    task: Task,
    examples: Sequence[Example],
    *,
    split: str,
    max_tokens: int,
    policy: Policy | None = None,
    chunk: int = 32,
    progress: bool = True,
) -> EvalResult:
    """Greedy replies on `examples`, scored by the task."""
    t0 = time.perf_counter()
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, seed=0)
    samples = sample_and_score(
        sampler,
        task,
        examples,
        k=1,
        params=params,
        policy=policy,
        chunk=chunk,
        progress=progress,
        description=f"eval {split}",
    )
    n = len(samples)
    solved = int(sum(s.hard for s in samples))
    return EvalResult(
        split=split,
        n=n,
        solved=solved,
        accuracy=solved / n if n else 0.0,
        ci=wilson_interval(solved, n),
        mean_soft=sum(s.score for s in samples) / n if n else 0.0,
        truncated=sum(s.truncated for s in samples) / n if n else 0.0,
        hard={s.example_id: s.hard for s in samples},
        seconds=time.perf_counter() - t0,
    )
