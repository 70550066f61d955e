"""llama.cpp's K-quant quantizers, Q4_K, Q5_K and Q6_K, as `llama-quantize` runs them without an importance
matrix (ggml-quants.c: quantize_row_q4_K_ref and q5_K_ref with make_qkx2_quants, q6_K_ref with make_qx_quants).

gguf-py reads K-quants but cannot write them. These are the same searches, vectorised over every group of a
tensor at once, in float32 and in the C code's order of operations (sums added first to last, products
grouped left to right), so the blocks match llama.cpp's byte for byte where its build does not fuse
multiply-adds (tests compare with blocks its own quantizer wrote).
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # weights per super-block
GROUP_MAX_EPS = np.float32(1e-15)
F32 = np.float32


def _nearest_int(values: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int (adding 1.5·2²³ in float32): rounds half to even, as rint does."""
    return np.rint(values).astype(np.int32)


def _ordered_sum(values: np.ndarray) -> np.ndarray:
    """[n, G] → [G]: each group's n terms added first to last in float32, as the C loops add them."""
    total = values[0].copy()
    for row in values[1:]:
        total += row
    return total


def _fp16_round(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


@np.errstate(all="ignore")  # divisions by zero land only in groups the C code skips
def _qkx2(x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, nstep: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(32, nmax, x, weights, …, rmin, rdelta 0.1, nstep, use_mad false) for every group:
    x and weights [32, G]; returns codes [32, G] (0..nmax), scales [G] and mins [G] (w ≈ scale·code − min)."""
    lowest, highest = np.minimum(x.min(axis=0), F32(0)), x.max(axis=0)
    sum_w, sum_x = _ordered_sum(weights), _ordered_sum(weights * x)
    flat = highest == lowest
    span = np.where(flat, F32(1), highest - lowest)
    iscale = F32(nmax) / span
    scale = F32(1) / iscale
    codes = np.clip(_nearest_int(iscale * (x - lowest)), 0, nmax).astype(F32)
    best_error = _ordered_sum(weights * np.square(scale * codes + lowest - x))
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(0.1) * F32(step) + F32(nmax)) / np.where(flat, F32(1), highest - lowest)
        trial = np.clip(_nearest_int(iscale * (x - lowest)), 0, nmax).astype(F32)
        weighted = weights * trial
        sum_l, sum_l2, sum_xl = _ordered_sum(weighted), _ordered_sum(weighted * trial), _ordered_sum(weighted * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        solvable = det > 0
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det  # the C divides only where det > 0: masked below
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        clamped = this_min > 0
        this_min = np.where(clamped, F32(0), this_min)
        this_scale = np.where(clamped, sum_xl / sum_l2, this_scale)  # 0/0 is NaN there too: never better
        error = _ordered_sum(weights * np.square(this_scale * trial + this_min - x))
        better = solvable & (error < best_error) & ~flat
        codes = np.where(better, trial, codes)
        best_error = np.where(better, error, best_error)
        scale, lowest = np.where(better, this_scale, scale), np.where(better, this_min, lowest)
    codes = np.where(flat, F32(0), codes)
    return codes, np.where(flat, F32(0), scale), -lowest


@np.errstate(all="ignore")
def _with_mins(weights: np.ndarray, nmax: int, rmin: float, nstep: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's shared part: [rows, columns] → the super-blocks' d and dmin (float16, [B]), their
    twelve bytes of packed 6-bit sub-block scales and mins ([B, 12]), and the codes ([B, 8, 32], 0..nmax)."""
    x = np.ascontiguousarray(weights, dtype=F32).reshape(-1, 8, 32)  # [super-blocks, sub-blocks, 32]
    blocks = x.shape[0]
    by_position = x.reshape(-1, 32).T  # [32, blocks · 8]
    av_x = np.sqrt(_ordered_sum(by_position * by_position) / F32(32))
    codes, scales, mins = _qkx2(by_position, av_x + np.abs(by_position), nmax, rmin, nstep)
    codes, scales, mins = codes.T.reshape(blocks, 8, 32), scales.reshape(blocks, 8), mins.reshape(blocks, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    sub_scales = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)
    sub_mins = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
    d, dmin = _fp16_round(max_scale / F32(63)), _fp16_round(max_min / F32(63))
    step = d.astype(F32)[:, None] * sub_scales.astype(F32)
    offset = dmin.astype(F32)[:, None] * sub_mins.astype(F32)
    requantized = np.clip(_nearest_int((x + offset[..., None]) / step[..., None]), 0, nmax)
    codes = np.where((step == 0)[..., None], codes, requantized).astype(np.uint8)
    head = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8),
                           _pack_scale_min_k4(sub_scales.astype(np.uint8), sub_mins.astype(np.uint8))], axis=1)
    return head, codes


