"""W4A16 GEMM: activations in 16/32-bit floats times GPTQ or AWQ packed 4-bit weights (and GPTQ's
8-bit weights, W8A16, through the same kernel).

The packed weights are read as stored (`llmctl.checkpoint.quant_formats` documents both layouts) and
dequantized inside the K loop, one [BLOCK_K, BLOCK_N] tile at a time, so the full-precision
weight never exists in memory; products accumulate in float32.

- GPTQ v1: qweight [K/8, N] packs 8 input rows per int32 (4 at 8 bits); qzeros [groups, N/8] holds
  zero − 1; g_idx [K] gives each input row's group (act-order checkpoints permute it).
- AWQ GEMM: qweight [K, N/8] packs 8 output columns per int32 in the nibble order
  0, 2, 4, 6, 1, 3, 5, 7; qzeros [groups, N/8] the same way; group = row // group_size.

Each packed word is loaded once and unpacked into its 8 values in registers. Decodes of up to
`GEMV_MAX_ROWS` rows run the GEMV in `llmctl.kernels.w4a16_gemv` instead; other small steps split K
across programs; above `DEQUANTIZE_ABOVE_ROWS` rows (prefill) the weight is dequantized
once into a scratch tensor and multiplied by cuBLAS, as vLLM does for AWQ.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from llmctl.kernels.attention import dot_precision
from llmctl.kernels.w4a16_gemv import gemv_applies, w4a16_gemv

# More rows than this: dequantize once, then one dense GEMM. On an H100 at 4096 -> 14336 the fused kernel
# took 229 µs for 256 rows, where dequantizing took ~100 µs and cuBLAS 66 µs (scripts/gpu-check.sh).
DEQUANTIZE_ABOVE_ROWS = 128
DECODE_SPLIT_K = 8  # K split across this many programs at <= 64 rows (H100: 1.2-2.4x over splitting in two)


def w4a16_reference(x: torch.Tensor, method: str, qweight: torch.Tensor, qzeros: torch.Tensor,
                    scales: torch.Tensor, g_idx: torch.Tensor | None, group_size: int, bits: int = 4) -> torch.Tensor:
    """x [M, K] @ the dequantized weight, through the same unpacking code that writes the formats."""
    from llmctl.checkpoint.quant_formats import awq_unpack, unpack_cols, unpack_rows

    if method == "gptq":
        q = unpack_rows(qweight.cpu(), bits)  # [K, N]
        zeros = unpack_cols(qzeros.cpu(), bits) + 1  # [groups, N]
    else:
        q, zeros = awq_unpack(qweight.cpu()), awq_unpack(qzeros.cpu())
    groups = g_idx.long().cpu() if g_idx is not None else torch.arange(q.shape[0]) // group_size
    weight = (q - zeros[groups]).float() * scales.float().cpu()[groups]  # [K, N]
    return (x.float() @ weight.to(x.device)).to(x.dtype)


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    block_k: int
    split_k: int  # programs along K, summed with atomic adds into a float32 output
    uniform_groups: bool  # every K tile lies in one quantization group: scales/zeros load once per tile
    num_warps: int = 4


def choose_tiles(rows: int, inner: int, group_size: int, act_order: bool, awq: bool,
                 element_bytes: int = 2) -> Tiles:
    """Measured on an H100 (benchmarks/w4a16_tiles.py, 4096 -> 14336 at 1 and 16 rows): 128-deep K tiles,
    AWQ 128 columns wide (16 packed words a row; 64 columns re-reads each row's words twice as often and
    ran 2.4x slower), GPTQ 64, and decodes split K eight ways. float32 activations take K tiles of at most
    64 (128 needs more shared memory than sm_89 has)."""
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    block_n = 128 if awq else 64
    widest = 128 if element_bytes <= 2 else 64
    block_k = next((k for k in (128, 64, 32) if k <= widest and not act_order and group_size % k == 0
                    and k <= max(inner, 32)), 32)
    uniform = not act_order and group_size % block_k == 0
    split = max(1, min(triton.cdiv(inner, block_k) // 2, DECODE_SPLIT_K)) if rows <= 64 else 1
    return Tiles(block_m, block_n, block_k, split, uniform)


def w4a16_constexprs(tiles: Tiles, method: str, group_size: int, dtype: torch.dtype, bits: int = 4) -> dict:
    """The GEMM kernel's compile-time parameters (shared with `llmctl.kernels.compile_check`)."""
    return dict(AWQ=method == "awq", BITS=bits, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                GROUP_SIZE=group_size if tiles.uniform_groups else 1, UNIFORM_GROUPS=tiles.uniform_groups,
                SPLIT=tiles.split_k > 1, DOT_PRECISION=dot_precision(dtype))


