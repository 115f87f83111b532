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

and, for a judge task, `--judge-check`: whether the judge can grade at all. Each item's own
reference is judged as a reply (it must pass) and so is the nearest other reference of the
registry file that differs from it (it must fail: for a story with several questions, another
place of the same story). The judge grades when it passes at least 80% of the references and at
most 20% of the wrong ones (`JUDGE_RULE`, written before any check ran); a judge that cannot
tell the two apart makes any score of the task noise. The verdict is saved beside the
judgements (`<output>.summary.json`); `bench_peers.py --report` runs a judge task only when one
records its judge grading it.
"""

from __future__ import annotations

import argparse
import json
import random
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVALS_WHEEL_NAME = "evals-3.0.1.post1-py3-none-any.whl"
EVALS_WHEEL = Path("~/.cache/selftaught/bench") / EVALS_WHEEL_NAME
TASK_FILES = Path(__file__).resolve().parent.parent / "runs" / "bench" / "tasks"
JUDGE_TEMPLATES = Path(__file__).resolve().parent / "judges"


@dataclass(frozen=True)
class JudgeSet:
    """An evals registry sample set scored by a judge against a rubric."""

    path: str  # inside the wheel
    rubric: str
    instructions: str = ""
    # rows whose questions share this key (a story asked several questions) count as one: one
    # of them, drawn with the seed, is kept, so no story sits in two splits
    group_key: Callable[[str], str] | None = None
    # the judge's prompt (a file under benchmarks/judges/), else selftaught's packaged one
    judge_template: str | None = None


def _story(question: str) -> str:
    return question.rsplit(". ", 1)[0]


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
    "tomi": JudgeSet(
        "evals/registry/data/theory_of_mind/tomi/test.jsonl",
        rubric=(
            "Score 10 when the place the reply gives as its answer is the reference place "
            "(wording may differ: 'green_box', 'the green box' and 'It is in the green box.' "
            "are the same place); score 0 when it gives another place, several places without "
            "choosing one, or no place."
        ),
        instructions="Answer with the place.",
        group_key=_story,
        judge_template="compare.md",
    ),
}
JUDGE_RULE = (0.8, 0.2)  # a judge grades: passes >= 80% of references, <= 20% of wrong ones


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
    from selftaught.tasks.scorers import LlmJudge

    if isinstance(judge_model, str):
        model = load_model(judge_model, timeout_s=timeout_s)
    else:
        model = judge_model
    js = JUDGE_SETS[name]
    template = JUDGE_TEMPLATES / js.judge_template if js.judge_template else None
    return JsonlTask(
        path,
        scorer=LlmJudge(model, js.rubric, template=template),
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
    js = JUDGE_SETS[name]
    rows = evals_rows(js.path, wheel)
    order = list(range(len(rows)))
    rng = random.Random(seed)
    if js.group_key is not None:
        groups: dict[str, list[int]] = {}
        for i in order:
            groups.setdefault(js.group_key(_as_question(rows[i])["input"]), []).append(i)
        order = [rng.choice(members) for members in groups.values()]
    if sum(sizes) > len(order):
        unit = "groups" if js.group_key is not None else "rows"
        raise SystemExit(
            f"judge:{name} has {len(order)} {unit}; train + val + test = {sum(sizes)} do not fit"
        )
    rng.shuffle(order)
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


def _design_task(
    spec: str, model: Any, seed: int, split: str, sizes: Sequence[int], wheel: Path
) -> tuple[dict[str, Any], Any, Any]:
    """(report settings, model, task) for a design check on dev data: the task built as the
    benchmark builds it (a judge task's judge is `model` too, loaded once)."""
    from protocol import check_design_use, load_report_settings

    from selftaught.models import load_model

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
    return settings, model, task


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
    """The seed prompt of the report settings scored on `split` of `spec`; per item to `out`."""
    import selftaught
    from selftaught.models import GenerationParams
    from selftaught.rollout import RolloutConfig

    settings, model, task = _design_task(spec, model, seed, split, sizes, wheel)
    timeout_s = float(settings["timeout_s"])
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


def wrong_references(name: str, ids: Sequence[str], wheel: Path = EVALS_WHEEL) -> dict[str, str]:
    """For each item id (`NAME-ROW`), a wrong answer of the same kind: the registry file's
    nearest other reference (row +1, -1, +2, ...) that differs from the item's own, taken from
    the item's own group (its story's other questions) when the set has groups."""
    js = JUDGE_SETS[name]
    questions = [_as_question(r) for r in evals_rows(js.path, wheel)]
    refs = [q["reference"] for q in questions]
    key = js.group_key or (lambda _: "")
    groups = [key(q["input"]) for q in questions]  # once per row, not once per row and item
    out = {}
    for example_id in ids:
        row = int(example_id.rsplit("-", 1)[1])
        own = refs[row].casefold()
        near = [j for step in range(1, len(refs)) for j in (row + step, row - step)]
        differ = [j for j in near if 0 <= j < len(refs) and refs[j].casefold() != own]
        same = [j for j in differ if groups[j] == groups[row]]
        if differ:
            out[example_id] = refs[(same or differ)[0]]
    return out


def judgecheck(
    spec: str,
    model: Any,
    *,
    seed: int,
    split: str,
    sizes: Sequence[int],
    out: Path,
    wheel: Path = EVALS_WHEEL,
) -> dict[str, Any]:
    """Whether the judge of a judge task can grade: every item of `split` judged twice, with its
    own reference as the reply (should pass) and with a wrong reference (should fail); per
    judgement to `out` (JSONL), the counts with the verdict under `JUDGE_RULE` returned and
    saved beside it (`<out>.summary.json`, what a report run looks for: `passing_judge_check`)."""
    from selftaught.errors import BackendError
    from selftaught.runs import atomic_write_json, atomic_write_text

    if not needs_judge(spec):
        raise SystemExit(f"--judge-check: {spec!r} is not a judge task")
    name = spec.removeprefix("judge:")
    judge_name = model if isinstance(model, str) else str(getattr(model, "name", model))
    settings, model, task = _design_task(spec, model, seed, split, sizes, wheel)
    examples = task.examples(split)
    wrong = wrong_references(name, [ex.id for ex in examples], wheel)
    cases = [(ex, "reference", ex.reference) for ex in examples]
    cases += [(ex, "wrong", wrong[ex.id]) for ex in examples if ex.id in wrong]

    def judge(case: tuple[Any, str, str]) -> dict[str, Any]:
        ex, kind, reply = case
        row = {"example_id": ex.id, "case": kind, "reply": reply}
        try:
            score = task.score(reply, ex)
        except BackendError as err:  # a broken judge is an error, never a verdict
            return row | {"error": str(err)}
        return row | {"passed": score.hard == 1.0, "feedback": score.feedback}

    with ThreadPoolExecutor(max_workers=int(settings["concurrency"])) as pool:
        rows = list(pool.map(judge, cases))
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary: dict[str, Any] = {"errors": sum("error" in r for r in rows)}
    for kind in ("reference", "wrong"):
        judged = [r for r in rows if r["case"] == kind and "error" not in r]
        summary[kind] = (sum(r["passed"] for r in judged), len(judged))
    (ref_pass, n_ref), (wrong_pass, n_wrong) = summary["reference"], summary["wrong"]
    summary["grades"] = bool(
        n_ref and n_wrong and ref_pass >= JUDGE_RULE[0] * n_ref
        and wrong_pass <= JUDGE_RULE[1] * n_wrong
    )  # fmt: skip
    record = {"spec": spec, "judge": judge_name, "seed": seed, "split": split,
              "sizes": list(sizes), "rule": list(JUDGE_RULE), **summary}  # fmt: skip
    atomic_write_json(summary_path(out), record)
    return summary


def summary_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")


def passing_judge_check(spec: str, judge: str, results: Path) -> Path | None:
    """A saved judge check (`judgecheck_*.summary.json` in `results`) in which `judge` graded
    the task `spec`, if there is one: a judge task's report rows need it."""
    home = str(Path.home())  # `local:~/...` and `local:/root/...` name the same model
    want = judge.replace("~", home)
    for path in sorted(results.glob("judgecheck_*.summary.json")):
        record = json.loads(path.read_text())
        same = record.get("spec") == spec and record.get("judge", "").replace("~", home) == want
        if same and record.get("grades") is True:
            return path
    return None


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
    parser.add_argument(
        "--judge-check",
        action="store_true",
        help="a judge task: can its judge tell a reference from a wrong answer?",
    )
    parser.add_argument("--output", type=Path, help="per-item JSONL (default: results/devcheck_"
                        "<task>_<split>_seed<seed>.jsonl, or judgecheck_...)")  # fmt: skip
    a = parser.parse_args(argv)
    task_kind(a.spec)  # an unknown spec is refused before any model loads
    frozen = load_report_settings()["settings"]
    sizes = a.sizes or [frozen["train"], frozen["val"], frozen["test"]]
    name = a.spec.split(":", 1)[1].split("?")[0]
    tool = "judgecheck" if a.judge_check else "devcheck"
    out = a.output or RESULTS / f"{tool}_{name}_{a.split}_seed{a.seed}.jsonl"
    kwargs = {"seed": a.seed, "split": a.split, "sizes": sizes, "out": out}
    if a.judge_check:
        c = judgecheck(a.spec, a.model, **kwargs)
        (ref_pass, n_ref), (wrong_pass, n_wrong) = c["reference"], c["wrong"]
        verdict = "grades" if c["grades"] else "cannot grade"
        print(f"{a.spec} {a.split} seed {a.seed}: the judge passed {ref_pass}/{n_ref} references "
              f"and {wrong_pass}/{n_wrong} wrong answers ({c['errors']} judge errors): it "
              f"{verdict} (rule: >= {JUDGE_RULE[0]:.0%} and <= {JUDGE_RULE[1]:.0%})")  # fmt: skip
    else:
        print(f"{a.spec} {a.split} seed {a.seed}: {devcheck(a.spec, a.model, **kwargs)}")
    print(f"per item: {out}" + (f"; verdict: {summary_path(out)}" if a.judge_check else ""))


if __name__ == "__main__":
    main()
