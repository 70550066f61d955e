"""The `triton` attention backend: llmctl's own kernels over the paged cache, read in place.

`prepare` takes the step's block tables as gathered on the device from the worker's copy
(llmctl.engine.worker.block_tables) and its other lists as int32 device tensors (copied from
pinned memory without blocking on CUDA); `forward` stores the new K/V (`kernels.kv_store`) and runs
one paged-attention launch for the whole step (`kernels.attention`). A forward reads only
device tensors, so a decode step can be captured in a CUDA graph over static buffers
(`use_static`, see `llmctl.engine.worker.cuda_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmctl.engine.layers import attention_ops
from llmctl.engine.layers.attention import AttentionMetadata, KVCache
from llmctl.kernels.transfer import to_device


@dataclass
class StepTensors:
    """What attention reads in a step, on the device."""

    slot_mapping: torch.Tensor  # [T] int64, -1 = store nothing
    block_tables: torch.Tensor  # [B, n] int32
    seq_lens: torch.Tensor  # [B] int32
    layout: object | None  # kernels.attention.StepLayout; planned by the first layer when None
    query_start_loc: list[int]
    sliding_window: int | None
    context: int = 0  # the longest sequence (the decode split is sized to it); 0: unknown
    key_limits: torch.Tensor | None = None  # [T] int32 where an image's tokens see each other both ways (Gemma 3)


def key_limits(meta: AttentionMetadata) -> list[int]:
    """The last key position each new token sees: its own, or the last of the image it belongs to."""
    limits: list[int] = []
    for i in range(meta.num_seqs):
        limits += range(meta.seq_lens[i] - meta.query_len(i), meta.seq_lens[i])
    for seq, first, last in meta.both_ways_spans:
        offset = meta.query_start_loc[seq] - (meta.seq_lens[seq] - meta.query_len(seq))  # row of position 0
        for position in range(max(first, meta.seq_lens[seq] - meta.query_len(seq)), last + 1):
            limits[offset + position] = last
    return limits


class TritonAttention:
    name = "triton"
    rotates_on_store = True  # forward_rotated: RoPE inside the KV store's launch

    def __init__(self) -> None:
        from llmctl.kernels import attention, kv_store  # imports triton: only when this backend is chosen

        self._attention, self._kv_store = attention, kv_store
        self.step: StepTensors | None = None

    def prepare(self, meta: AttentionMetadata, device: torch.device) -> None:
        tables = meta.device_block_tables
        if tables is None:  # a batch with whole tables (profiling, draft proposals): one padded host tensor
            width = max(1, max((len(t) for t in meta.block_tables), default=1))
            host = torch.tensor([table + [0] * (width - len(table)) for table in meta.block_tables] or [[0]],
                                dtype=torch.int32)[:len(meta.block_tables)]
            tables = to_device(host, torch.int32, device)
        limits = to_device(key_limits(meta), torch.int32, device) if meta.both_ways_spans else None
        self.step = StepTensors(meta.slot_mapping, tables, to_device(meta.seq_lens, torch.int32, device), None,
                                meta.query_start_loc, meta.sliding_window, max(meta.seq_lens, default=0), limits)

    def use_static(self, step: StepTensors) -> None:
        """Read the step from these tensors (a captured graph's buffers) until the next prepare."""
        self.step = step

    def plan_uniform(self, size: int, tokens_per_row: int, heads: int, kv_heads: int, device: torch.device,
                     context: int = 0) -> object:
        """The layout of `size` sequences of `tokens_per_row` new tokens each (1: a decode step; 1 + k: a
        speculative verification), of up to `context` tokens (fixed for a captured graph; a decode step's
        context split, chosen from the batch size, the GPU's SM count and that longest context, is captured
        with it)."""
        starts = list(range(0, size * tokens_per_row + 1, tokens_per_row))
        return self._attention.plan_step(starts, heads, kv_heads, device, context=context)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        step = self.step
        assert step is not None, "prepare() or use_static() runs before forward()"
        self._kv_store.store_kv(key.contiguous(), value.contiguous(), cache.kv, step.slot_mapping)
        return self._attend(query.contiguous(), key.shape[1], cache, scale=scale, alibi_slopes=alibi_slopes,
                            window=window, softcap=softcap, sinks=sinks, chunk=chunk)

    def forward_rotated(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, cache: KVCache, *, scale: float, window: int | None = None,
                        softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """forward() for q and k not yet rotated: one launch rotates q, rotates k into the cache and stores v
        (`kernels.rotary_store`), reading all three through their strides (views of the qkv projection)."""
        step = self.step
        assert step is not None, "prepare() or use_static() runs before forward()"
        query = attention_ops.rotary_store(query, key, value, cos, sin, cache.kv, step.slot_mapping)
        return self._attend(query, key.shape[1], cache, scale=scale, window=window, softcap=softcap, sinks=sinks)

    def _attend(self, query: torch.Tensor, kv_heads: int, cache: KVCache, *, scale: float,
                alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        """The paged attention of the stored step (query contiguous)."""
        step = self.step
        assert step is not None
        if step.layout is None:  # the first layer of the step plans it for all
            step.layout = self._attention.plan_step(step.query_start_loc, query.shape[1], kv_heads, query.device,
                                                    context=step.context)
        options = self._attention.AttentionOptions(
            scale=scale, alibi_slopes=None if alibi_slopes is None else alibi_slopes.float().contiguous(),
            sliding_window=window or step.sliding_window, softcap=softcap, key_limits=step.key_limits,
            sinks=None if sinks is None else sinks.float().contiguous(), chunk=chunk)
        return attention_ops.paged_attention(query, cache.kv, step.block_tables, step.seq_lens, step.layout, options)