def dequantize_constexprs(tiles: Tiles, method: str, group_size: int, bits: int = 4) -> dict:
    return dict(AWQ=method == "awq", BITS=bits, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                GROUP_SIZE=group_size if tiles.uniform_groups else 1, UNIFORM_GROUPS=tiles.uniform_groups)


def w4a16_matmul(x: torch.Tensor, method: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 g_idx: torch.Tensor | None, group_size: int, split_k: int | None = None, bits: int = 4,
                 tiles: Tiles | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; `bits` 4 (GPTQ, AWQ) or 8 (GPTQ). Decode-sized steps go to the GEMV
    (llmctl.kernels.w4a16_gemv) unless `split_k` or `tiles` ask for this kernel's tiles (tests,
    benchmarks/w4a16_tiles.py)."""
    if bits not in (4, 8) or (bits == 8 and method != "gptq"):
        raise ValueError(f"the W4A16 kernel takes 4-bit GPTQ/AWQ and 8-bit GPTQ weights, not {bits}-bit {method}")
    rows, inner = x.shape
    if split_k is None and tiles is None and gemv_applies(rows, group_size, g_idx is not None):
        return w4a16_gemv(x, method, qweight, qzeros, scales, group_size, bits)
    cols = scales.shape[1]
    tiles = tiles or choose_tiles(rows, inner, group_size, g_idx is not None, method == "awq", x.element_size())
    if split_k is not None:
        tiles = replace(tiles, split_k=split_k)
    if g_idx is None and not tiles.uniform_groups:
        g_idx = _contiguous_groups(inner, group_size, x.device)
    if rows > DEQUANTIZE_ABOVE_ROWS:
        return x @ w4a16_dequantize(method, qweight, qzeros, scales, g_idx, group_size, inner, x.dtype, tiles, bits)
    split = tiles.split_k > 1
    out = torch.zeros(rows, cols, dtype=torch.float32, device=x.device) if split else \
        torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(inner, tiles.block_k), tiles.split_k) * tiles.block_k
    grid = (triton.cdiv(rows, tiles.block_m), triton.cdiv(cols, tiles.block_n), tiles.split_k)
    _w4a16_kernel[grid](
        x, qweight, qzeros, scales, g_idx if g_idx is not None else qzeros, out, rows, cols, qweight.shape[1], inner,
        k_per_split,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        num_warps=tiles.num_warps, **w4a16_constexprs(tiles, method, group_size, x.dtype, bits))
    return out.to(x.dtype) if split else out


_GROUPS: dict[tuple, torch.Tensor] = {}


def _contiguous_groups(inner: int, group_size: int, device: torch.device) -> torch.Tensor:
    """Each input row's group when tiles cross groups; made once per shape, not per forward."""
    key = (inner, group_size, str(device))
    if key not in _GROUPS:
        _GROUPS[key] = torch.arange(inner, device=device, dtype=torch.int32) // group_size
    return _GROUPS[key]


def w4a16_dequantize(method: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                     g_idx: torch.Tensor | None, group_size: int, inner: int, dtype: torch.dtype,
                     tiles: Tiles, bits: int = 4) -> torch.Tensor:
    """The [K, N] weight in `dtype`, each packed word read once (prefill: then one cuBLAS GEMM)."""
    cols = scales.shape[1]
    weight = torch.empty(inner, cols, dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(inner, tiles.block_k), triton.cdiv(cols, tiles.block_n))
    _dequantize_kernel[grid](
        qweight, qzeros, scales, g_idx if g_idx is not None else qzeros, weight, cols, qweight.shape[1], inner,
        qweight.stride(0), qzeros.stride(0), scales.stride(0), weight.stride(0),
        **dequantize_constexprs(tiles, method, group_size, bits))
    return weight


