"""W4A16 GEMV for one-row decode steps: activations times GPTQ or AWQ packed 4-bit weights (and GPTQ's
8-bit), on the CUDA cores instead of `tl.dot`, which needs 16-row tiles (15 of them padding here).

Each program takes one activation row, BLOCK_N columns and a 1/SPLIT share of K (split programs add
into a float32 output, or with `split_sum="last"` the last of them adds their partials). Each K tile
lies in one quantization group, so the group's scale and zero point apply once per column and tile,
not per weight:

    Σ_k x_k · s · (q_k − z) = s · (Σ_k x_k q_k − z · Σ_k x_k)      (GPTQ)

Measured on an H200 (benchmarks/w4a16_gemv.py, docs/kernels.md): 1.1–1.3× the tensor-core kernel at
one row, and slower than it from two rows on, so `GEMV_MAX_ROWS` is 1. It is not bound by arithmetic
(unpacking without integer conversions changed nothing) but by how few loads each program has in
flight; the ≥ 2.5× over bf16 that a memory-bound 4-bit GEMV allows is not reached. `num_stages` > 1
pipelines the K loop (Triton's `tl.range`: the packed words of the next tiles are copied into shared
memory asynchronously, `cp.async`, while this one is summed): compiled and checked here, not yet timed on
a GPU, so the engine keeps 1 and atomic split sums (`benchmarks/w4a16_gemv.py` sweeps both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

GEMV_MAX_ROWS = 1  # more rows: the tensor-core kernel (llmctl.kernels.w4a16) was faster at 2, 4 and 8 rows
PROGRAMS_PER_SM = 4  # split K until about this many programs per multiprocessor


@dataclass(frozen=True)
class GemvTiles:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 1  # K tiles in flight per program (1: the loads of a tile, then its sums)
    # how split programs combine: "atomic" adds into a zeroed float32 output, then a cast (two more
    # kernels); "last" stores partial sums and the last program of a tile adds them in split order and
    # writes the output (one kernel, the same bits every run; not yet timed on a GPU)
    split_sum: str = "atomic"


def gemv_applies(rows: int, group_size: int, act_order: bool) -> bool:
    """One-row steps whose K tiles each lie in one quantization group (not act-order)."""
    return rows <= GEMV_MAX_ROWS and not act_order and group_size % 32 == 0


def choose_gemv_tiles(rows: int, inner: int, cols: int, group_size: int, awq: bool,
                      multiprocessors: int) -> GemvTiles:
    """Tiles from the shapes alone (a CUDA graph captures the choice). On an H200 at Llama-3-8B's MLP
    shapes: 128-deep K tiles; GPTQ 128 columns wide, AWQ 256 (32 packed words a row); K split until the
    grid has about PROGRAMS_PER_SM programs per multiprocessor, at most 16 ways."""
    block_n = 256 if awq else 128
    block_k = next(k for k in (128, 64, 32) if group_size % k == 0 and k <= max(inner, 32))
    programs = rows * triton.cdiv(cols, block_n)
    k_tiles = triton.cdiv(inner, block_k)
    split = 1
    while programs * split < PROGRAMS_PER_SM * multiprocessors and split * 2 <= min(k_tiles, 16):
        split *= 2
    return GemvTiles(block_n, block_k, split)


def gemv_constexprs(tiles: GemvTiles, method: str, group_size: int, bits: int = 4) -> dict:
    """The kernels' compile-time parameters (shared with `llmctl.kernels.compile_check`)."""
    split = tiles.split_k > 1
    return dict(BITS=bits, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_SIZE=group_size,
                SPLIT=split, STAGES=tiles.num_stages,
                LAST_SUMS=tiles.split_k if split and tiles.split_sum == "last" else 0)


def multiprocessor_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: no parallelism to fill
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


_SM_COUNTS: dict[int, int] = {}


def _multiprocessors(index: int) -> int:
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


