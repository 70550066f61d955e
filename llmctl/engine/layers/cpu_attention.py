"""The `cpu` attention backend: llmctl's C++ paged-attention kernel for the tokens it suits.

Decodes and prompt chunks of up to `paged_query_limit` new tokens (the limits below;
llmctl.engine.attention_selector words the startup log from them) go to
`torch.ops.llmctl_cpu.paged_attention`, which reads the KV pages in place: no gathered
copy, no padding to the longest context, no mask. Where the kernel keeps its rows in
AVX-512 registers (float32, bfloat16 or float16 caches, head sizes of multiples of 16) it beats
torch's SDPA on whole prompts too, up to a few hundred tokens (`benchmarks/cpu_attention.py
--prompts`); its plain loop (no AVX-512) and its AVX2 register rows are used only on short
chunks over cached tokens (the AVX2 rows were not measured against SDPA on prompts).
Longer prompts attend with SDPA, as the `torch`
backend (llmctl.engine.layers.torch_attention) does: that backend is the reference this
one is tested against. An fp8 KV cache runs on the `torch` backend
(llmctl.engine.attention_selector decides).
"""

from __future__ import annotations

import torch

from llmctl.engine.layers.attention import AttentionMetadata, KVCache
from llmctl.engine.layers.torch_attention import TorchAttention
from llmctl.kernels import cpu as cpu_kernels
from llmctl.kernels.limits import HALF_VECTOR_QUERY_LIMIT, SHORT_QUERY_LIMIT, VECTOR_QUERY_LIMIT

VECTOR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def paged_query_limit(dtype: torch.dtype, head_dim: int) -> int:
    """New tokens per sequence up to which the kernel attends (a fresh prompt only where it vectorizes)."""
    vector_rows = dtype in VECTOR_DTYPES and head_dim % 16 == 0 and cpu_kernels.built_for_avx512()
    if not vector_rows:
        return SHORT_QUERY_LIMIT
    return VECTOR_QUERY_LIMIT if dtype == torch.float32 else HALF_VECTOR_QUERY_LIMIT


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, KVH, D] as store_kv takes it: each token's row contiguous (views of the QKV output are). A fresh
    copy, not .contiguous(): torch counts a tensor of one KV head contiguous whatever that dim's stride (MQA)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)


class CPUAttention:
    name = "cpu"

    def __init__(self, dtype: torch.dtype = torch.float32, head_dim: int = 64) -> None:
        cpu_kernels.load()
        self.query_limit = paged_query_limit(dtype, head_dim)
        self.fresh_prompts = self.query_limit > SHORT_QUERY_LIMIT
        self.torch = TorchAttention()  # the prompts above the limit
        self.meta: AttentionMetadata | None = None
        self.paged_rows: torch.Tensor | None = None  # flat rows the paged kernel answers; None: all of them
        self.paged: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # tables, lens, starts (int32)

    def prepare(self, meta: AttentionMetadata, device: torch.device) -> None:
        self.meta = meta
        both_ways = {seq for seq, _, _ in meta.both_ways_spans}  # the kernel's mask is causal only: SDPA's
        paged = [i for i in range(meta.num_seqs) if meta.query_len(i) <= self.query_limit and i not in both_ways
                 and (self.fresh_prompts or meta.query_len(i) < meta.seq_lens[i])]
        chosen = set(paged)
        self.torch.prepare(meta, device, only=[i for i in range(meta.num_seqs) if i not in chosen])
        self.paged, self.paged_rows = None, None
        if not paged:
            return
        lens = [meta.query_len(i) for i in paged]
        starts = [0]
        for length in lens:
            starts.append(starts[-1] + length)
        width = max(len(meta.block_tables[i]) for i in paged)
        tables = torch.tensor([meta.block_tables[i] + [0] * (width - len(meta.block_tables[i])) for i in paged],
                              dtype=torch.int32)  # padding is never read: each sequence stops at its length
        self.paged = (tables, torch.tensor([meta.seq_lens[i] for i in paged], dtype=torch.int32),
                      torch.tensor(starts, dtype=torch.int32))
        if len(paged) < meta.num_seqs:
            self.paged_rows = torch.tensor([r for i in paged for r in range(meta.query_start_loc[i],
                                                                            meta.query_start_loc[i + 1])])

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        assert self.meta is not None, "prepare() runs before forward()"
        cpu_kernels.store_kv(cache.kv, self.meta.slot_mapping, _token_rows(key), _token_rows(value))
        output = self.torch.attend(query, key, value, cache, scale=scale, alibi_slopes=alibi_slopes, window=window,
                                   softcap=softcap, sinks=sinks, chunk=chunk)
        if self.paged is None:
            return output
        tables, lens, starts = self.paged
        rows = self.paged_rows
        q = query if rows is None else query.index_select(0, rows)
        out = torch.empty_like(q)
        cpu_kernels.paged_attention(out, q, cache.kv, tables, lens, starts, scale, alibi_slopes,
                                    window or self.meta.sliding_window, softcap, sinks, chunk)
        if rows is None:
            return out
        output.index_copy_(0, rows, out)
        return output
