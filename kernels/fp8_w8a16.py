"""FP8 W8A16 GEMM: activations in 16/32-bit floats times float8 e4m3 weights, each with a float32 scale per block
of the weight (DeepSeek-V3's and the Qwen3 `-FP8` releases' 128 × 128), per output channel, or per tensor.

The weight is held K-major, as the W4A16 kernel reads GPTQ's: `qweight` [K, N] bytes (the e4m3 bits), `scales`
[K / SCALE_K, N] float32 (a block's scale repeated along its output columns; per channel or per tensor: one row,
SCALE_K = K). Each [BLOCK_K, BLOCK_N] tile is decoded in registers by moving the byte's sign, exponent and mantissa
into a float16's fields — exact, since every e4m3 value is a float16 value times 2⁸, and it needs no FP8 hardware, so
sm_80 runs what sm_89/90 run (vLLM's Marlin-FP8 fallback does the same for Ampere) — then scaled in float32 and
multiplied in the activations' dtype, accumulating in float32. Above DEQUANTIZE_ABOVE_ROWS rows the weight is
decoded once into the activations' dtype and multiplied by cuBLAS, as the W4A16 path does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmctl.kernels.attention import dot_precision
from llmctl.kernels.w4a16 import DEQUANTIZE_ABOVE_ROWS

BLOCK_K = 64  # divides the 128-wide scale blocks: a tile's scales are one row


def fp8_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, scale_k: int) -> torch.Tensor:
    """x [M, K] @ the dequantized [K, N] weight, in torch (float8_e4m3fn's own conversion)."""
    weight = qweight.view(torch.float8_e4m3fn).float() * scales.float().repeat_interleave(scale_k, 0)[:qweight.shape[0]]
    return (x.float() @ weight).to(x.dtype)


def fp8_constexprs(rows: int, scale_k: int, dtype: torch.dtype) -> dict:
    """The GEMM's compile-time parameters (shared with llmctl.kernels.compile_check)."""
    return dict(BLOCK_M=max(16, min(64, triton.next_power_of_2(rows))), BLOCK_N=64, BLOCK_K=BLOCK_K,
                UNIFORM=scale_k % BLOCK_K == 0, SCALE_K=scale_k, DOT_PRECISION=dot_precision(dtype))


def fp8_dequantize_constexprs(scale_k: int) -> dict:
    return dict(BLOCK_N=64, BLOCK_K=BLOCK_K, UNIFORM=scale_k % BLOCK_K == 0, SCALE_K=scale_k)


def fp8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, scale_k: int) -> torch.Tensor:
    """x [M, K] (float16, bfloat16 or float32) @ the fp8 weight [K, N] → [M, N] in x's dtype."""
    rows, inner = x.shape
    cols = qweight.shape[1]
    if rows > DEQUANTIZE_ABOVE_ROWS:
        return x @ fp8_dequantize(qweight, scales, scale_k, x.dtype)
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    constexprs = fp8_constexprs(rows, scale_k, x.dtype)
    grid = (triton.cdiv(rows, constexprs["BLOCK_M"]), triton.cdiv(cols, constexprs["BLOCK_N"]))
    _fp8_kernel[grid](x, qweight, scales, out, rows, cols, inner, x.stride(0), qweight.stride(0), scales.stride(0),
                      out.stride(0), **constexprs)
    return out


def fp8_dequantize(qweight: torch.Tensor, scales: torch.Tensor, scale_k: int, dtype: torch.dtype) -> torch.Tensor:
    """The [K, N] weight in `dtype`, each byte read once (prefill: then one cuBLAS GEMM)."""
    inner, cols = qweight.shape
    weight = torch.empty(inner, cols, dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(inner, BLOCK_K), triton.cdiv(cols, 64))  # fp8_dequantize_constexprs' tiles
    _fp8_dequantize_kernel[grid](qweight, scales, weight, cols, inner, qweight.stride(0), scales.stride(0),
                                 weight.stride(0), **fp8_dequantize_constexprs(scale_k))
    return weight


@triton.jit
def _fp8_tile(qweight_ptr, scales_ptr, start, pid_n, N, K, stride_q, stride_s,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UNIFORM: tl.constexpr, SCALE_K: tl.constexpr):
    """Rows [start, start + BLOCK_K) × this program's BLOCK_N columns of the weight, in float32."""
    inner = start + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (inner < K)[:, None] & (cols < N)[None, :]
    bits = tl.load(qweight_ptr + inner[:, None].to(tl.int64) * stride_q + cols[None, :], mask=ok, other=0)
    bits = bits.to(tl.uint16)
    half = ((bits & 0x7F) << 7) | ((bits & 0x80) << 8)  # e4m3's fields in a float16's: the value × 2⁻⁸
    value = half.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    if UNIFORM:  # the tile lies in one scale block along K: one row of scales
        scale = tl.load(scales_ptr + (start // SCALE_K) * stride_s + cols, mask=cols < N, other=0.0)[None, :]
    else:
        group = (inner // SCALE_K).to(tl.int64)
        scale = tl.load(scales_ptr + group[:, None] * stride_s + cols[None, :], mask=ok, other=0.0)
    return value * scale


@triton.jit
def _fp8_kernel(x_ptr, qweight_ptr, scales_ptr, out_ptr, M, N, K, stride_x, stride_q, stride_s, stride_out,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UNIFORM: tl.constexpr,
                SCALE_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        inner = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + inner[None, :],
                    mask=row_ok[:, None] & (inner < K)[None, :], other=0.0)
        weight = _fp8_tile(qweight_ptr, scales_ptr, start, pid_n, N, K, stride_q, stride_s, BLOCK_N, BLOCK_K,
                           UNIFORM, SCALE_K)
        acc = tl.dot(x, weight.to(x.dtype), acc, input_precision=DOT_PRECISION)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _fp8_dequantize_kernel(qweight_ptr, scales_ptr, out_ptr, N, K, stride_q, stride_s, stride_out,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UNIFORM: tl.constexpr,
                           SCALE_K: tl.constexpr):
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    start = pid_k * BLOCK_K
    weight = _fp8_tile(qweight_ptr, scales_ptr, start, pid_n, N, K, stride_q, stride_s, BLOCK_N, BLOCK_K, UNIFORM,
                       SCALE_K)
    inner = start + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + inner[:, None].to(tl.int64) * stride_out + cols[None, :], weight.to(out_ptr.dtype.element_ty),
             mask=(inner < K)[:, None] & (cols < N)[None, :])