def w4a16_gemv(x: torch.Tensor, method: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int, bits: int = 4, tiles: GemvTiles | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype, one program row per activation row; groups in order (no g_idx)."""
    rows, inner = x.shape
    cols = scales.shape[1]
    tiles = tiles or choose_gemv_tiles(rows, inner, cols, group_size, method == "awq",
                                       multiprocessor_count(x.device))
    constexprs = gemv_constexprs(tiles, method, group_size, bits)
    atomic = constexprs["SPLIT"] and not constexprs["LAST_SUMS"]
    out = torch.zeros(rows, cols, dtype=torch.float32, device=x.device) if atomic else \
        torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(inner, tiles.block_k), tiles.split_k) * tiles.block_k
    grid = (rows, triton.cdiv(cols, tiles.block_n), tiles.split_k)
    partials, counts = split_workspace(x.device, tiles.split_k, rows, cols, grid[1]) if constexprs["LAST_SUMS"] \
        else (out, out)  # unused
    kernel, width = (_gemv_awq_kernel, cols // 8) if method == "awq" else (_gemv_gptq_kernel, cols)
    kernel[grid](x, qweight, qzeros, scales, out, partials, counts, width, inner, k_per_split,
                 x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
                 num_warps=tiles.num_warps, **constexprs)
    return out.to(x.dtype) if atomic else out


_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_workspace(device: torch.device, splits: int, rows: int, cols: int,
                    col_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial sums [splits, rows, cols] and per-tile finish counts (zero, and left at zero by the kernel),
    made once per shape and stream — as vLLM's Marlin keeps its workspace — so a captured graph reuses them
    and calls on one stream, which run in turn, share them."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, splits, rows, cols, col_tiles)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = (torch.empty(splits, rows, cols, dtype=torch.float32, device=device),
                            torch.zeros(rows * col_tiles, dtype=torch.int32, device=device))
    return _WORKSPACES[key]


@triton.jit
def _gemv_gptq_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr, N, K,
                      K_PER_SPLIT,
                      stride_x, stride_qweight, stride_qzeros, stride_scales, stride_out,
                      BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
                      SPLIT: tl.constexpr, STAGES: tl.constexpr, LAST_SUMS: tl.constexpr):
    """GPTQ [K/w, N], w = 32 / BITS input rows per word: a tile is [BLOCK_K / w words, w, BLOCK_N columns]."""
    row, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    WORDS: tl.constexpr = BLOCK_K // PER_WORD
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    words, nibble = tl.arange(0, WORDS), tl.arange(0, PER_WORD)
    zero_shift = (cols % PER_WORD) * BITS
    acc = tl.zeros([WORDS, BLOCK_N], dtype=tl.float32)  # summed over the words once, at the end
    k_lo = pid_k * K_PER_SPLIT
    for start in tl.range(k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), BLOCK_K, num_stages=STAGES):
        inner = start + words[:, None] * PER_WORD + nibble[None, :]  # [WORDS, PER_WORD]
        x = tl.load(x_ptr + row * stride_x + inner, mask=inner < K, other=0.0).to(tl.float32)
        packs = start // PER_WORD + words
        packed = tl.load(qweight_ptr + packs[:, None].to(tl.int64) * stride_qweight + cols[None, :],
                         mask=(packs < tl.cdiv(K, PER_WORD))[:, None] & col_ok[None, :], other=0)
        q = ((packed[:, None, :] >> (nibble * BITS)[None, :, None]) & MASK).to(tl.float32)
        dot = tl.sum(q * x[:, :, None], axis=1)  # [WORDS, BLOCK_N]
        group = start // GROUP_SIZE
        zero = (tl.load(qzeros_ptr + group * stride_qzeros + cols // PER_WORD, mask=col_ok, other=0)
                >> zero_shift) & MASK
        scale = tl.load(scales_ptr + group * stride_scales + cols, mask=col_ok, other=0.0).to(tl.float32)
        x_sum = tl.sum(x, axis=1)  # [WORDS]
        acc += scale[None, :] * (dot - (zero + 1).to(tl.float32)[None, :] * x_sum[:, None])  # GPTQ v1: zero − 1
    if LAST_SUMS:
        _sum_splits(out_ptr + row * stride_out, partial_ptr, count_ptr, tl.sum(acc, axis=0), cols, col_ok, N,
                    LAST_SUMS)
    else:
        _write(out_ptr + row * stride_out + cols, tl.sum(acc, axis=0), col_ok, SPLIT)


@triton.jit
def _shifted_values(words, SHIFT: tl.constexpr, MASK: tl.constexpr):
    """The 4-bit fields at bit SHIFT (< 16) of each word, times 2^SHIFT, plus 2^23, as float32: OR-ing a value
    under 2^23 into the mantissa of 2^23 makes that float exactly, without an integer conversion; taking
    the zero point's float off leaves (q − z) · 2^SHIFT, also exactly."""
    return ((words & (MASK << SHIFT)) | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_awq_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr, N_WORDS, K,
                     K_PER_SPLIT,
                     stride_x, stride_qweight, stride_qzeros, stride_scales, stride_out,
                     BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr,
                     SPLIT: tl.constexpr, STAGES: tl.constexpr, LAST_SUMS: tl.constexpr):
    """AWQ [K, N/8]: word p of a row holds columns 8p..8p+7, column 8p + j at nibble j // 2 + 4 · (j % 2)
    (even j in the low 16 bits). A tile is [BLOCK_K rows, BLOCK_N / 8 words], taken one column phase j at
    a time; the columns stay in a [words, 8] shape throughout. N_WORDS is N / 8 (AWQ packs whole words), so
    the launcher's JIT knows when it is a multiple of 16 and loads the words 16 bytes at a time."""
    row, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    BLOCK_M: tl.constexpr = 1  # one row per program, kept as a dimension (as measured: docs/kernels.md)
    WORDS: tl.constexpr = BLOCK_N // 8
    rows = row + tl.arange(0, BLOCK_M)
    packs = pid_n * WORDS + tl.arange(0, WORDS)
    phase = tl.arange(0, 8)
    cols = packs[:, None] * 8 + phase[None, :]  # [WORDS, 8]
    row_ok, pack_ok = rows == row, packs < N_WORDS
    col_ok = pack_ok[:, None] & (phase < 8)[None, :]  # a whole word's columns, in the [words, 8] shape
    acc = tl.zeros([BLOCK_M, WORDS, 8], dtype=tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    for start in tl.range(k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), BLOCK_K, num_stages=STAGES):
        inner = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + inner[None, :], mask=row_ok[:, None] & (inner < K)[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K]
        packed = tl.load(qweight_ptr + inner[:, None].to(tl.int64) * stride_qweight + packs[None, :],
                         mask=(inner < K)[:, None] & pack_ok[None, :], other=0)
        group = start // GROUP_SIZE
        zero_pack = tl.load(qzeros_ptr + group * stride_qzeros + packs, mask=pack_ok, other=0)
        scale = tl.load(scales_ptr + group * stride_scales + cols, mask=col_ok, other=0.0).to(tl.float32)
        tile = tl.zeros([BLOCK_M, WORDS, 8], dtype=tl.float32)
        for j in tl.static_range(8):
            shift = 4 * (j // 2)  # a constexpr: j is unrolled
            if j % 2 == 0:
                half, zero_half = packed, zero_pack
            else:
                half, zero_half = packed >> 16, zero_pack >> 16
            weight = _shifted_values(half, shift, 0xF) - _shifted_values(zero_half, shift, 0xF)[None, :]  # (q − z)·2^S
            dot = tl.sum(weight[None, :, :] * x[:, :, None], axis=1) * (1.0 / (1 << shift))  # [BLOCK_M, WORDS]
            tile += tl.where(phase[None, None, :] == j, dot[:, :, None], 0.0)
        acc += scale[None, :, :] * tile
    ok = row_ok[:, None, None] & col_ok[None, :, :]
    if LAST_SUMS:  # BLOCK_M is 1: this program's row
        _sum_splits(out_ptr + row * stride_out, partial_ptr, count_ptr, acc, cols[None, :, :], ok, N_WORDS * 8,
                    LAST_SUMS)
    else:
        _write(out_ptr + rows[:, None, None] * stride_out + cols[None, :, :], acc, ok, SPLIT)


@triton.jit
def _sum_splits(out_row_ptr, partial_ptr, count_ptr, value, cols, ok, N, SPLITS: tl.constexpr):
    """Store this split's partial sums; the split program that finishes its tile last adds all of them in
    split order (the same sum whichever finishes last) and writes the output row in its dtype."""
    row, tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.num_programs(0)
    tl.store(partial_ptr + (split * rows + row).to(tl.int64) * N + cols, value, mask=ok)
    tl.debug_barrier()  # every thread's partials are written before one thread counts them done
    count = count_ptr + row * tl.num_programs(1) + tile
    if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        total = tl.zeros_like(value)
        for other in tl.static_range(SPLITS):  # from L2 (.cg): other multiprocessors wrote them
            total += tl.load(partial_ptr + (other * rows + row).to(tl.int64) * N + cols, mask=ok, other=0.0,
                             cache_modifier=".cg")
        tl.store(out_row_ptr + cols, total.to(out_row_ptr.dtype.element_ty), mask=ok)
        tl.atomic_xchg(count, 0)  # zero again for the next call


@triton.jit
def _write(at, value, ok, SPLIT: tl.constexpr):
    if SPLIT:
        tl.atomic_add(at, value, mask=ok)
    else:
        tl.store(at, value.to(at.dtype.element_ty), mask=ok)
