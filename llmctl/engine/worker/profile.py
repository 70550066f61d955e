"""The activation peak of the largest step, measured as vLLM's profile run measures it.

Before the KV pool is sized on a GPU, one dummy prefill of `max_num_batched_tokens` tokens
runs through this process's layers (over a throwaway cache just big enough for it); the
allocator's peak above what was allocated before is the activation memory the pool must
leave free: KV = utilization × total − weights − activation peak − other processes.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from llmctl.engine.layers.attention import AttentionBackend, KVCache
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.worker.model_runner import ModelRunner


def dummy_prefill(num_tokens: int, max_model_len: int, block_size: int) -> tuple[StepBatch, int]:
    """Sequences of up to max_model_len tokens, num_tokens in all, each in blocks of its own;
    returns the batch and the blocks it uses."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, lens, tables, sample_rows = [0], [], [], []
    next_block = 0
    while len(ids) < num_tokens:
        length = min(num_tokens - len(ids), max_model_len)
        table = list(range(next_block, next_block + -(-length // block_size)))
        next_block += len(table)
        for pos in range(length):
            ids.append(0)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(len(ids))
        lens.append(length)
        tables.append(table)
        sample_rows.append(len(ids) - 1)
    return StepBatch(ids, positions, slots, starts, lens, tables, sample_rows), next_block


def run_dummy_step(model: nn.Module, make_caches: Callable[[int], dict[int, KVCache]], backend: AttentionBackend,
                   batch: StepBatch, blocks: int, block_size: int, device: torch.device, hidden_size: int,
                   first_stage: bool, last_stage: bool) -> None:
    """The step a real one of this size would be: this stage's layers, and the LM head on the last."""
    runner = ModelRunner(model, make_caches(blocks), backend, block_size, device)
    hidden = None if first_stage else torch.zeros(batch.num_tokens, hidden_size, device=device,
                                                  dtype=next(model.parameters()).dtype)
    hidden = runner.forward(batch, hidden)
    if last_stage:
        runner.logits(batch, hidden)


def measure_activation_peak(device: torch.device, step: Callable[[], None]) -> int:
    """Bytes the step allocates at its peak beyond what was allocated before it (CUDA only)."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return max(0, peak)
