"""The local model's torch threads follow the free cores (`selftaught.models.threads`): the
choice from /proc fixtures, the setting, and the governor that applies it on load and while
serving (fake clock, fake /proc samples, fake torch)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from selftaught.errors import ConfigError
from selftaught.models import threads as th
from selftaught.models.threads import (
    CpuSample,
    CpuTimes,
    ThreadGovernor,
    busy_cores,
    choose_threads,
    parse_proc_stat,
    parse_self_stat,
    parse_setting,
)


def proc_stat(*cpus: tuple[int, int]) -> str:
    """/proc/stat text with (busy user ticks, idle ticks) per CPU."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (user, idle) in enumerate(cpus):
        lines.append(f"cpu{i} {user} 0 0 {idle} 0 0 0 0 0 0")
    lines.append("intr 12345 0 0")
    return "\n".join(lines) + "\n"


def self_stat(utime: int, stime: int = 0) -> str:
    # the command name holds a space and a ')' on purpose
    return f"4242 (py thon) x) R 1 1 1 0 -1 4194304 98 0 0 0 {utime} {stime} 0 0 20 0 1 0\n"


def reading(before: str, after: str, own: int = 0, cpus: tuple[int, ...] = (0, 1)) -> float:
    return busy_cores(parse_proc_stat(before), parse_proc_stat(after), own, cpus)


@pytest.fixture(autouse=True)
def no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(th.ENV, raising=False)
    monkeypatch.setattr(th, "_override", None)


def test_parsers_read_per_cpu_and_own_ticks():
    stat = "cpu  9 9 9 9\ncpu0 10 1 2 100 5 1 1 3 0 0\ncpu1 4 0 0 50\nctxt 1\n"
    cpus = parse_proc_stat(stat)
    assert cpus[0] == CpuTimes(busy=10 + 1 + 2 + 1 + 1 + 3, total=18 + 100 + 5)
    assert cpus[1] == CpuTimes(busy=4, total=54)
    assert parse_self_stat(self_stat(70, 30)) == 100


def test_idle_machine_uses_every_usable_core():
    busy = reading(proc_stat((0, 0), (0, 0)), proc_stat((2, 98), (1, 99)))
    assert busy == pytest.approx(0.03)
    assert choose_threads(2, busy) == 2


def test_one_core_busy_of_two_leaves_one_thread():
    busy = reading(proc_stat((0, 0), (0, 0)), proc_stat((100, 0), (3, 97)))
    assert busy == pytest.approx(1.03)
    assert choose_threads(2, busy) == 1


def test_own_cpu_time_is_not_counted_as_busy():
    # both cores fully busy, but 150 of the 200 ticks were this process's own
    busy = reading(proc_stat((0, 0), (0, 0)), proc_stat((100, 0), (100, 0)), own=150)
    assert busy == pytest.approx(0.5)
    assert choose_threads(2, busy) == 2  # half a core elsewhere does not take one


def test_only_usable_cpus_are_read_and_affinity_of_one_gives_one():
    before, after = proc_stat((0, 0), (0, 0)), proc_stat((0, 100), (100, 0))
    assert reading(before, after, cpus=(0,)) == 0.0  # cpu1 is busy but not ours
    assert choose_threads(1, 0.0) == 1
    assert choose_threads(1, None) == 1


def test_the_setting_wins_and_the_ceiling_caps():
    assert choose_threads(2, 1.0, setting=4) == 4
    assert choose_threads(16, 0.0, ceiling=8) == 8
    assert choose_threads(16, 10.0, ceiling=8) == 6
    assert choose_threads(4, 9.0) == 1  # never below one
    assert choose_threads(4, None, ceiling=2) == 2  # off Linux: affinity (and torch) only


def test_setting_parses_and_the_flag_means_the_same(monkeypatch):
    assert parse_setting(None) is None and parse_setting("auto") is None
    assert parse_setting(" 3 ") == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError, match="SELFTAUGHT_THREADS"):
            parse_setting(bad)
    monkeypatch.setenv(th.ENV, "3")
    assert th.thread_setting() == 3
    th.configure(5)  # train --threads 5
    assert th.thread_setting() == 5


