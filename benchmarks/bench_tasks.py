"""The peer benchmark's tasks: every spec `bench_peers.py` accepts, built the same way by the
benchmark (scoring) and by `peers/driver.py` (each system's run), so all of them see the very
same examples and the same scorer.

- `gym:NAME[?k=v&...]`: a reasoning-gym generator (`selftaught.tasks.load_task`), seeded splits
  of exactly the benchmark's sizes. Beyond arithmetic: `gym:word_sorting` (an instruction to
  follow and a format to keep: a comma-separated list in a given order), `gym:syllogism`
  (a Yes / No classification), `gym:needle_haystack` (extraction: the one name a long text
  holds the answer for).
- `judge:NAME`: a sample set of the OpenAI evals registry (read from the `evals==3.0.1.post1`
  wheel, which `peers/setup.sh` downloads with `--no-deps`; nothing of evals is imported),
  written as a JSONL task with `scorer: llm_judge` and a rubric, the judge being the model
  behind the benchmark's `judge` route (its calls are counted apart). Its rows are shuffled
  with the seed and cut to the benchmark's sizes, each row's `split` written in the file.

Run as a script it is a design tool (dev seeds, train or val only): the seed prompt's score on
a task, the check that decides whether a candidate task stays (neither 0 nor 1):

    python benchmarks/bench_tasks.py judge:abstract2title --model local:<Qwen GGUF> --seed 0
"""

from __future__ import annotations

import argparse
import json
import random
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVALS_WHEEL_NAME = "evals-3.0.1.post1-py3-none-any.whl"
EVALS_WHEEL = Path("~/.cache/selftaught/bench") / EVALS_WHEEL_NAME
TASK_FILES = Path(__file__).resolve().parent.parent / "runs" / "bench" / "tasks"


@dataclass(frozen=True)
class JudgeSet:
    """An evals registry sample set scored by a judge against a rubric."""

    path: str  # inside the wheel
    rubric: str
    instructions: str = ""


JUDGE_SETS: dict[str, JudgeSet] = {
    "abstract2title": JudgeSet(
        "evals/registry/data/abstract2title/samples.jsonl",
        rubric=(
            "The reply is one title for the abstract in the question. Score 10 for a title that "
            "names the study's specific subject and main finding as the reference title does, "
            "in one line of at most 20 words; 7 for a faithful, specific title that misses part "
            "of it; 3 or less for a generic, wrong or multi-sentence reply, or one that adds "
            "commentary around the title."
        ),
        instructions="Reply with the title only, on one line.",
    ),
}


def task_kind(spec: str) -> str:
    """`gym` or `judge`; anything else is refused in one sentence."""
    kind = spec.split(":", 1)[0]
    if kind not in ("gym", "judge") or ":" not in spec:
        raise SystemExit(
            f"task {spec!r}: the peer benchmark takes gym:NAME[?k=v&...] or judge:NAME "
            f"(judge sets: {', '.join(JUDGE_SETS)})"
        )
    if kind == "judge" and spec.removeprefix("judge:") not in JUDGE_SETS:
        raise SystemExit(f"task {spec!r}: unknown judge set; known: {', '.join(JUDGE_SETS)}")
    return kind


def needs_judge(spec: str) -> bool:
    return task_kind(spec) == "judge"


def build_task(
    spec: str,
    *,
    seed: int,
    train_size: int,
    val_size: int,
    test_size: int,
    judge_model: Any = None,
    judge_timeout_s: float = 900.0,
    wheel: Path = EVALS_WHEEL,
) -> Any:
    """The task of `spec` with seeded splits of these sizes (`judge_model`: a model spec or
    ChatModel, required by `judge:` tasks; a spec gets the benchmark's call timeout: a judge
    reads a long prompt, on a shared CPU the default timeout gave up on it)."""
    from selftaught.tasks import load_task

    if task_kind(spec) == "gym":
        return load_task(
            spec, seed=seed, train_size=train_size, val_size=val_size, test_size=test_size
        )
    if judge_model is None:
        raise SystemExit(f"task {spec!r} is scored by a judge: give it a judge model")
    name = spec.removeprefix("judge:")
    path = write_judge_jsonl(name, seed, (train_size, val_size, test_size), wheel)
    return judge_task(name, path, judge_model, seed, judge_timeout_s)


def judge_task(name: str, path: Path, judge_model: Any, seed: int, timeout_s: float) -> Any:
    from selftaught.models import load_model
    from selftaught.tasks.jsonl import JsonlTask

    if isinstance(judge_model, str):
        model = load_model(judge_model, timeout_s=timeout_s)
    else:
        model = judge_model
    js = JUDGE_SETS[name]
    return JsonlTask(
        path,
        scorer="llm_judge",
        judge_model=model,
        rubric=js.rubric,
        seed=seed,
        name=name,
        instructions=js.instructions,
    )


