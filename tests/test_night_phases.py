"""The night is a pipeline of phases over one `NightContext` (issue 64): `NightTrainer` runs
`default_phases(config)` in `train()`, each phase's record kept by name; a user adds a
phase of their own, leaves one out, or puts another in its place, from Python."""

from __future__ import annotations

from dataclasses import dataclass

from selftaught.sleep.night.phases import (
    NightContext,
    Phase,
    StagePhase,
    StageRecord,
    default_phases,
)
from selftaught.sleep.records import (
    MiningRecord,
    ProofreadRecord,
    Record,
    SplitCounts,
    WindowRecord,
)
from selftaught.trainers import build_trainer
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models


@dataclass(frozen=True)
class TrainShare(Record):
    train: int
    kinds: int


class CountTrain(Phase):
    """A user's phase: reads what the split phase left in the context."""

    name = "count_train"

    def run(self, ctx: NightContext) -> TrainShare:
        assert ctx.tasks is not None and ctx.tasks.kinds is not None
        return TrainShare(len(ctx.tasks.splits["train"]), len(ctx.tasks.kinds.kinds))


def _night(tmp_path, phases=None, **kw):
    fill_log(tmp_path, ALPHA_NIGHT)
    cfg = config(tmp_path, project="demo", **kw)
    trainer = build_trainer(cfg, tmp_path / "log.db", models(),
                            phases=default_phases(cfg) if phases is None else phases)  # fmt: skip
    return cfg, trainer


def test_the_default_night_runs_its_phases_in_order_each_with_its_record(tmp_path):
    _, trainer = _night(tmp_path)
    night = trainer.train()
    assert night.status == "staged"
    names = ["window", "mine", "split", "text", "proofread", "weights", "stage"]
    assert [p.name for p in trainer.phases] == names and list(night.records) == names
    assert isinstance(night.records["window"], WindowRecord)
    assert night.records["window"] == night.window
    records = night.records
    assert isinstance(records["mine"], MiningRecord) and records["mine"] == night.mining
    assert isinstance(records["split"], SplitCounts) and records["split"] == night.splits
    assert isinstance(night.records["proofread"], ProofreadRecord)
    assert night.records["weights"] is None  # weights off
    verdict = night.records["stage"]
    assert isinstance(verdict, StageRecord) and verdict.status == "staged"
    assert verdict.proposal == night.proposal


def test_a_phase_of_ones_own_appended_runs_and_its_record_appears(tmp_path):
    cfg, trainer = _night(tmp_path)
    trainer.phases.append(CountTrain())
    night = trainer.train()
    assert night.status == "staged"
    record = night.records["count_train"]
    assert night.splits is not None
    assert record == TrainShare(night.splits.train, len(night.kinds)) and record.train == 8


def test_a_phase_left_out_does_not_run(tmp_path):
    cfg = config(tmp_path, project="demo")
    phases = [p for p in default_phases(cfg) if p.name != "proofread"]
    _, trainer = _night(tmp_path, phases)
    night = trainer.train()
    assert night.status == "staged" and "proofread" not in night.records
    assert night.proofread is None and "proofread" not in night.phase_seconds
    assert night.proposal is not None and night.proposal.lines == ()  # no sources named


class StageNothing(StagePhase):
    """A stage of one's own in the default one's place: never stages."""

    def run(self, ctx: NightContext) -> StageRecord:
        ctx.night.status, ctx.night.reason = "no_proposal", "staging is done by hand here"
        return StageRecord("no_proposal", "staging is done by hand here")


def test_a_phase_put_in_another_s_place_runs_instead_of_it(tmp_path):
    cfg = config(tmp_path, project="demo")
    phases = [StageNothing() if p.name == "stage" else p for p in default_phases(cfg)]
    _, trainer = _night(tmp_path, phases)
    night = trainer.train()
    assert night.status == "no_proposal" and night.reason == "staging is done by hand here"
    assert night.records["stage"] == StageRecord("no_proposal", "staging is done by hand here")
    assert night.night_dir is not None and not (night.night_dir / "proposal").exists()
