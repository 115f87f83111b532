"""How many torch threads the local model uses: the cores this process may use, less the ones
other processes keep busy, unless a setting fixes the number.

On a CPU, two threads fighting for one core lose to one thread (measured: the quick-start eval
of 40 items took 56-71 s alone, 140 s beside one busy process with torch's default threads,
62 s beside it with one thread). So the number follows what is free, and is checked again
while the model serves.

- **usable**: the CPUs of this process's affinity (`os.sched_getaffinity`; `os.cpu_count()`
  where that does not exist), never more than torch's own default (its physical cores, or
  `OMP_NUM_THREADS`).
- **busy**: from two readings of `/proc/stat` (per usable CPU) and `/proc/self/stat` a short
  window apart: the cores' busy time less this process's own CPU time, in cores. Off Linux
  (or when /proc cannot be read) it is unknown and the choice is the usable count.
- **the setting**: `SELFTAUGHT_THREADS=N` (or `train --threads N`, the same thing) fixes the
  number; `auto` or unset lets it follow the machine.

The parsers and the choice are pure functions over /proc text, so tests feed them fixtures.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from selftaught.errors import ConfigError

ENV = "SELFTAUGHT_THREADS"
WINDOW_S = 0.3  # one busy reading: two samples this far apart
RECHECK_S = 30.0  # while serving, the busy estimate is taken again this often
BUSY_SHARE = 0.6  # a core counts as taken when other processes keep it this busy

log = logging.getLogger(__name__)

_override: int | None = None  # `train --threads` (wins over the environment)


# ---------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's counters from /proc/stat, in clock ticks."""

    busy: int
    total: int