def quantize_q4_k(weights: np.ndarray) -> np.ndarray:
    """[rows, columns] float32 (columns a multiple of 256) → Q4_K blocks, [rows, columns / 256 · 144] uint8."""
    rows, columns = weights.shape
    head, codes = _with_mins(weights, 15, -1.0, 20)
    pairs = codes.reshape(-1, 4, 2, 32)  # sub-blocks 2j and 2j+1 share 32 bytes: low and high nibbles
    low_high = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([head, low_high], axis=1).reshape(rows, columns // QK_K * 144)


def quantize_q5_k(weights: np.ndarray) -> np.ndarray:
    """[rows, columns] float32 (columns a multiple of 256) → Q5_K blocks, [rows, columns / 256 · 176] uint8: as
    Q4_K, with 5-bit codes (rmin −0.5, 15 steps) whose fifth bits go in 32 bytes of their own."""
    rows, columns = weights.shape
    head, codes = _with_mins(weights, 31, -0.5, 15)
    pairs = codes.reshape(-1, 4, 2, 32)
    low_high = ((pairs[:, :, 0] & 0xF) | ((pairs[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    fifth = (pairs >> 4).astype(np.uint8)  # [B, chunk c, half h, 32]: bit 2c + h of byte j
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)
    high = (fifth << shifts[None, :, :, None]).sum(axis=(1, 2), dtype=np.uint8)
    return np.concatenate([head, high, low_high], axis=1).reshape(rows, columns // QK_K * 176)


def _pack_scale_min_k4(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins in 12 bytes, as get_scale_min_k4 reads them."""
    packed = np.zeros((scales.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = scales[:, 0:4] | ((scales[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mins[:, 0:4] | ((mins[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (scales[:, 4:8] & 0xF) | ((mins[:, 4:8] & 0xF) << 4)
    return packed


@np.errstate(all="ignore")
def _qx(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(16, 32, x, …, rmse_type 1, no weights) for every group: x [16, G]; returns codes [16, G]
    (0..63, the signed code + 32) and scales [G] (w ≈ scale · (code − 32))."""
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None], axis=0)[0]  # the first largest |x|, signed
    silent = np.abs(peak) < GROUP_MAX_EPS
    peak = np.where(silent, F32(1), peak)
    weights = x * x

    def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = np.clip(_nearest_int(iscale * x), -32, 31).astype(F32)
        return levels, _ordered_sum(weights * x * levels), _ordered_sum(weights * levels * levels)

    levels, sum_lx, sum_l2 = trial(F32(-32) / peak)
    scale = np.where(sum_l2 != 0, sum_lx / np.where(sum_l2 != 0, sum_l2, F32(1)), F32(0))
    best = scale * sum_lx
    for step in [*range(-9, 0), *range(1, 10)]:
        candidate, lx, l2 = trial(-(F32(32) + F32(0.1) * F32(step)) / peak)
        better = (l2 > 0) & (lx * lx > best * l2)
        levels = np.where(better, candidate, levels)
        scale = np.where(better, lx / np.where(l2 > 0, l2, F32(1)), scale)
        best = np.where(better, scale * lx, best)
    return np.where(silent, F32(0), levels + F32(32)), np.where(silent, F32(0), scale)


@np.errstate(all="ignore")
def quantize_q6_k(weights: np.ndarray) -> np.ndarray:
    """[rows, columns] float32 (columns a multiple of 256) → Q6_K blocks, [rows, columns / 256 · 210] uint8."""
    rows, columns = weights.shape
    x = np.ascontiguousarray(weights, dtype=F32).reshape(-1, 16, 16)  # [super-blocks, sub-blocks, 16]
    blocks = x.shape[0]
    codes, scales = _qx(x.reshape(-1, 16).T)
    codes, scales = codes.T.reshape(blocks, 16, 16), scales.reshape(blocks, 16)
    strongest = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)[:, 0]
    silent = np.abs(strongest) < GROUP_MAX_EPS
    iscale = F32(-128) / np.where(silent, F32(1), strongest)
    d = _fp16_round(np.where(silent, F32(0), F32(1) / iscale))
    sub_scales = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    step = d.astype(F32)[:, None] * sub_scales.astype(F32)
    requantized = np.clip(_nearest_int(x / np.where(step == 0, F32(1), step)[..., None]), -32, 31) + 32
    codes = np.where((step == 0)[..., None], codes, requantized).astype(np.uint8).reshape(blocks, 2, 4, 32)
    low, high = codes & 0xF, codes >> 4
    out = np.empty((blocks, 210), dtype=np.uint8)
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    out[:, 0:128] = ql.reshape(blocks, 128)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out[:, 128:192] = qh.reshape(blocks, 64)
    out[:, 192:208] = sub_scales.view(np.uint8)
    out[:, 208:210] = d.reshape(-1, 1).view(np.uint8)
    out[silent] = 0
    return out.reshape(rows, columns // QK_K * 210)
