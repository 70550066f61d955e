"""The attention backend interface: write new K/V into the paged cache, attend over pages.

A backend sees one step at a time. `prepare` runs once per step (index arithmetic shared
by all layers); `forward` runs once per layer. A new backend (as `triton` and `cpu` were) is
one new file implementing these two methods plus an entry in BACKENDS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap · tanh(x / cap): Gemma 2's attention scores and final logits."""
    return torch.tanh(x / cap) * cap


@dataclass
class AttentionMetadata:
    """Flat description of one step: T new tokens from B sequences."""

    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of each new token
    query_start_loc: list[int]  # [B + 1] where each sequence's new tokens start in the flat batch
    seq_lens: list[int]  # [B] tokens in the cache after this step (context + new)
    block_tables: list[list[int]]  # [B][blocks] physical blocks of each sequence
    block_size: int
    sliding_window: int | None = None  # a query sees only keys less than this many positions back
    # the same tables as [B, blocks] int32 on the device, gathered from the worker's copy (Triton backend)
    device_block_tables: torch.Tensor | None = None
    # (sequence, first, last position): runs of new tokens that also see each other's later tokens (Gemma 3's
    # images); every query elsewhere is causal
    both_ways_spans: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    def query_len(self, i: int) -> int:
        return self.query_start_loc[i + 1] - self.query_start_loc[i]


@dataclass
class KVCache:
    """One layer's paged cache: [num_blocks, block_size, 2, kv_heads, head_dim].

    K and V of a token sit side by side, so gathering a block copies one contiguous run
    holding both, and K (or V) of a gathered block range is still a strided view. MLA models
    (llmctl.engine.layers.mla_attention) keep one latent entry per token instead:
    [num_blocks, block_size, 1, 1, kv_lora_rank + qk_rope_head_dim]."""

    kv: torch.Tensor

    @property
    def key(self) -> torch.Tensor:
        return self.kv[:, :, 0]

    @property
    def value(self) -> torch.Tensor:
        return self.kv[:, :, 1]

    def flat_slots(self) -> torch.Tensor:
        """[num_blocks * block_size, 2, kv_heads, head_dim]: one row per token slot."""
        return self.kv.view(-1, *self.kv.shape[2:])

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class AttentionBackend(Protocol):
    name: str

    def prepare(self, meta: AttentionMetadata, device: torch.device) -> None: ...

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        """query [T, H, D], key/value [T, KVH, D] (new tokens) -> output [T, H, D]. `window`: this layer's
        sliding window where layers differ (Gemma; None: the step's `sliding_window`); `softcap`: scores =
        softcap · tanh(scores / softcap) (Gemma 2); `sinks` [H]: a logit per head that joins the softmax's
        denominator and attends to nothing (gpt-oss's attention sinks); `chunk`: a query sees only the keys of its
        own aligned chunk of that many positions, [⌊p / chunk⌋ · chunk, p] (Llama 4's chunked attention)."""
        ...
