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

(`--skill FILE`: a skill file or a run's result.json scored instead of the seed prompt). On a
label task (at most 8 distinct train references, each seen twice or more: Yes / No, option
letters) the dev check's summary also holds `labels` (issue 52 item 2): the train labels, the
labels the skill's demos show, `labels_lost` (train labels no demo shows) and `prior_labels`
(a label the skill's rules name alone, as in "usually No": a flag for a reader to look at);

    python benchmarks/bench_tasks.py gym:syllogism --model local:<Qwen GGUF> --skill result.json

and `--label-check results/peers_<task>.json` reads the same labels off every dev run's
shipped skill in a `bench_peers.py` dev results file, no model called
(`results/labelcheck_<task>_dev.json`);
and, for a judge task, `--judge-check`: whether the judge can grade at all. Each item's own
reference is judged as a reply (it must pass) and so is the nearest other reference of the
registry file that differs from it (it must fail: for a story with several questions, another
place of the same story). The judge grades when it passes at least 80% of the references and at
most 20% of the wrong ones (`JUDGE_RULE`, written before any check ran); a judge that cannot
tell the two apart makes any score of the task noise. The verdict is saved beside the
judgements (`<output>.summary.json`); `bench_peers.py --report` runs a judge task only when one
records its judge grading it.

`--judge-variant` (repeatable, or a comma list) checks judge variants in one run (issue 52):
`absolute` (the default: the set's judge as the task scores with it), `kN` (N judge calls, the
median verdict), `reference` (selftaught's reference-guided prompt), `pairwise` (the reference
against the wrong answer and the wrong answer against the reference, in one A / B order drawn
per item, so each pair is judged both ways round), or a mode and `kN` (`reference+k5`). Each
variant reports its pass rates on the references and on the wrong answers, its agreement with
the gold labels (reference: pass, wrong: fail) and the items it gets right both ways, each with
a 95% Wilson interval, and whether it meets `JUDGE_RULE`; the summary keeps each under
`variants` and the absolute variant's keys at the top, as before.

A judge check resumes: its JSONL starts with a header of its settings (spec, judge, seed,
split, sizes, a digest of every judge prompt it may use) and each judgement is appended as
soon as it is made, so a killed check run again judges only what is missing (a file of other
settings is refused; more variants add to it), and its summary, computed from every row on
disk, is the uninterrupted one's. A verdict the judge gave that cannot be read keeps the
judge's whole last reply (`judge_reply`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
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

    if isinstance(judge_model, str):
        model = load_model(judge_model, timeout_s=timeout_s)
    else:
        model = judge_model
    return JsonlTask(
        path,
        scorer=judge_scorer(name, model, JudgeVariant("absolute")),
        seed=seed,
        name=name,
        instructions=JUDGE_SETS[name].instructions,
    )


@dataclass(frozen=True)
class JudgeVariant:
    """How a judge set's judge grades (issue 52): `mode` (absolute: a 0-10 score against the
    rubric with the set's own prompt; reference: selftaught's reference-guided prompt;
    pairwise: which of two replies better meets the rubric) and `samples` (k judge calls, the
    median verdict). Named `absolute`, `reference`, `pairwise`, `kN` (absolute, k = N) or a
    mode and `kN` joined by `+` (`reference+k5`)."""

    mode: str = "absolute"
    samples: int = 1

    @property
    def name(self) -> str:
        if self.samples == 1:
            return self.mode
        k = f"k{self.samples}"
        return k if self.mode == "absolute" else f"{self.mode}+{k}"

    @classmethod
    def parse(cls, text: str) -> JudgeVariant:
        from selftaught.tasks.scorers import JUDGE_MODES

        mode, samples = "absolute", 1
        for part in text.strip().split("+"):
            if part in JUDGE_MODES:
                mode = part
            elif part[:1] == "k" and part[1:].isdigit() and int(part[1:]) >= 1:
                samples = int(part[1:])
            else:
                raise SystemExit(
                    f"judge variant {text!r}: use {', '.join(JUDGE_MODES)}, kN (N judge calls, "
                    "the median verdict) or a mode+kN (e.g. reference+k5)"
                )
        return cls(mode, samples)


def judge_scorer(
    name: str, model: Any, variant: JudgeVariant, baseline: Mapping[str, str] | None = None
) -> Any:
    """The judge set's LlmJudge in `variant` (pairwise: against `baseline`, by example id)."""
    from selftaught.tasks.scorers import LlmJudge

    js = JUDGE_SETS[name]
    own = JUDGE_TEMPLATES / js.judge_template if js.judge_template else None
    return LlmJudge(
        model,
        js.rubric,
        template=own if variant.mode == "absolute" else None,  # the others: packaged prompts
        samples=variant.samples,
        mode=variant.mode,  # parse() checked it
        baseline=baseline,
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
    skill: str | None = None,
) -> Any:
    """`skill` (default: the seed prompt of the report settings) scored on `split` of `spec`;
    per item to `out`, the summary beside it (`<out>.summary.json`). On a label task (see
    `label_report`) the summary also holds `labels`: the train labels, those the skill's
    demos show, the ones it lost and any its rules state as a prior."""
    import selftaught
    from selftaught.models import GenerationParams
    from selftaught.rollout import RolloutConfig
    from selftaught.runs import atomic_write_json, read_json

    settings, model, task = _design_task(spec, model, seed, split, sizes, wheel)
    timeout_s = float(settings["timeout_s"])
    params = GenerationParams(max_tokens=settings["max_tokens"], temperature=0.0)
    rollout = RolloutConfig(concurrency=settings["concurrency"], timeout_s=timeout_s, params=params)
    text = settings["seed_prompt"] if skill is None else skill
    result = selftaught.evaluate(
        task,
        model,
        skill=text,
        split=split,  # type: ignore[arg-type]
        rollout=rollout,
        output=out,
    )
    labels = label_report([ex.reference for ex in task.examples("train")], text)
    if labels is not None:
        path = out.with_suffix(".summary.json")  # where evaluate() saved its summary
        atomic_write_json(path, read_json(path) | {"labels": labels.to_dict()})
    return result


# ---- label tasks (issue 52 item 2) --------------------------------------------------------

LABELS_AT_MOST = 8  # a label task: at most this many distinct train references ...
LABEL_SEEN_AT_LEAST = 2  # ... each seen at least this often


@dataclass(frozen=True)
class LabelReport:
    """A label task's labels against a skill: `train` (label: count), `demos` (label: count
    among the skill's demos; a demo whose reply names none is left out), `labels_lost` (train
    labels no demo shows; none when the skill has no demos) and `prior_labels` (see
    `stated_priors`). Labels are normalized (`answer_key`: words, case and punctuation aside)."""

    train: dict[str, int]
    demos: dict[str, int]
    n_demos: int
    labels_lost: list[str]
    prior_labels: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"train": self.train, "demos": self.demos, "n_demos": self.n_demos,
                "labels_lost": self.labels_lost, "prior_labels": self.prior_labels}  # fmt: skip


def closed_labels(references: Sequence[Any]) -> dict[str, int] | None:
    """The label counts of train references that are a small closed set (at most
    `LABELS_AT_MOST` distinct normalized references, each seen `LABEL_SEEN_AT_LEAST` times or
    more: Yes / No, multiple-choice letters), most frequent first; else None (free text)."""
    from collections import Counter

    from selftaught.skill.demo_search import answer_key

    refs = [r[0] if isinstance(r, list | tuple) and r else r for r in references]
    counts = Counter(answer_key(str(r)) for r in refs if r is not None)
    counts.pop("", None)
    if not counts or len(counts) > LABELS_AT_MOST or min(counts.values()) < LABEL_SEEN_AT_LEAST:
        return None
    return dict(counts.most_common())


def reply_label(reply: str, labels: Sequence[str]) -> str | None:
    """The label a reply gives: the whole reply as a label, else the label named last in it
    (a reply that reasons first and answers last), else None."""
    from selftaught.skill.demo_search import answer_key
    from selftaught.text import words

    if answer_key(reply) in labels:
        return answer_key(reply)
    toks = words(reply)
    found = None, -1
    for label in labels:
        n = len(label.split())
        at = [i for i in range(len(toks) - n + 1) if " ".join(toks[i : i + n]) == label]
        if at and at[-1] > found[1]:
            found = label, at[-1]
    return found[0]


def stated_priors(rules: str, labels: Sequence[str]) -> list[str]:
    """The labels the rules state as a prior, by a simple check: the rules name exactly one
    label ("answer No", "usually No"), and none of the others. A label of one letter (a
    multiple-choice option) counts only as a capital standing alone ("A", "(B)"), so that the
    article "a" is not read as option A; longer labels as whole words, case aside. A flag for
    a reader, not a verdict: "answer Yes only if ..." names one label too."""
    import re

    from selftaught.text import words

    toks = " " + " ".join(words(rules)) + " "
    named = [
        label
        for label in labels
        if (re.search(rf"(?<![\w]){re.escape(label.upper())}(?![\w])", rules) if len(label) == 1
            else f" {label} " in toks)
    ]  # fmt: skip
    return named if len(named) == 1 else []


def label_report(references: Sequence[Any], skill: str) -> LabelReport | None:
    """`skill` (rules and demos block) against the labels of a label task's train
    `references`; None when the references are not a small closed set (`closed_labels`)."""
    from collections import Counter

    from selftaught.demos import split_skill

    train = closed_labels(references)
    if train is None:
        return None
    parts = split_skill(skill)
    shown = [reply_label(d.reply, list(train)) for d in parts.demos]
    demos = dict(Counter(label for label in shown if label is not None).most_common())
    lost = [label for label in train if label not in demos] if parts.demos else []
    priors = stated_priors(parts.rules, list(train))
    return LabelReport(train, demos, len(parts.demos), lost, priors)


def label_check(results_file: Path, out: Path) -> list[dict[str, Any]]:
    """Every dev run's shipped skill in a `bench_peers.py` dev results file
    (`results/peers_<task>.json`) against its seed's train labels (`label_report`), no model
    called: what each run's demos show, the labels they lost and any prior its rules state.
    Saved to `out`; a design tool, so the file's seeds must be dev seeds."""
    from protocol import check_design_use

    from selftaught.runs import atomic_write_json, read_json

    saved = read_json(results_file)
    rows = saved["runs"]
    check_design_use("bench_tasks.py --label-check", seeds=[r["seed"] for r in rows])
    s = saved["settings"]
    checked = []
    for row in rows:
        if "error" in row or needs_judge(row["task"]):
            continue
        task = build_task(row["task"], seed=row["seed"], train_size=s["train"],
                          val_size=s["val"], test_size=s["test"])  # fmt: skip
        refs = [ex.reference for ex in task.examples("train")]
        report = label_report(refs, row["shipped_prompt"])
        if report is None:
            raise SystemExit(f"{row['task']} is not a label task (its train references are free "
                             "text): a label check has nothing to read")  # fmt: skip
        checked.append({"system": row["system"], "variant": row.get("variant"),
                        "seed": row["seed"], "labels": report.to_dict()})  # fmt: skip
    atomic_write_json(out, {"source": results_file.name, "runs": checked})
    return checked


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
    variants: Sequence[str] = ("absolute",),
) -> dict[str, Any]:
    """Whether the judge of a judge task can grade, in each of `variants` (JudgeVariant names):
    every item of `split` judged twice, with its own reference as the reply (should pass) and
    with a wrong reference (should fail; pairwise: the reference against the wrong one, then
    the wrong one against the reference, so the pair is judged both ways round); per judgement
    to `out` (JSONL), the counts with the verdict under `JUDGE_RULE` returned and saved beside
    it (`<out>.summary.json`, what a report run looks for: `passing_judge_check`). The summary
    holds each variant under `variants`, and the `absolute` variant's keys at the top as
    before.

    Resumable: `out` starts with a header of the check's settings and each judgement is
    appended as soon as it is made, so running the same check again judges only what is
    missing (other settings refuse; a judge error is a row like any other, never retried:
    retrying until a reply reads would hide how often the judge fails). The summary is
    computed from every row on disk: the variants named, and any other variant the file
    holds in full."""
    from selftaught.runs import atomic_write_json

    if not needs_judge(spec):
        raise SystemExit(f"--judge-check: {spec!r} is not a judge task")
    chosen = list({v.name: v for v in map(JudgeVariant.parse, variants)}.values())
    if not chosen:
        raise SystemExit("--judge-check: name at least one judge variant")
    name = spec.removeprefix("judge:")
    judge_name = model if isinstance(model, str) else str(getattr(model, "name", model))
    check = {"spec": spec, "judge": judge_name, "seed": seed, "split": split,
             "sizes": list(sizes), "prompts": judge_prompts_digest(name)}  # fmt: skip
    from protocol import check_design_use

    check_design_use("bench_tasks.py", seeds=[seed], splits=[split])
    resume_check_rows(out, check)  # a file of another check is refused before any model loads
    settings, model, task = _design_task(spec, model, seed, split, sizes, wheel)
    examples = task.examples(split)
    wrong = wrong_references(name, [ex.id for ex in examples], wheel)
    rows = resume_check_rows(out, check)
    done = {_row_key(r) for r in rows}
    on_disk = [JudgeVariant.parse(n) for n in dict.fromkeys(r["variant"] for r in rows)]
    every = list({v.name: v for v in chosen + on_disk}.values())
    cases = {v.name: _check_cases(name, model, v, examples, wrong) for v in every}
    todo = [c for v in chosen for c in cases[v.name] if _case_key(c) not in done]
    rows += _judge_all(todo, out, int(settings["concurrency"]))
    done = {_row_key(r) for r in rows}
    named = {v.name for v in chosen}
    shown = [v for v in cases if v in named or all(_case_key(c) in done for c in cases[v])]
    summary = judge_check_summary(rows, shown)
    atomic_write_json(summary_path(out), {**check, "rule": list(JUDGE_RULE), **summary})
    return summary


