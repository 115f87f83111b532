"""Progress on a non-terminal: a plain line at most once a minute per long phase (fake clock),
and the rollout runner printing them when its bar cannot show."""

from __future__ import annotations

import io

import pytest

from selftaught.progress_lines import ProgressLines, duration, plain_lines_wanted


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_at_most_once_a_minute_with_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines("rollout", 40, enabled=True, stream=out, clock=clock)
    for _ in range(30):  # one item every 4 s: 120 s in all
        clock.now += 4
        lines.advance(tokens=50, note="acc 3/4")
    lines.finish()
    printed = out.getvalue().splitlines()
    assert printed == [
        "[selftaught] rollout: 15/40 · 0.25/s · 12 tok/s · 1m00s elapsed · ETA 1m40s · acc 3/4",
        "[selftaught] rollout: 30/40 · 0.25/s · 12 tok/s · 2m00s elapsed · ETA 40s · acc 3/4",
        "[selftaught] rollout: 30/40 · 0.25/s · 12 tok/s · 2m00s elapsed · done · acc 3/4",
    ]


def test_a_short_phase_prints_nothing_and_a_disabled_one_never():
    clock, out = Clock(), io.StringIO()
    short = ProgressLines("rollout", 8, enabled=True, stream=out, clock=clock)
    for _ in range(8):
        clock.now += 5
        short.advance()
    short.finish()
    off = ProgressLines("rollout", 8, enabled=False, stream=out, clock=clock)
    for _ in range(8):
        clock.now += 100
        off.advance()
    off.finish()
    assert out.getvalue() == ""


def test_a_resumed_phase_rates_only_what_this_process_did():
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines(
        "optimize", 10, enabled=True, stream=out, clock=clock, unit="steps", start=4
    )
    clock.now += 120
    lines.update(6)
    assert out.getvalue().strip() == (
        "[selftaught] optimize: 6/10 steps · 1.0/min · 2m00s elapsed · ETA 4m00s"
    )


def test_lines_only_where_the_bar_cannot_show():
    class Term:
        is_terminal = True

    class File:
        is_terminal = False

    assert plain_lines_wanted(True, File())
    assert not plain_lines_wanted(True, Term())
    assert not plain_lines_wanted(False, File())
    assert duration(7384) == "2h03m" and duration(59.6) == "1m00s"


def test_rollouts_off_a_terminal_print_plain_lines(monkeypatch, capsys):
    """The rollout runner's bar is transient and silent off a terminal; it prints lines."""
    from selftaught import progress_lines, rollout
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, run_rollouts
    from tests.scripted import ScriptedModel, ToyTask

    clock = Clock()

    def ticking() -> float:
        clock.now += 45  # every reading of the clock: 45 s later
        return clock.now

    monkeypatch.setattr(progress_lines, "CLOCK", ticking)
    monkeypatch.setattr(progress_lines, "plain_lines_wanted", lambda progress, console: progress)
    monkeypatch.setattr(rollout, "plain_lines_wanted", lambda progress, console: progress)
    task = ToyTask(train={"alpha": 6})
    examples = task.examples("train")
    model = ScriptedModel(lambda messages: "Answer: 0")
    run_rollouts(model, Policy(), task, examples, RolloutConfig(progress=True, description="eval"))
    err = capsys.readouterr().err
    assert "[selftaught] eval: " in err and "/6" in err and "ETA" in err
    assert err.strip().splitlines()[-1].endswith(" · done · acc 0/6")
    run_rollouts(model, Policy(), task, examples, RolloutConfig(progress=False))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("tokens", [0])
def test_no_token_rate_when_none_are_counted(tokens):
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines("x", None, enabled=True, stream=out, clock=clock)
    clock.now += 61
    lines.advance(tokens=tokens)
    assert "tok/s" not in out.getvalue() and "ETA" not in out.getvalue()
