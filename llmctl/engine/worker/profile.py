"""The activation peak of the largest step, measured as vLLM's profile run measures it.

Before the KV pool is sized on a GPU, one dummy prefill of `max_num_batched_tokens` tokens
runs through this process's layers (over a throwaway cache just big enough for it, allocated
before the measurement: it is KV, not activation), and on the last stage the sampler runs on
`max_num_seqs` rows of logits with top-k and top-p (its sorts are the largest temporaries); the
allocator's peak above what was allocated before is the activation memory the pool must leave
free: KV = utilization × total − weights − activation peak − other processes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.layers.attention import AttentionBackend, KVCache
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


def run_dummy_step(model: nn.Module, caches: dict[int, KVCache], backend: AttentionBackend, batch: StepBatch,
                   block_size: int, device: torch.device, hidden_size: int, first_stage: bool, last_stage: bool,
                   sampler_rows: int = 0) -> None:
    """The step a real one of this size would be: this stage's layers, and the LM head and the sampler
    (on `sampler_rows` rows) on the last."""
    runner = ModelRunner(model, caches, backend, block_size, device)
    hidden = None if first_stage else torch.zeros(batch.num_tokens, hidden_size, device=device,
                                                  dtype=next(model.parameters()).dtype)
    hidden = runner.forward(batch, hidden)
    if last_stage:
        logits = runner.logits(batch, hidden).sample_logits
        if sampler_rows:
            run_dummy_sampler(logits[:1].float().expand(sampler_rows, -1).contiguous())


def run_dummy_sampler(logits: torch.Tensor) -> None:
    """Top-k, top-p and the draw over every row: what a full batch of sampled requests allocates."""
    from llmctl.engine.sample.sampler import inverse_cdf, probabilities
    from llmctl.engine.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9)] * logits.shape[0]
    inverse_cdf(probabilities(logits, params), torch.full((logits.shape[0],), 0.5, device=logits.device))


def measure_activation_peak(device: torch.device, setup: Callable[[], object], step: Callable[[object], None]) -> int:
    """Bytes `step(setup())` allocates at its peak beyond what was allocated after `setup` (CUDA only):
    what setup allocates (the throwaway KV cache) is not activation."""
    prepared = setup()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step(prepared)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del prepared
    torch.cuda.empty_cache()
    return max(0, peak)
