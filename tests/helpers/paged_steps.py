"""A paged-attention step to test kernels on: random queries, and K/V pages scattered over a
NaN-filled pool so that reading a wrong page shows up."""

from __future__ import annotations

import torch


def paged_step(query_lens: list[int], seq_lens: list[int], *, heads: int, kv_heads: int, dim: int, block_size: int,
               dtype: torch.dtype, device: str = "cpu", pool_blocks: int = 64, seed: int = 0):
    """A step over a NaN-filled pool: each sequence's pages are random, non-contiguous blocks."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((pool_blocks, block_size, 2, kv_heads, dim), float("nan"), dtype=dtype)
    pages = [-(-length // block_size) for length in seq_lens]
    chosen = torch.randperm(pool_blocks, generator=gen)[: sum(pages)]
    width = max(pages)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for seq, (count, length) in enumerate(zip(pages, seq_lens)):
        tables[seq, :count] = chosen[used:used + count].to(torch.int32)
        used += count
        flat = cache[tables[seq, :count].long()].flatten(0, 1)
        flat[:length] = torch.randn(length, 2, kv_heads, dim, generator=gen).to(dtype)
        cache[tables[seq, :count].long()] = flat.view(count, block_size, 2, kv_heads, dim)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], heads, dim, generator=gen).to(dtype)
    return (query.to(device), cache.to(device), tables.to(device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device), starts)
