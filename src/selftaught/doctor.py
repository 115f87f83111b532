"""`selftaught doctor`: what this machine gives the local model, and what the README's main
command should take here.

It prints the cores this process may use, how many of them other processes keep busy, the
torch threads chosen from that (`selftaught.models.threads`), whether the CPU has bf16
instructions and the inference dtype and training autocast `auto` gives here
(`selftaught.models.device`), and, with the local model
installed, this machine's raw decode rate (`selftaught.models.raw_rate`: a static batch of 8
fixed prompts, every row forced to the same length, with those threads; about 10-20 s on two
CPU cores). The README's time for its main command was measured on one machine; scaled by the
ratio of raw rates, it becomes an estimate for this one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from selftaught.errors import InputError, SelftaughtError
from selftaught.models.device import DTYPE_ENV, Precision
from selftaught.models.raw_rate import RawRate
from selftaught.models.threads import ENV, ThreadChoice, measure
from selftaught.progress_lines import duration

MAIN_COMMAND = (
    'selftaught optimize --task "gym:basic_arithmetic?max_terms=2&max_digits=1" --model local '
    "--proposals 0 --epochs 1 --batch-size 16 --train-size 32 --val-size 30 --test-size 400 "
    "--max-tokens 64"
)
# The README's figure for MAIN_COMMAND, as benchmarks/bench_quickstart.py recorded it in
# benchmarks/results/MAIN_RESULTS (`wall_s`, and the raw decode rate measured just before,
# `raw_decode.tok_per_s`); tests/test_doctor.py keeps the two equal.
MAIN_RESULTS = "quickstart_demos_local_bf16_2026-11-28.json"
MAIN_SECONDS = 183.3
MAIN_RAW_TOK_S: float | None = 170.31

RAW_BATCH = 8
RAW_TOKENS = 96
PROMPTS = (
    "What is 3 + 4?",
    "What is 12 + 7?",
    "Add 25 and 18.",
    "What is 9 - 5?",
    "Compute 6 + 8 + 1.",
    "What is 40 + 2?",
    "Subtract 3 from 11.",
    "What is 7 + 7?",
)


@dataclass(frozen=True)
class DoctorReport:
    """What `selftaught doctor` found."""

    threads: ThreadChoice
    raw: RawRate | None  # None: not measured (see raw_note)
    raw_note: str = ""
    recorded_s: float = MAIN_SECONDS
    recorded_raw_tok_s: float | None = MAIN_RAW_TOK_S
    precision: Precision | None = None  # None: not known (no torch), not printed

    @property
    def expected_s(self) -> float | None:
        """The main command's time here: the recorded time scaled by the raw rates."""
        if self.raw is None or not self.recorded_raw_tok_s or self.raw.tok_per_s <= 0:
            return None
        return self.recorded_s * self.recorded_raw_tok_s / self.raw.tok_per_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads.to_dict(),
            "raw_decode": None if self.raw is None else self.raw.to_dict(),
            "raw_note": self.raw_note,
            "main_command": MAIN_COMMAND,
            "recorded_s": self.recorded_s,
            "recorded_raw_tok_s": self.recorded_raw_tok_s,
            "expected_s": None if self.expected_s is None else round(self.expected_s, 1),
            "precision": None if self.precision is None else self.precision.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DoctorReport:
        raw, precision = d.get("raw_decode"), d.get("precision")
        return cls(
            threads=ThreadChoice.from_dict(d["threads"]),
            raw=None if raw is None else RawRate.from_dict(raw),
            raw_note=d.get("raw_note", ""),
            recorded_s=d.get("recorded_s", MAIN_SECONDS),
            recorded_raw_tok_s=d.get("recorded_raw_tok_s"),
            precision=None if precision is None else Precision.from_dict(precision),
        )


