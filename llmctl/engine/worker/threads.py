"""How many CPU threads each rank's torch ops use: the machine's cores, shared by its ranks."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from llmctl.engine.config import EngineConfig
from llmctl.engine.worker.cpu_share import ThreadGovernor


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (containers, taskset)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def available_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The allowed CPUs, or fewer where a cgroup quota gives less time than that (a container's --cpus)."""
    cores = len(allowed_cpus())
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else max(1, min(cores, math.ceil(int(quota) / int(period))))


def ranks_on_this_machine(config: EngineConfig) -> int:
    """Under torchrun, this node's processes; otherwise every rank of every replica runs here."""
    per_replica = config.tensor_parallel_size * config.pipeline_parallel_size
    return int(os.environ.get("LOCAL_WORLD_SIZE", per_replica)) * config.data_parallel_size


def threads_given(config: EngineConfig) -> int | None:
    """--cpu-threads, else OMP_NUM_THREADS: a count the user fixed."""
    if config.cpu_threads:
        return config.cpu_threads
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return None


def threads_per_rank(config: EngineConfig) -> int:
    """The count given, else the cores shared evenly, so ranks do not oversubscribe."""
    return threads_given(config) or max(1, available_cores() // ranks_on_this_machine(config))


def thread_governor(config: EngineConfig, threads: int, device: torch.device) -> ThreadGovernor | None:
    """One process on the CPU with a count it chose itself: give way to busy neighbours (cpu_share)."""
    if device.type != "cpu" or threads_given(config) or threads < 2 or ranks_on_this_machine(config) > 1:
        return None
    return ThreadGovernor(allowed_cpus(), threads)


def use_threads(config: EngineConfig) -> int:
    """Set this process's torch thread count (process-wide: replicas in one process share it)."""
    threads = threads_per_rank(config)
    torch.set_num_threads(threads)
    return threads
