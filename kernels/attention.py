"""Paged attention: one launch for a step that mixes prefill chunks and decodes.

Queries are flat, [T, H, D]: the new tokens of every sequence, one after another
(`query_start_loc` says where each sequence starts). Keys and values come from the
engine's paged cache, [num_blocks, block_size, 2, KV heads, D], through each sequence's
block table; the step's new K/V are already stored there (`kernels.kv_store`).

One program takes a block of query tokens of one sequence and *all* the query heads that
share one KV head (rows = tokens × heads of the group), so every K/V tile is loaded once
per KV head (GQA/MQA). It walks the sequence's pages with an online softmax (causal, with
optional ALiBi, sliding window and logit soft-cap). For decodes over long contexts with
few sequences the context is split into segments run by separate programs, and a second
kernel merges them by log-sum-exp (flash-decoding).

`paged_attention_reference` is the same computation in plain torch, the reference the
kernel is tested against. On a CPU the kernels run only under the Triton interpreter
(TRITON_INTERPRET=1 set before triton is first imported).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmctl.kernels.transfer import to_device

# A program's rows: query tokens × the query heads of one KV head. 16 is the smallest tl.dot takes.
DECODE_ROWS = 16
PREFILL_ROWS = 64
LONG_CONTEXT = 1024  # decode contexts from here on are split along the context when sequences are few
SEGMENTS = 16


def dot_precision(dtype: torch.dtype) -> str:
    """float32 operands multiply in full precision: tl.dot's default on GPUs is TF32 (10 mantissa bits)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class AttentionOptions:
    scale: float
    alibi_slopes: torch.Tensor | None = None  # [H] float32: score += slope · key position (BLOOM's form)
    sliding_window: int | None = None  # a query sees keys less than this many positions back
    softcap: float | None = None  # score = softcap · tanh(score / softcap)
    k_scale: float = 1.0  # fp8 caches: stored value × scale is the real one
    v_scale: float = 1.0