@triton.jit
def _weight_tile(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, start, pid_n, N, PACKED_COLS, K,
                 stride_qweight, stride_qzeros, stride_scales,
                 AWQ: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_SIZE: tl.constexpr, UNIFORM_GROUPS: tl.constexpr):
    """Rows [start, start + BLOCK_K) × this program's BLOCK_N columns of the weight, in float32. PACKED_COLS
    is qweight's width (AWQ: N / 8 words), passed as such so the launcher's JIT knows when it is a
    multiple of 16 and AWQ's words load 16 bytes at a time (a bound of cdiv(N, 8) hides that)."""
    inner = start + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner_ok, col_ok = inner < K, cols < N
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    nibble = tl.arange(0, PER_WORD)
    if AWQ:  # 4-bit only  # [K, N/8]: word p of a row holds columns 8p..8p+7, column 8p + j at nibble j // 2 + 4 · (j % 2)
        packs = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        packed = tl.load(qweight_ptr + inner[:, None].to(tl.int64) * stride_qweight + packs[None, :],
                         mask=inner_ok[:, None] & (packs < PACKED_COLS)[None, :], other=0)
        shift = (nibble // 2 + 4 * (nibble % 2)) * 4
        q = tl.reshape((packed[:, :, None] >> shift[None, None, :]) & 0xF, [BLOCK_K, BLOCK_N])
        col_shift = ((cols % 8) // 2 + 4 * (cols % 2)) * 4
    else:  # GPTQ [K/w, N], w = 32 / BITS: word p of a column holds input rows wp..wp+w-1, lowest bits first
        packs = start // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD)
        packed = tl.load(qweight_ptr + packs[:, None].to(tl.int64) * stride_qweight + cols[None, :],
                         mask=(packs < tl.cdiv(K, PER_WORD))[:, None] & col_ok[None, :], other=0)
        q = tl.reshape((packed[:, None, :] >> (nibble * BITS)[None, :, None]) & MASK, [BLOCK_K, BLOCK_N])
        col_shift = (cols % PER_WORD) * BITS  # GPTQ packs the zero points by column, in order
    if UNIFORM_GROUPS:  # the tile's one group: a row of zeros and scales
        group = start // GROUP_SIZE
        zero_pack = tl.load(qzeros_ptr + group * stride_qzeros + cols // PER_WORD, mask=col_ok, other=0)
        zero = ((zero_pack >> col_shift) & MASK)[None, :]
        scale = tl.load(scales_ptr + group * stride_scales + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    else:
        tile_ok = inner_ok[:, None] & col_ok[None, :]
        group = tl.load(g_idx_ptr + inner, mask=inner_ok, other=0)
        zero_pack = tl.load(qzeros_ptr + group[:, None].to(tl.int64) * stride_qzeros + (cols // PER_WORD)[None, :],
                            mask=tile_ok, other=0)
        zero = (zero_pack >> col_shift[None, :]) & MASK
        scale = tl.load(scales_ptr + group[:, None].to(tl.int64) * stride_scales + cols[None, :],
                        mask=tile_ok, other=0.0).to(tl.float32)
    if not AWQ:
        zero += 1  # GPTQ v1 stores zero − 1
    return (q - zero).to(tl.float32) * scale


@triton.jit
def _w4a16_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, out_ptr, M, N, PACKED_COLS, K, K_PER_SPLIT,
                  stride_x, stride_qweight, stride_qzeros, stride_scales, stride_out,
                  AWQ: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr, UNIFORM_GROUPS: tl.constexpr, SPLIT: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    for start in range(k_lo, k_hi, BLOCK_K):
        inner = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + inner[None, :],
                    mask=row_ok[:, None] & (inner < K)[None, :], other=0.0)
        weight = _weight_tile(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, start, pid_n, N, PACKED_COLS, K,
                              stride_qweight, stride_qzeros, stride_scales,
                              AWQ, BITS, BLOCK_N, BLOCK_K, GROUP_SIZE, UNIFORM_GROUPS)
        # bf16/fp16 operands on GPUs (tensor cores), fp32 accumulation; fp32 operands in full precision
        acc = tl.dot(x, weight.to(x.dtype), acc, input_precision=DOT_PRECISION)
    at = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    if SPLIT:
        tl.atomic_add(at, acc, mask=row_ok[:, None] & col_ok[None, :])
    else:
        tl.store(at, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _dequantize_kernel(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, out_ptr, N, PACKED_COLS, K,
                       stride_qweight, stride_qzeros, stride_scales, stride_out,
                       AWQ: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_SIZE: tl.constexpr, UNIFORM_GROUPS: tl.constexpr):
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    start = pid_k * BLOCK_K
    weight = _weight_tile(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, start, pid_n, N, PACKED_COLS, K,
                          stride_qweight, stride_qzeros, stride_scales, AWQ, BITS, BLOCK_N, BLOCK_K, GROUP_SIZE,
                          UNIFORM_GROUPS)
    inner = start + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + inner[:, None].to(tl.int64) * stride_out + cols[None, :], weight.to(out_ptr.dtype.element_ty),
             mask=(inner < K)[:, None] & (cols < N)[None, :])