def parse_proc_stat(text: str) -> dict[int, CpuTimes]:
    """Per-CPU busy and total ticks of /proc/stat (the `cpuN` lines). Busy counts user,
    nice, system, irq, softirq and steal (a core the hypervisor takes is not ours);
    idle and iowait are free."""
    cpus: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu":
            continue
        try:
            index = int(fields[0][3:])
            values = [int(v) for v in fields[1:9]]
        except ValueError:
            continue
        values += [0] * (8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, steal = values
        busy = user + nice + system + irq + softirq + steal
        cpus[index] = CpuTimes(busy=busy, total=busy + idle + iowait)
    return cpus


def parse_self_stat(text: str) -> int:
    """This process's CPU time (utime + stime, all its threads) in clock ticks, from
    /proc/self/stat. The command name may hold spaces and parentheses: fields are counted
    after its last ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    return int(rest[11]) + int(rest[12])


def busy_cores(
    before: Mapping[int, CpuTimes],
    after: Mapping[int, CpuTimes],
    own_ticks: int,
    cpus: tuple[int, ...],
) -> float:
    """How many of `cpus` other processes kept busy between two readings: the busy share
    of each CPU, summed, less this process's own ticks (`own_ticks`, over the same window)
    in cores. Never below 0."""
    shares: list[float] = []
    spans: list[int] = []
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            continue
        total = after[cpu].total - before[cpu].total
        if total <= 0:
            continue
        busy = after[cpu].busy - before[cpu].busy
        shares.append(min(1.0, max(0.0, busy / total)))
        spans.append(total)
    if not shares:
        return 0.0
    own_cores = own_ticks / (sum(spans) / len(spans))
    return max(0.0, sum(shares) - own_cores)


def choose_threads(
    usable: int, busy: float | None, *, setting: int | None = None, ceiling: int | None = None
) -> int:
    """The threads to use: the setting when there is one; else the usable cores (at most
    `ceiling`, torch's default) less those other processes keep busy (a core counts when
    they keep it `BUSY_SHARE` busy), at least 1."""
    if setting is not None:
        return setting
    free = max(1, usable)
    if ceiling is not None:
        free = min(free, max(1, ceiling))
    if busy is not None:
        taken = math.floor(busy + 1 - BUSY_SHARE)
        free = min(free, usable - taken)
    return max(1, free)


def parse_setting(value: str | None) -> int | None:
    """`SELFTAUGHT_THREADS`: a positive number fixes the threads; unset, empty or `auto`
    follows the machine."""
    if value is None or value.strip().lower() in ("", "auto"):
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{ENV} must be a positive number of threads or 'auto', got {value!r}")
    return n


# ---------------------------------------------------------------------- this machine


def configure(threads: int | None) -> None:
    """Fix the threads for this process (`train --threads`; None: back to the environment's
    setting)."""
    global _override
    if threads is not None and threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}")
    _override = threads


def fix_threads(threads: int) -> None:
    """Fix the threads now and for every local model of this process (`train --threads`,
    a benchmark's `--threads`): `torch.set_num_threads` alone would be undone by the next
    model load."""
    configure(threads)
    governor().apply()


def thread_setting(env: Mapping[str, str] | None = None) -> int | None:
    """The fixed number of threads, if any: `configure`'s, else `SELFTAUGHT_THREADS`."""
    if _override is not None:
        return _override
    return parse_setting((os.environ if env is None else env).get(ENV))


def usable_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return tuple(sorted(getaffinity(0)))
        except OSError:
            pass
    return tuple(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class CpuSample:
    """One reading of the counters: when, every CPU's, and this process's own."""

    at: float
    cpus: dict[int, CpuTimes]
    own: int


def take_sample(clock: Callable[[], float] = time.monotonic) -> CpuSample | None:
    """Read /proc now; None where there is no /proc (not Linux) or it cannot be read."""
    try:
        with open("/proc/stat") as f:
            stat = f.read()
        with open("/proc/self/stat") as f:
            own = parse_self_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    cpus = parse_proc_stat(stat)
    return CpuSample(at=clock(), cpus=cpus, own=own) if cpus else None


def busy_between(first: CpuSample, second: CpuSample, cpus: tuple[int, ...]) -> float:
    return busy_cores(first.cpus, second.cpus, second.own - first.own, cpus)


@dataclass(frozen=True)
class ThreadChoice:
    """What was chosen and from what (`selftaught doctor` prints it)."""

    usable: int
    busy: float | None  # cores other processes keep busy; None: unknown (not Linux)
    setting: int | None
    ceiling: int | None  # torch's default threads
    threads: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "usable": self.usable,
            "busy": None if self.busy is None else round(self.busy, 2),
            "setting": self.setting,
            "ceiling": self.ceiling,
            "threads": self.threads,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThreadChoice:
        names = ("usable", "busy", "setting", "ceiling", "threads")
        fields: dict[str, Any] = {k: d.get(k) for k in names}  # JSON values, as written
        return cls(**fields)


def torch_default_threads() -> int | None:
    """Torch's default intra-op threads (its physical cores, or OMP_NUM_THREADS), read
    before selftaught changes them; None without torch."""
    return governor().ceiling()


def measure(
    window_s: float = WINDOW_S, sleep: Callable[[float], None] = time.sleep
) -> ThreadChoice:
    """The choice now, from a busy reading `window_s` long (blocking)."""
    setting = thread_setting()
    cpus = usable_cpus()
    busy = None
    first = take_sample() if setting is None else None
    if first is not None:
        sleep(window_s)
        second = take_sample()
        busy = None if second is None else busy_between(first, second, cpus)
    ceiling = torch_default_threads()
    threads = choose_threads(len(cpus), busy, setting=setting, ceiling=ceiling)
    return ThreadChoice(len(cpus), busy, setting, ceiling, threads)


# ---------------------------------------------------------------------- the governor


def _torch_get() -> int:
    import torch

    return int(torch.get_num_threads())


def _torch_set(n: int) -> None:
    import torch

    torch.set_num_threads(n)


class ThreadGovernor:
    """The threads torch uses where the local model runs, for the whole process.

    `on_load` chooses when a model is loaded (the busy reading spans the load); `tick`, called
    between forward passes in the thread that runs them, applies the choice to that thread
    (torch keeps an OpenMP thread count per calling thread) and takes a new busy reading every
    `recheck_s`, without blocking: one sample now, the second one `window_s` later.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sampler: Callable[[], CpuSample | None] | None = None,
        cpus: Callable[[], tuple[int, ...]] = usable_cpus,
        get_threads: Callable[[], int] = _torch_get,
        set_threads: Callable[[int], None] = _torch_set,
        window_s: float = WINDOW_S,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.clock = clock
        self.sampler = sampler or (lambda: take_sample(clock))
        self.cpus = cpus
        self.get_threads, self.set_threads = get_threads, set_threads
        self.window_s, self.recheck_s = window_s, recheck_s
        self.choice: ThreadChoice | None = None
        self._ceiling: int | None = None
        self._ceiling_read = False
        self._pending: CpuSample | None = None
        self._next_check = 0.0
        self._lock = threading.Lock()

    def ceiling(self) -> int | None:
        """Torch's default threads, read once, before anything here changes them."""
        with self._lock:
            if not self._ceiling_read:
                self._ceiling_read = True
                try:
                    self._ceiling = self.get_threads()
                except ImportError:
                    self._ceiling = None
            return self._ceiling

    def start(self) -> CpuSample | None:
        """The first sample of a load's busy reading (None when a fresh choice exists or the
        setting fixes the threads)."""
        if thread_setting() is not None or self._fresh():
            return None
        return self.sampler()

    def on_load(self, first: CpuSample | None = None) -> int:
        """Choose (from `first`, taken by `start` before the load, to now; waiting out the
        rest of the window when the load was quicker) and apply in this thread."""
        setting = thread_setting()
        if setting is None and not self._fresh():
            first = first or self.sampler()
            if first is not None:
                left = self.window_s - (self.clock() - first.at)
                if left > 0:
                    time.sleep(left)
            self._decide(first, self.sampler() if first is not None else None)
        return self.apply()

    def tick(self) -> int:
        """Between forward passes: take the next busy reading when one is due, apply."""
        if thread_setting() is None:
            now = self.clock()
            with self._lock:
                pending, due = self._pending, now >= self._next_check
                if pending is not None and now - pending.at > 10 * self.window_s:
                    pending = self._pending = None  # spans an idle spell: read afresh
            if pending is None and due:
                sample = self.sampler()
                with self._lock:
                    self._pending = sample
                    if sample is None:  # no /proc: affinity only, no more readings
                        self._next_check = math.inf
                if sample is None:
                    self._decide(None, None)
            elif pending is not None and now - pending.at >= self.window_s:
                with self._lock:
                    self._pending = None
                self._decide(pending, self.sampler())
        return self.apply()

    def apply(self) -> int:
        """Set the chosen threads in the calling thread (when they differ); returns them."""
        threads = self.current()
        if self.get_threads() != threads:
            self.set_threads(threads)
        return threads

    def current(self) -> int:
        """The threads chosen (the setting's when it fixes them)."""
        setting = thread_setting()
        if setting is not None:
            return setting
        if self.choice is None:
            self._decide(None, None)
        assert self.choice is not None
        return self.choice.threads

    def _fresh(self) -> bool:
        return self.choice is not None and self.clock() < self._next_check

    def _decide(self, first: CpuSample | None, second: CpuSample | None) -> None:
        cpus = self.cpus()
        busy = None if first is None or second is None else busy_between(first, second, cpus)
        ceiling = self.ceiling()
        threads = choose_threads(len(cpus), busy, ceiling=ceiling)
        choice = ThreadChoice(len(cpus), busy, None, ceiling, threads)
        with self._lock:
            old, self.choice = self.choice, choice
            if busy is not None:
                self._next_check = self.clock() + self.recheck_s
        if old is None or old.threads != threads:
            shown = "unknown" if busy is None else f"{busy:.1f}"
            log.info(
                "local model: %d torch threads (%d usable cores, %s busy elsewhere)",
                threads,
                len(cpus),
                shown,
            )


_governor: ThreadGovernor | None = None
_governor_lock = threading.Lock()


def governor() -> ThreadGovernor:
    """The process's governor (one for every local model: they share the cores)."""
    global _governor
    with _governor_lock:
        if _governor is None:
            _governor = ThreadGovernor()
        return _governor