CHECK_HEADER = "judge_check"  # the key of a judge check file's first line: its settings


def judge_prompts_digest(name: str) -> str:
    """What the set's judges are asked, as one digest: its rubric and instructions, its own
    judge prompt and selftaught's packaged ones (every mode's, so that a resumed check may
    add variants). A check resumed after any of them changed is refused: its verdicts would
    mix two judges."""
    import hashlib

    import selftaught.tasks.scorers as scorers

    js = JUDGE_SETS[name]
    texts = [js.rubric, js.instructions]
    if js.judge_template:
        texts.append((JUDGE_TEMPLATES / js.judge_template).read_text(encoding="utf-8"))
    packaged = Path(scorers.__file__).parent / "prompts"
    texts += [(packaged / f).read_text(encoding="utf-8") for f in sorted(
        p.name for p in packaged.glob("llm_judge*.md"))]  # fmt: skip
    return hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:16]


def _row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (row.get("variant", "absolute"), row["example_id"], row["case"])


def _case_key(c: CheckCase) -> tuple[str, str, str]:
    return (c.variant, c.example.id, c.case)


def resume_check_rows(out: Path, check: dict[str, Any]) -> list[dict[str, Any]]:
    """The judgements a judge check file already holds (none for a new file, which gets the
    header of `check`'s settings). A torn last line (a kill mid-append) is dropped and the
    file rewritten without it; a file of other settings, or without a header (written before
    checks resumed), is refused, naming what differs."""
    from selftaught.runs import write_jsonl

    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    parsed: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise SystemExit(f"{out}:{i + 1} is not JSON; pass --output elsewhere") from None
    if not parsed:
        write_jsonl(out, [{CHECK_HEADER: check}])
        return []
    old = parsed[0].get(CHECK_HEADER)
    if old is None:
        raise SystemExit(f"{out} holds a judge check without recorded settings (written before "
                         "checks resumed); pass --output elsewhere")  # fmt: skip
    if old != check:
        changed = ", ".join(
            f"{k} {old.get(k)!r} there, {check.get(k)!r} now"
            for k in sorted(set(old) | set(check)) if old.get(k) != check.get(k)
        )  # fmt: skip
        raise SystemExit(f"{out} holds a judge check with other settings ({changed}); run the "
                         "same check to resume it, or pass --output elsewhere")  # fmt: skip
    if len(parsed) < len(lines):  # the torn line goes before anything is appended after it
        write_jsonl(out, parsed)
    return parsed[1:]


