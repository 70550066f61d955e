"""Sharing the CPU with other processes: use the cores the rest of the machine leaves free.

torch's OpenMP threads spin while they wait for each other. On a quiet machine that is what
makes small parallel ops fast; with a busy neighbour on one of two cores, a thread spinning for
a peer that is not scheduled burns the time slice the peer needs, and a step takes several times
longer (a 2-core machine: 226 → 68 output tok/s with one busy process, 114 with one thread —
`benchmarks/background_load.py`). So between steps the engine looks at how busy the CPUs it may
run on were, apart from its own time, and runs on as many threads as there are cores left over
(at least one, at most what it was given). Turning spinning off instead (OMP_WAIT_POLICY=passive)
costs a third of the quiet speed; this costs nothing while the machine is quiet.

Only the one-process engine on a CPU adjusts, and only when the thread count was not fixed by
--cpu-threads or OMP_NUM_THREADS (then it is kept as given).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("llmctl.engine")
CHECK_EVERY_S = 0.5  # /proc/stat counts in 10 ms ticks: half a second is 50 per core


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU time, in clock ticks, of the CPUs this process may run on."""

    busy: int  # not idle, by any process
    total: int  # all of it
    ours: int  # this process's own user + system time


def read_sample(cpus: set[int], stat: Path = Path("/proc/stat")) -> CpuSample | None:
    """The counters now, or None where /proc/stat cannot be read (not Linux)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + ticks[4]
        total += sum(ticks)
        busy += sum(ticks) - idle
    times = os.times()
    return CpuSample(busy, total, round((times.user + times.system) * os.sysconf("SC_CLK_TCK")))


def threads_to_use(before: CpuSample, after: CpuSample, cores: int, most: int) -> int:
    """The cores the other processes left free over the interval (their busy cores rounded to the
    nearest whole), at least 1 and at most `most`."""
    elapsed = after.total - before.total
    if elapsed <= 0:
        return most
    others = max(0, (after.busy - before.busy) - (after.ours - before.ours)) * cores / elapsed
    return max(1, min(most, cores - int(others + 0.5)))


class ThreadGovernor:
    """Called around every step; every CHECK_EVERY_S of stepping it sets torch's thread count from the last
    interval. An interval starts again after the engine sat idle: what other processes did while it waited for
    requests (a benchmark's other side, a finished job) says nothing about the cores its next steps will find."""

    def __init__(self, cpus: set[int], most: int) -> None:
        self.cpus, self.most, self.threads = cpus, most, most
        self._last = read_sample(cpus)
        self._checked = time.monotonic()
        self._stepped = self._checked  # when the last step ended

    def before_step(self) -> None:
        now = time.monotonic()
        if now - self._stepped > CHECK_EVERY_S:  # idle since: measure from here
            self._last, self._checked = read_sample(self.cpus), now

    def after_step(self) -> None:
        now = self._stepped = time.monotonic()
        if self._last is None or now - self._checked < CHECK_EVERY_S:
            return
        sample = read_sample(self.cpus)
        if sample is None:
            return
        threads = threads_to_use(self._last, sample, len(self.cpus), self.most)
        self._last, self._checked = sample, now
        if threads != self.threads:
            logger.info("CPU threads %d → %d: the cores other processes leave free", self.threads, threads)
            torch.set_num_threads(threads)
            self.threads = threads