def evals_rows(inner: str, wheel: Path = EVALS_WHEEL) -> list[dict[str, Any]]:
    """The JSON lines of one registry file, read from the evals wheel."""
    wheel = wheel.expanduser()
    if not wheel.exists():
        raise SystemExit(f"{wheel} is missing; run: bash benchmarks/peers/setup.sh")
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(inner).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def judge_rows(
    name: str, seed: int, sizes: tuple[int, int, int], wheel: Path = EVALS_WHEEL
) -> list[dict[str, Any]]:
    """The set's rows, shuffled with `seed`, cut to train / val / test of `sizes`; each row in
    the JSONL task format (`input` as a chat list without the registry's system turn, whose
    instruction goes first in the user turn; `reference` the registry's `ideal`; `split`)."""
    rows = evals_rows(JUDGE_SETS[name].path, wheel)
    if sum(sizes) > len(rows):
        raise SystemExit(
            f"judge:{name} has {len(rows)} rows; train + val + test = {sum(sizes)} do not fit"
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    out, start = [], 0
    for split, size in zip(("train", "val", "test"), sizes, strict=True):
        for i in order[start : start + size]:
            out.append({"id": f"{name}-{i}", **_as_question(rows[i]), "split": split})
        start += size
    return out


def _as_question(row: dict[str, Any]) -> dict[str, Any]:
    turns = row["input"] if isinstance(row["input"], list) else [{"content": row["input"]}]
    system = " ".join(t["content"].strip() for t in turns if t.get("role") == "system")
    user = "\n\n".join(t["content"].strip() for t in turns if t.get("role", "user") == "user")
    ideal = row["ideal"][0] if isinstance(row["ideal"], list) else row["ideal"]
    return {"input": f"{system}\n\n{user}".strip(), "reference": str(ideal).strip()}


def write_judge_jsonl(
    name: str, seed: int, sizes: tuple[int, int, int], wheel: Path = EVALS_WHEEL
) -> Path:
    from selftaught.runs import atomic_write_text

    path = TASK_FILES / f"{name}_s{seed}_{'-'.join(map(str, sizes))}.jsonl"
    rows = judge_rows(name, seed, sizes, wheel)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if not path.exists() or path.read_text(encoding="utf-8") != body:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, body)
    return path


def devcheck(
    spec: str,
    model: Any,
    *,
    seed: int,
    split: str,
    sizes: Sequence[int],
    out: Path,
    wheel: Path = EVALS_WHEEL,
) -> Any:
    """The seed prompt of the report settings scored on `split` of `spec`, built as the
    benchmark builds it (a judge task's judge is `model` too, loaded once); per item to
    `out`."""
    from protocol import check_design_use, load_report_settings

    import selftaught
    from selftaught.models import GenerationParams, load_model
    from selftaught.rollout import RolloutConfig

    check_design_use("bench_tasks.py", seeds=[seed], splits=[split])
    settings = load_report_settings()["settings"]
    timeout_s = float(settings["timeout_s"])
    if isinstance(model, str):
        model = load_model(model, timeout_s=timeout_s)
    task = build_task(
        spec,
        seed=seed,
        train_size=sizes[0],
        val_size=sizes[1],
        test_size=sizes[2],
        judge_model=model if needs_judge(spec) else None,
        judge_timeout_s=timeout_s,
        wheel=wheel,
    )
    params = GenerationParams(max_tokens=settings["max_tokens"], temperature=0.0)
    rollout = RolloutConfig(concurrency=settings["concurrency"], timeout_s=timeout_s, params=params)
    return selftaught.evaluate(
        task,
        model,
        skill=settings["seed_prompt"],
        split=split,  # type: ignore[arg-type]
        rollout=rollout,
        output=out,
    )


def main(argv: list[str] | None = None) -> None:
    from common import RESULTS
    from protocol import load_report_settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="gym:NAME[?k=v&...] or judge:NAME")
    parser.add_argument("--model", required=True, help="target (and judge) model spec")
    parser.add_argument("--seed", type=int, default=0, help="a dev seed")
    parser.add_argument("--split", default="val", choices=("train", "val"))
    parser.add_argument("--sizes", type=int, nargs=3, metavar=("TRAIN", "VAL", "TEST"),
                        help="split sizes (default: the report settings')")  # fmt: skip
    parser.add_argument("--output", type=Path, help="per-item JSONL (default: results/devcheck_"
                        "<task>_<split>_seed<seed>.jsonl)")  # fmt: skip
    a = parser.parse_args(argv)
    task_kind(a.spec)  # an unknown spec is refused before any model loads
    frozen = load_report_settings()["settings"]
    sizes = a.sizes or [frozen["train"], frozen["val"], frozen["test"]]
    name = a.spec.split(":", 1)[1].split("?")[0]
    out = a.output or RESULTS / f"devcheck_{name}_{a.split}_seed{a.seed}.jsonl"
    result = devcheck(a.spec, a.model, seed=a.seed, split=a.split, sizes=sizes, out=out)
    print(f"{a.spec} {a.split} seed {a.seed}: {result}")
    print(f"per item: {out}")


if __name__ == "__main__":
    main()