def diagnose(measure_rate: Callable[[], RawRate] | None) -> DoctorReport:
    """The thread choice now and, when `measure_rate` is given, the raw decode rate (a
    local model that cannot load is reported, not raised)."""
    threads, dtypes = measure(), this_precision()
    if measure_rate is None:
        return DoctorReport(threads, None, "not measured (--no-measure)", precision=dtypes)
    try:
        return DoctorReport(threads, measure_rate(), precision=dtypes)
    except SelftaughtError as err:  # the [local] extra or the embedded model missing
        return DoctorReport(threads, None, f"not measured: {err}", precision=dtypes)


def this_precision() -> Precision | None:
    """What `auto` gives here (None without torch); a bad `SELFTAUGHT_DTYPE` raises."""
    from selftaught.models.device import precision

    try:
        return precision()
    except ImportError:
        return None


def measure_raw_rate(path: str | None = None, *, tokens: int = RAW_TOKENS) -> RawRate:
    """This machine's raw decode rate on the local model (`path`; None: the embedded one)
    with the threads the engine would use: a short warm-up, then one batch of 8."""
    from selftaught.models.local import LocalModel
    from selftaught.models.raw_rate import raw_decode
    from selftaught.models.threads import governor

    local = LocalModel(path)
    model, tokenizer = local.model, local.tokenizer  # loading chooses the threads
    governor().apply()
    texts = [local.format_prompt([{"role": "user", "content": q}]) for q in PROMPTS]
    eos = local._eos_ids
    raw_decode(model, tokenizer, eos, texts, batch=RAW_BATCH, tokens=4)  # allocate, tune
    rate = raw_decode(model, tokenizer, eos, texts, batch=RAW_BATCH, tokens=tokens)
    local.close()
    return rate


def local_path(spec: str) -> str | None:
    """`local` → None (the embedded model), `local:PATH` → PATH."""
    if spec == "local":
        return None
    if spec.startswith("local:") and spec[len("local:") :]:
        return spec[len("local:") :]
    raise InputError(f"doctor measures the local model: --model local or local:PATH, not {spec!r}")


def report_lines(report: DoctorReport) -> list[str]:
    """The report as the command prints it."""
    t = report.threads
    ceiling = "" if t.ceiling is None else f" (torch's default: {t.ceiling})"
    busy = "unknown (no /proc here)" if t.busy is None else f"{t.busy:.1f} cores"
    how = f"fixed by {ENV}={t.setting}" if t.setting is not None else f"auto; {ENV}=N fixes it"
    lines = [
        f"usable cores: {t.usable}{ceiling}",
        f"busy elsewhere: {busy}",
        f"threads: {t.threads} ({how})",
        *precision_lines(report.precision),
    ]
    if report.raw is None:
        lines.append(f"raw decode rate: {report.raw_note}")
    else:
        r = report.raw
        lines.append(
            f"raw decode rate: {r.tok_per_s:.1f} tok/s (batch {r.batch}, {r.tokens} tokens "
            f"in {r.seconds:.1f} s, {r.threads} threads)"
        )
    recorded = f"{duration(report.recorded_s)} measured"
    if report.recorded_raw_tok_s:
        recorded += f" at {report.recorded_raw_tok_s:.1f} tok/s raw"
    expected = report.expected_s
    if expected is not None:
        here = f"about {duration(expected)} here"
    elif report.raw is None:
        here = "no estimate without this machine's raw rate"
    else:
        here = "no estimate: the raw rate of the measured run was not recorded"
    lines.append(f"the README's main command: {recorded}; {here}")
    lines.append(f"  {MAIN_COMMAND}")
    return lines


def precision_lines(p: Precision | None) -> list[str]:
    """The bf16 lines: the CPU's instructions, then what `auto` picks for each use."""
    if p is None:  # no torch: the raw rate line says the extra is missing
        return []
    how = (
        f"fixed by {DTYPE_ENV}={p.setting}"
        if p.setting != "auto"
        else f"auto on {p.device}; {DTYPE_ENV}=float32|bfloat16 fixes it"
    )
    autocast = "bf16" if p.autocast else "off"
    return [
        f"bf16 on this CPU: {p.cpu.describe()}",
        f"inference dtype: {p.inference} ({how})",
        f"training autocast: {autocast} (auto on {p.device}; train --bf16 / --no-bf16 forces it)",
    ]