def _judge_all(cases: Sequence[CheckCase], out: Path, concurrency: int) -> list[dict[str, Any]]:
    """Judge `cases` on `concurrency` threads, each row appended to `out` (one write of one
    line, fsynced) as soon as it is judged; an exception (a kill) cancels what has not started."""
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []

    def judge(c: CheckCase) -> None:
        row = _judge_case(c)
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with lock:
            fd = os.open(out, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            rows.append(row)

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        for _ in pool.map(judge, cases):
            pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return rows


@dataclass(frozen=True)
class CheckCase:
    """One judgement of a judge check: `reply` (the item's reference, or a wrong one: `case`)
    scored by `scorer` of `variant` (pairwise: against `baseline`, the other one)."""

    variant: str
    scorer: Any
    example: Any
    case: str  # "reference" (gold: pass) or "wrong" (gold: fail)
    reply: str
    baseline: str | None = None


def _check_cases(
    name: str, model: Any, variant: JudgeVariant, examples: Sequence[Any], wrong: dict[str, str]
) -> list[CheckCase]:
    v = variant.name
    if variant.mode != "pairwise":
        scorer = judge_scorer(name, model, variant)
        cases = [CheckCase(v, scorer, ex, "reference", ex.reference) for ex in examples]
        return cases + [
            CheckCase(v, scorer, ex, "wrong", wrong[ex.id]) for ex in examples if ex.id in wrong
        ]
    paired = [ex for ex in examples if ex.id in wrong]  # a pair needs its wrong answer
    refs = {ex.id: str(ex.reference) for ex in paired}
    # one order draw per item: the reference is A against the wrong answer exactly when the
    # wrong answer is A against the reference, so each pair is judged both ways round
    beats = judge_scorer(name, model, variant, baseline=wrong)
    loses = judge_scorer(name, model, variant, baseline=refs)
    return [CheckCase(v, beats, ex, "reference", refs[ex.id], wrong[ex.id]) for ex in paired] + [
        CheckCase(v, loses, ex, "wrong", wrong[ex.id], refs[ex.id]) for ex in paired
    ]


def _judge_case(c: CheckCase) -> dict[str, Any]:
    from selftaught.errors import BackendError
    from selftaught.tasks.scorers import UnreadableVerdict

    row: dict[str, Any] = {"variant": c.variant, "example_id": c.example.id, "case": c.case,
                           "reply": c.reply}  # fmt: skip
    if c.baseline is not None:
        row["baseline"] = c.baseline
    try:
        score = c.scorer(c.reply, c.example)
    except BackendError as err:  # a broken judge is an error, never a verdict
        if isinstance(err, UnreadableVerdict):  # the whole reply: why it could not be read
            return row | {"error": str(err), "judge_reply": err.reply}
        return row | {"error": str(err)}
    return row | {"passed": score.hard == 1.0, "feedback": score.feedback}


def _rate(k: int, n: int) -> dict[str, Any]:
    from selftaught.stats import wilson_interval

    return {"k": k, "n": n, "rate": round(k / n, 4) if n else None,
            "ci95": [round(x, 4) for x in wilson_interval(k, n)]}  # fmt: skip


def variant_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One variant's judge check: the references and the wrong answers passed (each with a
    95% Wilson interval), the agreement with the gold labels (reference: pass, wrong: fail),
    the items whose two judgements are both right (`pairs`; pairwise: the reference beat the
    wrong answer both ways round), judge errors (counted apart, never a verdict) and whether
    it meets `JUDGE_RULE` (`grades`)."""
    judged = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {"errors": len(rows) - len(judged)}
    for kind in ("reference", "wrong"):
        mine = [r for r in judged if r["case"] == kind]
        out[kind] = (sum(r["passed"] for r in mine), len(mine))
        out[f"{kind}_rate"] = _rate(*out[kind])
    right = [r["passed"] == (r["case"] == "reference") for r in judged]
    out["agreement"] = _rate(sum(right), len(right))
    by_item: dict[str, dict[str, bool]] = {}
    for r in judged:
        by_item.setdefault(r["example_id"], {})[r["case"]] = r["passed"]
    both = [v for v in by_item.values() if len(v) == 2]
    out["pairs"] = _rate(sum(v["reference"] and not v["wrong"] for v in both), len(both))
    (ref_pass, n_ref), (wrong_pass, n_wrong) = out["reference"], out["wrong"]
    out["grades"] = bool(
        n_ref and n_wrong and ref_pass >= JUDGE_RULE[0] * n_ref
        and wrong_pass <= JUDGE_RULE[1] * n_wrong
    )  # fmt: skip
    return out


def judge_check_summary(rows: Sequence[dict[str, Any]], variants: Sequence[str]) -> dict[str, Any]:
    """Each variant's `variant_summary` under `variants`; the `absolute` variant's errors,
    reference, wrong and grades also at the top, where a summary kept them before variants
    (rows without a `variant` are the absolute variant's)."""
    per = {
        v: variant_summary([r for r in rows if r.get("variant", "absolute") == v]) for v in variants
    }
    if "absolute" not in per:
        return {"variants": per}
    top = {k: per["absolute"][k] for k in ("errors", "reference", "wrong", "grades")}
    return top | {"variants": per}


def summary_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")


def passing_judge_check(
    spec: str, judge: str, results: Path, variant: str = "absolute"
) -> Path | None:
    """A saved judge check (`judgecheck_*.summary.json` in `results`) in which `judge` graded
    the task `spec` in `variant` (a JudgeVariant name), if there is one: a judge task's report
    rows need it. The absolute variant's verdict is the summary's top-level `grades` (also in
    the files written before variants)."""
    home = str(Path.home())  # `local:~/...` and `local:/root/...` name the same model
    want = judge.replace("~", home)
    for path in sorted(results.glob("judgecheck_*.summary.json")):
        record = json.loads(path.read_text())
        same = record.get("spec") == spec and record.get("judge", "").replace("~", home) == want
        verdict = record if variant == "absolute" else record.get("variants", {}).get(variant, {})
        if same and verdict.get("grades") is True:
            return path
    return None


def judge_check_line(v: dict[str, Any]) -> str:
    """One variant's judge check in a sentence."""

    def shown(r: dict[str, Any]) -> str:
        lo, hi = r["ci95"]
        return f"{r['k']}/{r['n']} ({r['rate']}, 95% CI {lo:.2f}-{hi:.2f})"

    verdict = "grades" if v["grades"] else "cannot grade"
    return (
        f"the judge passed {shown(v['reference_rate'])} references and "
        f"{shown(v['wrong_rate'])} wrong answers; agreement with the gold labels "
        f"{shown(v['agreement'])}, both judgements of an item right {shown(v['pairs'])} "
        f"({v['errors']} judge errors): it {verdict} (rule: >= {JUDGE_RULE[0]:.0%} and "
        f"<= {JUDGE_RULE[1]:.0%})"
    )


def main(argv: list[str] | None = None) -> None:
    from common import RESULTS
    from protocol import load_report_settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="gym:NAME[?k=v&...] or judge:NAME")
    parser.add_argument("--model", help="target (and judge) model spec (not for --label-check)")
    parser.add_argument("--seed", type=int, default=0, help="a dev seed")
    parser.add_argument("--split", default="val", choices=("train", "val"))
    parser.add_argument("--sizes", type=int, nargs=3, metavar=("TRAIN", "VAL", "TEST"),
                        help="split sizes (default: the report settings')")  # fmt: skip
    parser.add_argument(
        "--judge-check",
        action="store_true",
        help="a judge task: can its judge tell a reference from a wrong answer?",
    )
    parser.add_argument(
        "--judge-variant",
        action="append",
        metavar="NAME[,NAME...]",
        help="with --judge-check, repeatable: absolute (default), kN (N judge calls, the median), "
        "reference (reference-guided prompt), pairwise (reference vs wrong answer, both ways "
        "round), or mode+kN (e.g. reference+k5)",
    )
    parser.add_argument("--label-check", type=Path, metavar="RESULTS", help="a label task: "
                        "every dev run's shipped skill in a bench_peers.py dev results file "
                        "against its train labels (no model called)")  # fmt: skip
    parser.add_argument("--skill", type=Path, help="the dev check's skill: a skill file (rules "
                        "and demos block) or a run's result.json (its best_skill); default: the "
                        "seed prompt")  # fmt: skip
    parser.add_argument("--output", type=Path, help="per-item JSONL (default: results/devcheck_"
                        "<task>_<split>_seed<seed>.jsonl, or judgecheck_...)")  # fmt: skip
    a = parser.parse_args(argv)
    task_kind(a.spec)  # an unknown spec is refused before any model loads
    name = a.spec.split(":", 1)[1].split("?")[0]
    if a.label_check:
        out = a.output or RESULTS / f"labelcheck_{name}_dev.json"
        for row in label_check(a.label_check, out):
            print(f"{a.spec} seed {row['seed']} {row['variant']}: {row['labels']}")
        print(f"wrote {out}")
        return
    if not a.model:
        parser.error("--model is required (except with --label-check)")
    frozen = load_report_settings()["settings"]
    sizes = a.sizes or [frozen["train"], frozen["val"], frozen["test"]]
    tool = "judgecheck" if a.judge_check else "devcheck"
    out = a.output or RESULTS / f"{tool}_{name}_{a.split}_seed{a.seed}.jsonl"
    kwargs = {"seed": a.seed, "split": a.split, "sizes": sizes, "out": out}
    if a.judge_check:
        names = [v.strip() for arg in a.judge_variant or ["absolute"] for v in arg.split(",")]
        for variant_name in names:  # every name is checked before any model loads
            JudgeVariant.parse(variant_name)
        c = judgecheck(a.spec, a.model, **kwargs, variants=names)
        for variant, v in c["variants"].items():
            print(f"{a.spec} {a.split} seed {a.seed} [{variant}]: " + judge_check_line(v))
    else:
        skill = read_skill(a.skill) if a.skill else None
        result = devcheck(a.spec, a.model, **kwargs, skill=skill)
        print(f"{a.spec} {a.split} seed {a.seed}: {result}")
        labels = json.loads(out.with_suffix(".summary.json").read_text()).get("labels")
        if labels is not None:
            print(f"labels: {labels}")
    print(f"per item: {out}" + (f"; verdict: {summary_path(out)}" if a.judge_check else ""))


def read_skill(path: Path) -> str:
    """A skill's text: a run's result.json gives its `best_skill`, any other file is the skill."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        best = json.loads(text).get("best_skill")
        if not isinstance(best, str):
            raise SystemExit(f"{path}: no best_skill (give a run's result.json or a skill file)")
        return best
    return text


if __name__ == "__main__":
    main()
