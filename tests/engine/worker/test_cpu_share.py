"""Giving way to busy neighbours on a CPU (llmctl.engine.worker.cpu_share): the thread count from the
CPU counters, read from /proc/stat-formatted text and cgroup files written here."""

from __future__ import annotations

import pytest
import torch

from llmctl.engine.config import EngineConfig
from llmctl.engine.worker.cpu_share import CpuSample, read_sample, threads_to_use
from llmctl.engine.worker.threads import available_cores, thread_governor

STAT = """cpu  500 0 500 900 100 0 0 0 0 0
cpu0 100 0 100 400 50 0 0 0 0 0
cpu1 300 0 300 100 20 0 0 0 0 0
cpu2 100 0 100 400 30 0 0 0 0 0
intr 12345
ctxt 999
"""


def test_the_counters_of_the_allowed_cpus_are_summed(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    sample = read_sample({0, 1}, stat)
    assert (sample.busy, sample.total) == (200 + 600, 650 + 720)  # idle and iowait are not busy


def test_ours_counts_this_process_cpu_time(tmp_path):
    """`ours` follows this process's own CPU time (as time.process_time measures it, in clock ticks)."""
    import os
    import time

    stat = tmp_path / "stat"
    stat.write_text(STAT)
    before, started = read_sample({0, 1}, stat), time.process_time()
    while time.process_time() - started < 0.3:  # spin: CPU time, not wall time, is what advances here
        sum(range(1000))
    spent = (time.process_time() - started) * os.sysconf("SC_CLK_TCK")
    after = read_sample({0, 1}, stat)
    assert spent * 0.8 <= after.ours - before.ours <= spent * 1.2 + 2
    assert read_sample({0}, tmp_path / "missing") is None


@pytest.mark.parametrize("others_busy, ours, expected", [
    (0, 200, 2),  # a quiet machine: every core
    (30, 170, 2),  # a light neighbour (0.3 of a core) takes no core away
    (67, 133, 1),  # one busy process beside our two spinning threads: it holds ~2/3 of a core, we give one up
    (100, 100, 1),  # and beside one thread it holds a whole core
    (200, 0, 1),  # never fewer than one
])
def test_threads_follow_the_cores_others_keep_busy(others_busy, ours, expected):
    """Two cores over an interval of 100 ticks each (200 in all)."""
    before = CpuSample(busy=1000, total=5000, ours=400)
    after = CpuSample(busy=1000 + others_busy + ours, total=5200, ours=400 + ours)
    assert threads_to_use(before, after, cores=2, most=2) == expected


def test_never_more_than_given_and_no_interval_changes_nothing():
    before = CpuSample(0, 0, 0)
    assert threads_to_use(before, CpuSample(100, 800, 100), cores=8, most=4) == 4
    assert threads_to_use(before, before, cores=8, most=3) == 3


def test_a_cgroup_quota_caps_the_cores(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("100000 100000\n")
    assert available_cores(cpu_max) == 1
    cpu_max.write_text("max 100000\n")
    assert available_cores(cpu_max) == available_cores(tmp_path / "missing") >= 1


def test_a_count_the_user_fixed_is_kept(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu = torch.device("cpu")
    assert thread_governor(EngineConfig(model="m", cpu_threads=2), 2, cpu) is None
    assert thread_governor(EngineConfig(model="m"), 2, torch.device("cuda")) is None
    assert thread_governor(EngineConfig(model="m"), 2, cpu) is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert thread_governor(EngineConfig(model="m"), 2, cpu) is None


def test_what_neighbours_did_while_the_engine_was_idle_does_not_count(monkeypatch):
    """Two cores. A neighbour keeps both busy for 100 s while the engine waits for requests, then stops; the
    engine's next step (0.6 s, both cores its own) keeps both threads: only the time it stepped is measured."""
    from llmctl.engine.worker import cpu_share

    clock = {"now": 0.0}
    samples = iter([CpuSample(0, 0, 0),  # at start-up
                    CpuSample(20_000, 20_000, 0),  # before the step: the neighbour's 100 s on both cores
                    CpuSample(20_120, 20_120, 120)])  # after it: 0.6 s, all of it ours
    monkeypatch.setattr(cpu_share.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(cpu_share, "read_sample", lambda cpus: next(samples))
    monkeypatch.setattr(cpu_share.torch, "set_num_threads", lambda n: pytest.fail(f"set to {n} threads"))
    governor = cpu_share.ThreadGovernor({0, 1}, most=2)
    clock["now"] = 100.0
    governor.before_step()
    clock["now"] = 100.6
    governor.after_step()
    assert governor.threads == 2
