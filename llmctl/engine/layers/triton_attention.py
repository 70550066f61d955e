"""The `triton` attention backend: llmctl's own kernels over the paged cache, read in place.

`prepare` turns the step's lists into int32 device tensors once per step (copied from pinned
memory without blocking on CUDA); `forward` stores the new K/V (`kernels.kv_store`) and runs
one paged-attention launch for the whole step (`kernels.attention`).
"""

from __future__ import annotations

import torch

from llmctl.engine.layers.attention import AttentionMetadata, KVCache
from llmctl.engine.transfer import to_device


class TritonAttention:
    name = "triton"

    def __init__(self) -> None:
        from llmctl.kernels import attention, kv_store  # imports triton: only when this backend is chosen

        self._attention, self._kv_store = attention, kv_store
        self.meta: AttentionMetadata | None = None

    def prepare(self, meta: AttentionMetadata, device: torch.device) -> None:
        self.meta = meta
        width = max((len(t) for t in meta.block_tables), default=1)
        tables = torch.zeros(len(meta.block_tables), max(width, 1), dtype=torch.int32)
        for row, table in enumerate(meta.block_tables):
            tables[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
        self.block_tables = to_device(tables, torch.int32, device)
        self.seq_lens = to_device(meta.seq_lens, torch.int32, device)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "prepare() runs before forward()"
        self._kv_store.store_kv(key.contiguous(), value.contiguous(), cache.kv, meta.slot_mapping)
        options = self._attention.AttentionOptions(
            scale=scale, alibi_slopes=None if alibi_slopes is None else alibi_slopes.float().contiguous(),
            sliding_window=meta.sliding_window)
        return self._attention.paged_attention(query.contiguous(), cache.kv, self.block_tables, self.seq_lens,
                                               meta.query_start_loc, options, seq_lens_list=meta.seq_lens)

