"""How many CPU threads each rank's torch ops use: the machine's cores, shared by its ranks."""

from __future__ import annotations

import os

import torch

from llmctl.engine.config import EngineConfig


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on (containers, taskset)
    except AttributeError:
        return os.cpu_count() or 1


def ranks_on_this_machine(config: EngineConfig) -> int:
    """Under torchrun, this node's processes; otherwise every rank of every replica runs here."""
    per_replica = config.tensor_parallel_size * config.pipeline_parallel_size
    return int(os.environ.get("LOCAL_WORLD_SIZE", per_replica)) * config.data_parallel_size


def threads_per_rank(config: EngineConfig) -> int:
    """--cpu-threads, else OMP_NUM_THREADS, else the cores shared evenly, so ranks do not oversubscribe."""
    if config.cpu_threads:
        return config.cpu_threads
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, available_cores() // ranks_on_this_machine(config))


def use_threads(config: EngineConfig) -> int:
    """Set this process's torch thread count (process-wide: replicas in one process share it)."""
    threads = threads_per_rank(config)
    torch.set_num_threads(threads)
    return threads