class FakeTorch:
    def __init__(self, default: int) -> None:
        self.threads = default
        self.calls: list[int] = []

    def get(self) -> int:
        return self.threads

    def set(self, n: int) -> None:
        self.calls.append(n)
        self.threads = n


class Machine:
    """A fake clock and /proc: `others` cores busy elsewhere, accumulating ticks."""

    def __init__(self, cpus: int = 2) -> None:
        self.now = 100.0
        self.others = 0.0
        self.n = cpus
        self.ticks = [CpuTimes(0, 0)] * cpus
        self.last = self.now

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        hz = 100 * seconds
        share = self.others / self.n
        self.ticks = [CpuTimes(t.busy + round(hz * share), t.total + round(hz)) for t in self.ticks]
        self.now += seconds

    def sample(self) -> CpuSample:
        return CpuSample(at=self.now, cpus=dict(enumerate(self.ticks)), own=0)


def governor(machine: Machine, torch: FakeTorch) -> ThreadGovernor:
    return ThreadGovernor(
        clock=machine.clock,
        sampler=machine.sample,
        cpus=lambda: tuple(range(machine.n)),
        get_threads=torch.get,
        set_threads=torch.set,
        window_s=0.3,
        recheck_s=30.0,
    )


def test_governor_follows_a_busy_process_while_serving(caplog):
    machine, torch = Machine(), FakeTorch(default=2)
    gov = governor(machine, torch)
    machine.others = 1.0
    first = gov.start()
    machine.advance(3.0)  # the load
    with caplog.at_level(logging.INFO, logger="selftaught.models.threads"):
        assert gov.on_load(first) == 1
    assert torch.calls == [1]
    assert gov.choice is not None and gov.choice.busy == pytest.approx(1.0)
    machine.others = 0.0  # the busy process ends
    for _ in range(40):  # 40 s of decode steps, one a second
        machine.advance(1.0)
        gov.tick()
    assert torch.calls == [1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "1 torch threads" in messages[0]


def test_governor_applies_the_setting_without_reading_proc(monkeypatch):
    machine, torch = Machine(), FakeTorch(default=2)
    gov = governor(machine, torch)
    gov.sampler = lambda: pytest.fail("read /proc with a fixed setting")
    monkeypatch.setenv(th.ENV, "1")
    assert gov.on_load(gov.start()) == 1
    assert gov.tick() == 1 and torch.calls == [1]


def test_governor_without_proc_uses_affinity_and_torch_default():
    machine, torch = Machine(cpus=4), FakeTorch(default=2)
    gov = governor(machine, torch)
    gov.sampler = lambda: None
    assert gov.on_load(gov.start()) == 2
    for _ in range(5):
        machine.advance(40.0)
        assert gov.tick() == 2
    assert torch.calls == []  # torch's default already matches


# ---------------------------------------------------------------------- the local model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_local_model_applies_the_choice_on_load(tmp_path: Path, monkeypatch):
    """Loading a model folder sets torch's threads from the busy reading, and serving
    applies them in the thread that runs the forward passes."""
    from selftaught.models.base import GenerationParams
    from selftaught.models.local import LocalModel
    from tests.test_local_engine import load_tokenizer, save_tiny

    folder = save_tiny(load_tokenizer(), tmp_path / "tiny", seed=0)
    machine, fake = Machine(cpus=2), FakeTorch(default=2)
    machine.others = 1.0
    monkeypatch.setattr(th, "_governor", governor(machine, fake))
    real_sampler = th._governor.sampler

    def sampler() -> CpuSample:  # time passes between readings
        machine.advance(0.5)
        return real_sampler()

    th._governor.sampler = sampler
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail("bypassed governor"))
    local = LocalModel(str(folder))
    _ = local.model
    assert fake.calls == [1]
    fake.threads = 2  # a fresh thread starts with torch's default
    reply = local.chat([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=2))
    assert reply.completion_tokens == 2
    assert fake.calls == [1, 1]
    local.close()
