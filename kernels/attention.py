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

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmctl.kernels.fp8 import fp8_format
from llmctl.kernels.limits import MIN_KEY_TILE, SMALLEST_SHARED_MEMORY, attention_shared_bytes
from llmctl.kernels.transfer import to_device

# A program's rows: query tokens × the query heads of one KV head. 16 is the smallest tl.dot takes
# (every dot dimension: rows, head dim and key tile are all at least 16).
MIN_DOT = 16
DECODE_ROWS = 16
PREFILL_ROWS = 64
DECODE_KEY_TILE = 16  # keys per step of the walk; a tile may span pages (block size 8) or part of one
PREFILL_KEY_TILE = 64
SPLIT_BELOW_PROGRAMS = 256  # without the machine's SM count: decodes with fewer programs split ...
SEGMENTS = 2  # ... the context in this many: the split and the merge exercised at the interpreter's least cost
# A split decode aims at this many programs per SM: a program walks its keys one 16-key tile at a time, so the
# memory system streams only with many in flight (the H200 run, docs/kernels.md: 16 segments beat 1 even at 2,048
# programs over 32k contexts; 64-key segments lost at 1k).
PROGRAMS_PER_SM = 32
MIN_SEGMENT_KEYS = 256  # no segment shorter: its setup and its share of the merge would outweigh its keys
MAX_SEGMENTS = 128
SEGMENT_COUNTS = tuple(2 ** n for n in range(1, MAX_SEGMENTS.bit_length()))  # what choose_segments can return


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
    # [T] int32: the last key position each query sees (its own, but past it inside an image of Gemma 3's,
    # whose tokens attend to each other both ways); None: causal. Never decreases along a sequence's tokens.
    key_limits: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # [H] float32: a logit per head in the softmax's denominator (gpt-oss)
    chunk: int | None = None  # a query sees only keys of its own aligned chunk of this many positions (Llama 4)


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
        limits = query_pos if options.key_limits is None else options.key_limits[start:stop].to(query_pos)
        allowed = key_pos.view(1, -1) <= limits.view(-1, 1)
        if options.sliding_window:
            allowed &= key_pos.view(1, -1) > query_pos.view(-1, 1) - options.sliding_window
        if options.chunk:
            allowed &= key_pos.view(1, -1) >= (query_pos // options.chunk * options.chunk).view(-1, 1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if options.sinks is not None:  # one more logit per head, weighing no value
            sink = options.sinks.float().view(-1, 1, 1).expand(heads, stop - start, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
        else:
            probs = scores.softmax(dim=-1)
        out[start:stop] = torch.einsum("hqk,khd->qhd", probs, values)
    return out.to(query.dtype)


def query_blocks(query_start_loc: list[int], tokens_per_block: int) -> tuple[list[int], list[int]]:
    """Each program's sequence and first query token: a sequence's new tokens in blocks."""
    seqs, firsts = [], []
    for seq in range(len(query_start_loc) - 1):
        for first in range(query_start_loc[seq], query_start_loc[seq + 1], tokens_per_block):
            seqs.append(seq)
            firsts.append(first)
    return seqs, firsts


def choose_segments(decode_only: bool, num_seqs: int, kv_heads: int, sm_count: int = 0, context: int = 0) -> int:
    """Split the context when a decode step has too few programs to fill the GPU otherwise: as many segments
    as bring the (sequence × KV head) programs to PROGRAMS_PER_SM per SM, none shorter than MIN_SEGMENT_KEYS
    of `context` (the longest context the layout serves), the nearest power of two up to MAX_SEGMENTS —
    sized by SM count and context as FlashInfer's plan and FA3's heuristic are, for this kernel's programs. A
    captured decode graph is planned for the longest context it can meet, so the split is built in; a shorter
    context leaves segments empty, each costing one early exit.
    Without an SM count or a context (the interpreter) the split is the fixed SEGMENTS below
    SPLIT_BELOW_PROGRAMS programs."""
    programs = num_seqs * kv_heads
    if not decode_only or programs == 0:
        return 1
    if not sm_count or not context:
        return SEGMENTS if programs < SPLIT_BELOW_PROGRAMS else 1
    wanted = min(-(-sm_count * PROGRAMS_PER_SM // programs), -(-context // MIN_SEGMENT_KEYS), MAX_SEGMENTS)
    return 1 if wanted < 2 else 2 ** round(math.log2(wanted))


def sm_count(device: torch.device) -> int:
    """The GPU's streaming multiprocessors (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def padded_head_dim(dim: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(dim))


def key_tile(decode_only: bool, padded_dim: int, rows: int, element_bytes: int,
             preferred: int | None = None) -> int:
    """Keys per step of the walk (any size: each key finds its own page): the preferred tile, halved
    until the program's shared memory fits every GPU target (sm_89 has the least)."""
    tile = preferred or (DECODE_KEY_TILE if decode_only else PREFILL_KEY_TILE)
    while tile > MIN_KEY_TILE and attention_shared_bytes(padded_dim, rows, tile, element_bytes) > SMALLEST_SHARED_MEMORY:
        tile //= 2
    return tile


def kernel_constexprs(*, dim: int, block_size: int, group: int, rows: int, segments: int, decode_only: bool,
                      dtype: torch.dtype, kv_fp8: bool, window: bool, alibi: bool, softcap: bool,
                      preferred_key_tile: int | None = None, key_limits: bool = False, sinks: bool = False,
                      chunked: bool = False) -> dict:
    """The attention kernel's compile-time parameters: the launcher and the ahead-of-time compile check
    (`llmctl.kernels.compile_check`) both build them here, so the check covers what runs."""
    padded_dim = padded_head_dim(dim)
    element_bytes = torch.empty(0, dtype=dtype).element_size()
    tile = key_tile(decode_only, padded_dim, rows, element_bytes, preferred_key_tile)
    return dict(GROUP=group, HEAD_DIM=dim, PADDED_DIM=padded_dim, BLOCK_SIZE=block_size, ROWS=rows,
                PER_BLOCK=rows // group, KEY_TILE=tile, WINDOW=window, ALIBI=alibi,
                SOFTCAP=softcap, KEY_LIMITS=key_limits, SINKS=sinks, CHUNKED=chunked, SEGMENTS=segments, KV_FP8=kv_fp8, DOT_PRECISION=dot_precision(dtype))


def program_rows(group: int, decode_only: bool) -> int:
    return max(DECODE_ROWS if decode_only else PREFILL_ROWS, triton.next_power_of_2(group))


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
    decode_only: bool
    preferred_key_tile: int | None = None  # None: the engine's (benchmarks/kernels.py sweeps others)


def plan_step(query_start_loc: list[int], heads: int, kv_heads: int, device: torch.device,
              num_segments: int | None = None, preferred_key_tile: int | None = None,
              context: int = 0) -> StepLayout:
    """`context`: the longest sequence the layout serves (this step's, or a captured graph's longest)."""
    group = heads // kv_heads
    decode_only = all(b - a <= 1 for a, b in zip(query_start_loc, query_start_loc[1:]))
    rows = program_rows(group, decode_only)
    seqs, firsts = query_blocks(query_start_loc, rows // group)
    segments = num_segments or choose_segments(decode_only, len(query_start_loc) - 1, kv_heads, sm_count(device),
                                               context)
    return StepLayout(*(to_device(values, torch.int32, device) for values in (query_start_loc, seqs, firsts)),
                      rows, group, segments, decode_only, preferred_key_tile)


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
    constexprs = kernel_constexprs(
        dim=dim, block_size=block_size, group=layout.group, rows=layout.rows, segments=segments,
        decode_only=layout.decode_only, dtype=query.dtype, kv_fp8=fp8_format(kv_cache.dtype) is not None,
        window=bool(options.sliding_window), alibi=options.alibi_slopes is not None, softcap=bool(options.softcap),
        preferred_key_tile=layout.preferred_key_tile, key_limits=options.key_limits is not None,
        sinks=options.sinks is not None, chunked=bool(options.chunk))
    padded_dim = constexprs["PADDED_DIM"]
    if segments > 1:
        partial = torch.empty(tokens, heads, segments, padded_dim, dtype=torch.float32, device=query.device)
        maxes = torch.empty(tokens, heads, segments, dtype=torch.float32, device=query.device)
        sums = torch.empty_like(maxes)
        used = torch.empty(tokens, heads, dtype=torch.int32, device=query.device)
    else:
        partial = maxes = sums = used = out  # unused
    slopes = options.alibi_slopes if options.alibi_slopes is not None else out
    limits = options.key_limits if options.key_limits is not None else seq_lens  # unread without KEY_LIMITS
    sinks = options.sinks if options.sinks is not None else slopes  # unread without SINKS
    _attention_kernel[(programs, kv_heads, segments)](
        out, partial, maxes, sums, used, query, kv_cache, block_tables, seq_lens, layout.query_start_loc,
        layout.block_seq, layout.block_first, slopes, limits, sinks,
        options.scale, options.softcap or 0.0, options.k_scale, options.v_scale, options.sliding_window or 0,
        options.chunk or 0, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        **constexprs)
    if segments > 1:
        _merge_kernel[(tokens, heads)](
            out, partial, maxes, sums, used, sinks, out.stride(0), out.stride(1),
            HEAD_DIM=dim, PADDED_DIM=padded_dim, SEGMENTS=segments, SINKS=options.sinks is not None)
    return out


@triton.jit
def _attention_kernel(out_ptr, partial_ptr, max_ptr, sum_ptr, used_ptr, q_ptr, kv_ptr, tables_ptr, lens_ptr, starts_ptr,
              block_seq_ptr, block_first_ptr, slopes_ptr, limits_ptr, sinks_ptr,
              scale, softcap, k_scale, v_scale, window, chunk,
              stride_qt, stride_qh, stride_ot, stride_oh,
              stride_block, stride_slot, stride_kv, stride_head, stride_table,
              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PADDED_DIM: tl.constexpr,
              BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr, PER_BLOCK: tl.constexpr, KEY_TILE: tl.constexpr,
              WINDOW: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, SEGMENTS: tl.constexpr,
              KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, KEY_LIMITS: tl.constexpr, SINKS: tl.constexpr,
              CHUNKED: tl.constexpr):
    program, kv_head, segment = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = tl.load(block_seq_ptr + program)
    first = tl.load(block_first_ptr + program)
    seq_start = tl.load(starts_ptr + seq)
    seq_stop = tl.load(starts_ptr + seq + 1)
    seq_len = tl.load(lens_ptr + seq)

    # the keys any row of this block may see, in whole key tiles, then this segment's share of them; the
    # block's tokens are consecutive from `first` (always a real token), so its first and last positions are
    # scalars (no reductions: under Triton's interpreter each one costs milliseconds per program)
    last_key = seq_len - seq_stop + tl.minimum(first + PER_BLOCK, seq_stop) - 1
    if KEY_LIMITS:  # limits never decrease along the sequence: the block's last token sees furthest
        last_key = tl.load(limits_ptr + tl.minimum(first + PER_BLOCK, seq_stop) - 1)
    first_key = 0
    if WINDOW:
        first_key = tl.maximum(seq_len - seq_stop + first - window + 1, 0)
    if CHUNKED:  # the block's first token starts the earliest chunk any of its rows sees
        first_key = tl.maximum(first_key, (seq_len - seq_stop + first) // chunk * chunk)
    first_tile = first_key // KEY_TILE
    tiles = last_key // KEY_TILE + 1 - first_tile
    per_segment = (tiles + SEGMENTS - 1) // SEGMENTS
    tile_lo = first_tile + segment * per_segment
    tile_hi = tl.minimum(tile_lo + per_segment, first_tile + tiles)
    if SEGMENTS > 1:
        if tile_lo >= tile_hi:  # a segment past a short context writes nothing: segment 0 says how many hold keys
            return

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

    if ALIBI:
        slope = tl.load(slopes_ptr + head, mask=valid, other=0.0).to(tl.float32)
    if KEY_LIMITS:
        limit = tl.load(limits_ptr + token, mask=valid, other=0)
    best = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, PADDED_DIM], tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_table
    for tile in range(tile_lo, tile_hi):
        key_pos = tile * KEY_TILE + tl.arange(0, KEY_TILE)
        key_ok = key_pos < seq_len
        block = tl.load(table + key_pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)  # a tile spans pages
        at = (kv_ptr + block[:, None] * stride_block + (key_pos % BLOCK_SIZE)[:, None] * stride_slot
              + kv_head * stride_head + dims[None, :])
        load_ok = key_ok[:, None] & dim_ok[None, :]  # never read unused slots: they may hold NaN
        k = tl.load(at, mask=load_ok, other=0.0)
        v = tl.load(at + stride_kv, mask=load_ok, other=0.0)
        if KV_FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        score = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * scale
        if SOFTCAP:
            score = softcap * (2.0 * tl.sigmoid(2.0 * score / softcap) - 1.0)  # softcap · tanh(score / softcap)
        if ALIBI:  # relative to the query (≤ 0): softmax gives BLOOM's absolute form, without large float32 terms
            score += slope[:, None] * (key_pos[None, :] - position[:, None]).to(tl.float32)
        if KEY_LIMITS:
            allowed = valid[:, None] & key_ok[None, :] & (key_pos[None, :] <= limit[:, None])
        else:
            allowed = valid[:, None] & key_ok[None, :] & (key_pos[None, :] <= position[:, None])
        if WINDOW:
            allowed = allowed & (key_pos[None, :] > position[:, None] - window)
        if CHUNKED:
            allowed = allowed & (key_pos[None, :] >= position[:, None] // chunk * chunk)
        score = tl.where(allowed, score, float("-inf"))
        new_best = tl.maximum(best, tl.max(score, 1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # rows that saw nothing yet
        weights = tl.exp(score - shift[:, None])
        rescale = tl.exp(best - shift)
        total = total * rescale + tl.sum(weights, 1)
        acc = tl.dot(weights.to(v.dtype), v, acc * rescale[:, None], input_precision=DOT_PRECISION)
        best = new_best

    if SEGMENTS == 1:
        if SINKS:  # the head's sink logit joins the denominator (a split context adds it in the merge)
            sink = tl.load(sinks_ptr + head, mask=valid, other=0.0).to(tl.float32)
            top = tl.maximum(best, sink)
            acc = acc * tl.exp(best - top)[:, None]
            total = total * tl.exp(best - top) + tl.exp(sink - top)
        result = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + token[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=valid[:, None] & dim_ok[None, :])
    else:
        token_head = token.to(tl.int64) * (GROUP * tl.num_programs(1)) + head
        if segment == 0:
            tl.store(used_ptr + token_head, tl.zeros([ROWS], tl.int32) + (tiles + per_segment - 1) // per_segment,
                     mask=valid)
        at = token_head * SEGMENTS + segment
        tl.store(max_ptr + at, best, mask=valid)
        tl.store(sum_ptr + at, total, mask=valid)
        tl.store(partial_ptr + at[:, None] * PADDED_DIM + dims[None, :], acc, mask=valid[:, None])

@triton.jit
def _merge_kernel(out_ptr, partial_ptr, max_ptr, sum_ptr, used_ptr, sinks_ptr, stride_ot, stride_oh,
          HEAD_DIM: tl.constexpr, PADDED_DIM: tl.constexpr, SEGMENTS: tl.constexpr, SINKS: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    token_head = token.to(tl.int64) * tl.num_programs(1) + head
    base = token_head * SEGMENTS
    segment = tl.arange(0, SEGMENTS)
    used = segment < tl.load(used_ptr + token_head)  # the segments past the context wrote nothing
    maxes = tl.load(max_ptr + base + segment, mask=used, other=float("-inf"))
    best = tl.max(maxes, 0)
    if SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32)
        best = tl.maximum(best, sink)
    weight = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - best))  # segments that saw no key weigh nothing
    total = tl.sum(tl.load(sum_ptr + base + segment, mask=used, other=0.0) * weight, 0)
    if SINKS:
        total += tl.exp(sink - best)
    dims = tl.arange(0, PADDED_DIM)
    parts = tl.load(partial_ptr + (base + segment)[:, None] * PADDED_DIM + dims[None, :], mask=used[:, None],
                    other=0.0)
    result = tl.sum(parts * weight[:, None], 0) / total
    tl.store(out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + dims,
             result.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)
