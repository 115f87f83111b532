"""The rows the weight trainers append to history.jsonl, typed (beside `skill/rows.py`, the
skill trainer's): one `RestRound` per ReST / SFT / DPO round (round 0 = the base model) and
one `RLStepRow` per logged GRPO / GSPO step. `from_dict` reads a row back, one written before
a key existed too; `to_dict` writes the keys the row was written with (a key the trainer
leaves out when it has no value stays out), so a row read and written back is the same row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from selftaught.evaluation import EvalResult
from selftaught.gate import GateResult
from selftaught.record import Decoder, Record
from selftaught.results import SplitScore
from selftaught.stops import StopReason, StopRecord, stop_dict


def _summary(value: Any) -> EvalResult | None:
    """A stored summary (None where the row holds none, or one without a hard score)."""
    return EvalResult.from_summary(value) if SplitScore.read(value) is not None else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


# the sampling part of a round's row, written together (`samples_per_s` may be null)
_SAMPLING = (
    "samples",
    "sample_errors",
    "sample_solved",
    "sample_truncated",
    "sample_seconds",
    "samples_per_s",
)


@dataclass(frozen=True, kw_only=True)
class TrainStats(Record):
    """What a fine-tune reported (`sft.fine_tune_report`, SFT's and DPO's `fit`): what it
    trained on (by its method's name: SFT's `train_samples`, DPO's `train_pairs`, KTO's
    `train_judged`), its steps, loss and timings, the precision it trained in, SFT's batches,
    and a stop before its last step. Read from a round's row (`RestRound.train`) and written
    back key for key (`Record`); a night's adapter adds its own keys (`TrainedRecord`)."""

    train_samples: int | None = None
    train_pairs: int | None = None
    train_judged: int | None = None
    steps: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    train_loss: float | None = None
    train_seconds: float | None = None
    setup_seconds: float | None = None
    step_seconds: float | None = None
    step_seconds_median: float | None = None
    trainable_params: int | None = None
    autocast: str | None = None  # bf16 or off
    dtype: str | None = None  # of the weights it trained
    stopped_by: StopRecord | None = None  # a stop before its last step (`--max-minutes`)
    tokens: int | None = None  # SFT: the tokens of its batches, padding too
    pad_tokens: int | None = None
    pad_share: float | None = None
    micro_batches: int | None = None  # SFT: each batch in this many parts
    packing: bool | None = None  # SFT: padding-free packing

    decoders: ClassVar[Mapping[str, Decoder]] = {"stopped_by": StopRecord.read}


@dataclass(frozen=True)
class RestRound:
    """One round of a ReST-EM / SFT / DPO run: what was sampled (ReST, SFT) or trained on
    (DPO's pairs), what training reported, the round's model on val (and test) and the gate's
    decision. Round 0 is the base model (`model` names it); a round that kept too few elite
    samples to train has `trained` False and says why (`reason`, `advice`)."""

    round: int
    trained: bool = False
    model: str | None = None  # round 0 only: "base" or "random strategies"
    samples: int | None = None
    sample_errors: int | None = None
    sample_solved: float | None = None  # share of the round's samples the task scored solved
    sample_truncated: float | None = None
    sample_seconds: float | None = None
    samples_per_s: float | None = None
    elite: Mapping[str, int] | None = None  # `EliteStats.to_dict()` (SFT: {"kept": n})
    sample_tool_use: Mapping[str, float] | None = None  # `evaluation.tool_use` of the samples
    # `dataset="grow"`: what the round trained on (the kind, its size, the samples it added)
    dataset: Mapping[str, str | int] | None = None
    train_pairs: int | None = None  # DPO: the preference pairs the adapter trained on
    train_judged: Mapping[str, int] | None = None  # KTO: the replies judged up and down
    train: TrainStats | None = None  # what the trainer's `fit` reported
    val: EvalResult | None = None
    gate: GateResult | None = None
    test: EvalResult | None = None
    best_round: int | None = None
    seconds: float | None = None
    reason: str | None = None
    advice: str | None = None
    stopped_by: StopReason | None = None  # the run stopped after this round

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"round": self.round}
        if self.model is not None:
            out["model"] = self.model
        if self.samples is not None:
            out.update({k: getattr(self, k) for k in _SAMPLING})
            out["elite"] = dict(self.elite or {})
        if self.sample_tool_use is not None:
            out["sample_tool_use"] = dict(self.sample_tool_use)
        if self.dataset is not None:
            out["dataset"] = dict(self.dataset)
        if self.train_pairs is not None:
            out["train_pairs"] = self.train_pairs
        if self.train_judged is not None:
            out["train_judged"] = dict(self.train_judged)
        if self.train is not None:
            out["train"] = self.train.to_dict()
        out["trained"] = self.trained
        for key in ("val", "test"):
            summary = getattr(self, key)
            if summary is not None:
                out[key] = summary.summary()
        if self.gate is not None:
            out["gate"] = self.gate.to_dict()
        for key in ("best_round", "seconds", "reason", "advice"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.stopped_by is not None:
            out["stopped_by"] = stop_dict(self.stopped_by)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestRound:
        r = int(d.get("round") or 0)
        gate = d.get("gate")
        return cls(
            round=r,
            trained=bool(d.get("trained", r > 0)),
            model=d.get("model"),
            samples=_int(d.get("samples")),
            sample_errors=_int(d.get("sample_errors")),
            sample_solved=_float(d.get("sample_solved")),
            sample_truncated=_float(d.get("sample_truncated")),
            sample_seconds=_float(d.get("sample_seconds")),
            samples_per_s=_float(d.get("samples_per_s")),
            elite=dict(d["elite"]) if isinstance(d.get("elite"), Mapping) else None,
            sample_tool_use=d.get("sample_tool_use"),
            dataset=dict(d["dataset"]) if isinstance(d.get("dataset"), Mapping) else None,
            train_pairs=_int(d.get("train_pairs")),
            train_judged=dict(d["train_judged"])
            if isinstance(d.get("train_judged"), Mapping)
            else None,
            train=TrainStats.from_dict(d["train"]) if isinstance(d.get("train"), Mapping) else None,
            val=_summary(d.get("val")),
            gate=GateResult.from_dict(gate) if isinstance(gate, Mapping) and gate else None,
            test=_summary(d.get("test")),
            best_round=_int(d.get("best_round")),
            seconds=_float(d.get("seconds")),
            reason=d.get("reason"),
            advice=d.get("advice"),
            stopped_by=StopReason.read(d.get("stopped_by")),
        )


@dataclass(frozen=True)
class RLStepRow:
    """One logged GRPO / GSPO step: TRL's metrics under our names (`reward`, `reward_std`,
    `kl`, `completion_length`, `truncated`, `loss`, `lr`, each reward function's mean as
    `rewards/<name>`, ...: those TRL logged, in its order), whether every reward of the step
    was equal (no learning signal) and the warnings the run printed."""

    step: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    all_rewards_equal: bool = False
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            **self.metrics,
            "all_rewards_equal": self.all_rewards_equal,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], index: int = 0) -> RLStepRow:
        """A row back (`index`: its place in the history, the step when it names none)."""
        numbers = {k: _float(v) for k, v in d.items() if k not in ("step", "all_rewards_equal")}
        return cls(
            step=int(d.get("step", index + 1)),
            metrics={k: v for k, v in numbers.items() if v is not None},
            all_rewards_equal=bool(d.get("all_rewards_equal")),
            warnings=tuple(str(w) for w in d.get("warnings") or ()),
        )