def paged_attention_reference(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                              seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                              options: AttentionOptions) -> torch.Tensor:
    """The kernel's definition, one sequence at a time in float32 (slow and obvious)."""
    tokens, heads, dim = query.shape
    block_size, kv_heads = kv_cache.shape[1], kv_cache.shape[3]
    out = torch.zeros(tokens, heads, dim, dtype=torch.float32, device=query.device)
    for seq in range(seq_lens.shape[0]):
        start, stop, length = int(query_start_loc[seq]), int(query_start_loc[seq + 1]), int(seq_lens[seq])
        if stop == start:
            continue
        blocks = block_tables[seq, : -(-length // block_size)].long()
        pages = kv_cache[blocks].float().flatten(0, 1)[:length]  # [L, 2, KVH, D]
        keys = pages[:, 0].repeat_interleave(heads // kv_heads, dim=1) * options.k_scale  # [L, H, D]
        values = pages[:, 1].repeat_interleave(heads // kv_heads, dim=1) * options.v_scale
        q = query[start:stop].float()
        scores = torch.einsum("qhd,khd->hqk", q, keys) * options.scale
        if options.softcap:
            scores = options.softcap * torch.tanh(scores / options.softcap)
        key_pos = torch.arange(length, device=query.device)
        query_pos = torch.arange(length - (stop - start), length, device=query.device)
        if options.alibi_slopes is not None:
            scores = scores + options.alibi_slopes.float().view(-1, 1, 1) * key_pos.view(1, 1, -1)
        allowed = key_pos.view(1, -1) <= query_pos.view(-1, 1)
        if options.sliding_window:
            allowed &= key_pos.view(1, -1) > query_pos.view(-1, 1) - options.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[start:stop] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
    return out.to(query.dtype)


def query_blocks(query_start_loc: list[int], tokens_per_block: int) -> tuple[list[int], list[int]]:
    """Each program's sequence and first query token: a sequence's new tokens in blocks."""
    seqs, firsts = [], []
    for seq in range(len(query_start_loc) - 1):
        for first in range(query_start_loc[seq], query_start_loc[seq + 1], tokens_per_block):
            seqs.append(seq)
            firsts.append(first)
    return seqs, firsts


def choose_segments(decode_only: bool, seq_lens: list[int], kv_heads: int) -> int:
    """Split the context only where it pays: decodes only, long contexts, too few programs otherwise."""
    if decode_only and seq_lens and max(seq_lens) >= LONG_CONTEXT and len(seq_lens) * kv_heads < 256:
        return SEGMENTS
    return 1


@dataclass(frozen=True)
class StepLayout:
    """How a step's queries map onto programs: planned once per step, shared by every layer.
    Only device tensors and integers, so a launch from it can be captured in a CUDA graph."""

    query_start_loc: torch.Tensor  # [B + 1] int32
    block_seq: torch.Tensor  # [programs] int32: the sequence of each program
    block_first: torch.Tensor  # [programs] int32: its first query token
    rows: int  # query tokens × the query heads of one KV head, per program
    group: int  # query heads per KV head
    num_segments: int


def plan_step(query_start_loc: list[int], seq_lens: list[int], heads: int, kv_heads: int, device: torch.device,
              num_segments: int | None = None) -> StepLayout:
    group = heads // kv_heads
    decode_only = all(b - a <= 1 for a, b in zip(query_start_loc, query_start_loc[1:]))
    rows = max(DECODE_ROWS if decode_only else PREFILL_ROWS, triton.next_power_of_2(group))
    seqs, firsts = query_blocks(query_start_loc, rows // group)
    segments = num_segments or choose_segments(decode_only, seq_lens, kv_heads)
    return StepLayout(*(to_device(values, torch.int32, device) for values in (query_start_loc, seqs, firsts)),
                      rows, group, segments)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    layout: StepLayout, options: AttentionOptions, out: torch.Tensor | None = None) -> torch.Tensor:
    """query [T, H, D]; kv_cache [blocks, block_size, 2, KVH, D]; block_tables [B, n] int32;
    seq_lens [B] int32 (tokens in the cache, this step's included)."""
    tokens, heads, dim = query.shape
    block_size, kv_heads = kv_cache.shape[1], kv_cache.shape[3]
    out = torch.empty_like(query) if out is None else out
    programs, segments = layout.block_seq.shape[0], layout.num_segments
    if programs == 0:
        return out
    padded_dim = triton.next_power_of_2(dim)
    if segments > 1:
        partial = torch.empty(tokens, heads, segments, padded_dim, dtype=torch.float32, device=query.device)
        maxes = torch.empty(tokens, heads, segments, dtype=torch.float32, device=query.device)
        sums = torch.empty_like(maxes)
    else:
        partial = maxes = sums = out  # unused
    slopes = options.alibi_slopes if options.alibi_slopes is not None else out
    _attention_kernel[(programs, kv_heads, segments)](
        out, partial, maxes, sums, query, kv_cache, block_tables, seq_lens, layout.query_start_loc,
        layout.block_seq, layout.block_first, slopes,
        options.scale, options.softcap or 0.0, options.k_scale, options.v_scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        GROUP=layout.group, HEAD_DIM=dim, PADDED_DIM=padded_dim, BLOCK_SIZE=block_size, ROWS=layout.rows,
        PER_BLOCK=layout.rows // layout.group, WINDOW=options.sliding_window or 0,
        ALIBI=options.alibi_slopes is not None, SOFTCAP=bool(options.softcap), SEGMENTS=segments,
        KV_FP8=kv_cache.dtype == torch.float8_e4m3fn, DOT_PRECISION=dot_precision(query.dtype),
    )
    if segments > 1:
        _merge_kernel[(tokens, heads)](
            out, partial, maxes, sums, out.stride(0), out.stride(1),
            HEAD_DIM=dim, PADDED_DIM=padded_dim, SEGMENTS=segments)
    return out


@triton.jit
def _attention_kernel(out_ptr, partial_ptr, max_ptr, sum_ptr, q_ptr, kv_ptr, tables_ptr, lens_ptr, starts_ptr,
              block_seq_ptr, block_first_ptr, slopes_ptr,
              scale, softcap, k_scale, v_scale,
              stride_qt, stride_qh, stride_ot, stride_oh,
              stride_block, stride_slot, stride_kv, stride_head, stride_table,
              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PADDED_DIM: tl.constexpr,
              BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr, PER_BLOCK: tl.constexpr,
              WINDOW: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, SEGMENTS: tl.constexpr,
              KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    program, kv_head, segment = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = tl.load(block_seq_ptr + program)
    first = tl.load(block_first_ptr + program)
    seq_start = tl.load(starts_ptr + seq)
    seq_stop = tl.load(starts_ptr + seq + 1)
    seq_len = tl.load(lens_ptr + seq)
    row = tl.arange(0, ROWS)
    token = first + row // GROUP
    head = kv_head * GROUP + row % GROUP
    valid = (row // GROUP < PER_BLOCK) & (token < seq_stop)
    position = seq_len - (seq_stop - seq_start) + (token - seq_start)  # of each query in the sequence
    dims = tl.arange(0, PADDED_DIM)
    dim_ok = dims < HEAD_DIM
    # operands stay in the model's dtype (bf16 on GPUs: tensor cores), products accumulate in float32
    q = tl.load(q_ptr + token[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=valid[:, None] & dim_ok[None, :], other=0.0)

    # the keys any row of this block may see, in whole pages, then this segment's share of them
    last_key = tl.max(tl.where(valid, position, 0), 0)
    first_key = 0
    if WINDOW > 0:
        first_key = tl.maximum(tl.min(tl.where(valid, position, last_key), 0) - WINDOW + 1, 0)
    first_page = first_key // BLOCK_SIZE
    pages = last_key // BLOCK_SIZE + 1 - first_page
    per_segment = tl.cdiv(pages, SEGMENTS)
    page_lo = first_page + segment * per_segment
    page_hi = tl.minimum(page_lo + per_segment, first_page + pages)

    if ALIBI:
        slope = tl.load(slopes_ptr + head, mask=valid, other=0.0).to(tl.float32)
    best = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, PADDED_DIM], tl.float32)
    slot = tl.arange(0, BLOCK_SIZE)
    for page in range(page_lo, page_hi):
        block = tl.load(tables_ptr + seq.to(tl.int64) * stride_table + page).to(tl.int64)
        key_pos = page * BLOCK_SIZE + slot
        key_ok = key_pos < seq_len
        at = kv_ptr + block * stride_block + slot[:, None] * stride_slot + kv_head * stride_head + dims[None, :]
        load_ok = key_ok[:, None] & dim_ok[None, :]  # never read unused slots: they may hold NaN
        k = tl.load(at, mask=load_ok, other=0.0)
        v = tl.load(at + stride_kv, mask=load_ok, other=0.0)
        if KV_FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        score = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * scale
        if SOFTCAP:
            score = softcap * (2.0 * tl.sigmoid(2.0 * score / softcap) - 1.0)  # softcap · tanh(score / softcap)
        if ALIBI:
            score += slope[:, None] * key_pos[None, :].to(tl.float32)
        allowed = valid[:, None] & key_ok[None, :] & (key_pos[None, :] <= position[:, None])
        if WINDOW > 0:
            allowed = allowed & (key_pos[None, :] > position[:, None] - WINDOW)
        score = tl.where(allowed, score, float("-inf"))
        new_best = tl.maximum(best, tl.max(score, 1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # rows that saw nothing yet
        weights = tl.exp(score - shift[:, None])
        rescale = tl.exp(best - shift)
        total = total * rescale + tl.sum(weights, 1)
        acc = tl.dot(weights.to(v.dtype), v, acc * rescale[:, None], input_precision=DOT_PRECISION)
        best = new_best

    if SEGMENTS == 1:
        result = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + token[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=valid[:, None] & dim_ok[None, :])
    else:
        at = (token.to(tl.int64) * (GROUP * tl.num_programs(1)) + head) * SEGMENTS + segment
        tl.store(max_ptr + at, best, mask=valid)
        tl.store(sum_ptr + at, total, mask=valid)
        tl.store(partial_ptr + at[:, None] * PADDED_DIM + dims[None, :], acc, mask=valid[:, None])

@triton.jit
def _merge_kernel(out_ptr, partial_ptr, max_ptr, sum_ptr, stride_ot, stride_oh,
          HEAD_DIM: tl.constexpr, PADDED_DIM: tl.constexpr, SEGMENTS: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    base = (token.to(tl.int64) * tl.num_programs(1) + head) * SEGMENTS
    segment = tl.arange(0, SEGMENTS)
    maxes = tl.load(max_ptr + base + segment)
    best = tl.max(maxes, 0)
    weight = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - best))  # empty segments weigh nothing
    total = tl.sum(tl.load(sum_ptr + base + segment) * weight, 0)
    dims = tl.arange(0, PADDED_DIM)
    parts = tl.load(partial_ptr + (base + segment)[:, None] * PADDED_DIM + dims[None, :])
    result = tl.sum(parts * weight[:, None], 0) / total
    tl.store(out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + dims,
             result.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)
