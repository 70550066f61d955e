"""The Triton attention backend's launches as torch ops: `llmctl::rotary_store` (RoPE + KV store) and
`llmctl::paged_attention` (the paged attention of a step, with its merge launch when the context is split).

Registered ops rather than plain calls for the same reason as `fused_ops`: their fake implementations let a
trace over fake CUDA tensors run a whole decoder layer on a machine without a GPU and count its launches
(tests/engine/layers/test_launch_count.py). The kernels are imported on first call (triton only where used)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmctl.kernels.torch_ops import define

if TYPE_CHECKING:
    from llmctl.kernels.attention import AttentionOptions, StepLayout


def _rotary_store(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    from llmctl.kernels import rotary_store

    return rotary_store.rotary_store(query, key, value, cos, sin, kv_cache, slots)


def _rotary_store_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return torch.empty(query.shape, dtype=query.dtype, device=query.device)


def _paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_seq: torch.Tensor,
                     block_first: torch.Tensor, rows: int, group: int, segments: int, decode_only: bool,
                     key_tile: int | None, scale: float, alibi_slopes: torch.Tensor | None, window: int,
                     softcap: float, key_limits: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None, chunk: int = 0) -> torch.Tensor:
    from llmctl.kernels import attention

    layout = attention.StepLayout(query_start_loc, block_seq, block_first, rows, group, segments, decode_only,
                                  key_tile)
    options = attention.AttentionOptions(scale=scale, alibi_slopes=alibi_slopes, sliding_window=window or None,
                                         softcap=softcap or None, key_limits=key_limits, sinks=sinks,
                                         chunk=chunk or None)
    return attention.paged_attention(query, kv_cache, block_tables, seq_lens, layout, options)


def _paged_attention_fake(query: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(query)


define("rotary_store(Tensor query, Tensor key, Tensor value, Tensor cos, Tensor sin, Tensor(a!) kv_cache, "
       "Tensor slots) -> Tensor", _rotary_store, _rotary_store_fake)
define("paged_attention(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
       "Tensor query_start_loc, Tensor block_seq, Tensor block_first, int rows, int group, int segments, "
       "bool decode_only, int? key_tile, float scale, Tensor? alibi_slopes, int window, float softcap, "
       "Tensor? key_limits=None, Tensor? sinks=None, int chunk=0) -> Tensor",
       _paged_attention, _paged_attention_fake)


def rotary_store(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """q rotated (returned, contiguous); k rotated into its cache slots and v stored beside it."""
    return torch.ops.llmctl.rotary_store.default(query, key, value, cos, sin, kv_cache, slots)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    layout: StepLayout, options: AttentionOptions) -> torch.Tensor:
    """`kernels.attention.paged_attention` through the registered op (k_scale and v_scale stay 1)."""
    return torch.ops.llmctl.paged_attention.default(
        query, kv_cache, block_tables, seq_lens, layout.query_start_loc, layout.block_seq, layout.block_first,
        layout.rows, layout.group, layout.num_segments, layout.decode_only, layout.preferred_key_tile,
        options.scale, options.alibi_slopes, options.sliding_window or 0, options.softcap or 0.0, options.key_limits,
        options.sinks, options.chunk or 0)
