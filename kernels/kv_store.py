"""KV store: write a step's new keys and values into their cache slots.

The cache is [num_blocks, block_size, 2, KV heads, D]; slot s is block s // block_size,
offset s % block_size. A slot of -1 means "do not store" (padding tokens of a captured
batch). The fp8 variants (e4m3 or e5m2, one scale per tensor, as vLLM's `--kv-cache-dtype fp8` and
`fp8_e5m2`) store value / scale and halve the cache's bytes against bfloat16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmctl.kernels.fp8 import Fp8Format, fp8_format


def store_kv_reference(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
                       k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    flat = kv_cache.view(-1, *kv_cache.shape[2:])
    keep = slots >= 0
    rows = slots[keep].long()
    for index, (new, scale) in enumerate(((key, k_scale), (value, v_scale))):
        new = new[keep].float()
        if (fp8 := fp8_format(kv_cache.dtype)) is not None:
            new = (new / scale).clamp(-fp8.limit, fp8.limit)
        flat[rows, index] = new.to(kv_cache.dtype)


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """key/value [T, KVH, D] (contiguous per token), slots [T] int32/int64."""
    tokens = key.shape[0]
    if tokens == 0:
        return
    _store_kernel[(tokens,)](
        key, value, kv_cache, slots, 1.0 / k_scale, 1.0 / v_scale,
        key.stride(0), value.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        **store_constexprs(key.shape[1] * key.shape[2], fp8_format(kv_cache.dtype)))


def store_constexprs(width: int, fp8: Fp8Format | None) -> dict:
    """The store kernel's compile-time parameters (shared with `llmctl.kernels.compile_check`)."""
    return dict(WIDTH=width, PADDED=triton.next_power_of_2(width), **fp8_constexprs(fp8))


def fp8_constexprs(fp8: Fp8Format | None) -> dict:
    """How stored values are rounded: FP8 false for a float cache; else the format's range and precision."""
    if fp8 is None:
        return dict(FP8=False, LIMIT=0.0, MANTISSA=0, MIN_EXPONENT=0)
    return dict(FP8=True, LIMIT=fp8.limit, MANTISSA=fp8.mantissa_bits, MIN_EXPONENT=fp8.min_exponent)


@triton.jit
def _store_kernel(key_ptr, value_ptr, cache_ptr, slot_ptr, k_inverse, v_inverse,
                  stride_key, stride_value, stride_slot, stride_kv,
                  WIDTH: tl.constexpr, PADDED: tl.constexpr, FP8: tl.constexpr, LIMIT: tl.constexpr,
                  MANTISSA: tl.constexpr, MIN_EXPONENT: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)  # token × stride passes 2^31 in a long prefill
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offsets = tl.arange(0, PADDED)
    mask = offsets < tl.where(slot >= 0, WIDTH, 0)  # slot -1: store nothing
    key = tl.load(key_ptr + token * stride_key + offsets, mask=mask)
    value = tl.load(value_ptr + token * stride_value + offsets, mask=mask)
    destination = cache_ptr + slot * stride_slot + offsets
    if FP8:
        key = _round_to_fp8(key.to(tl.float32) * k_inverse, LIMIT, MANTISSA, MIN_EXPONENT)
        value = _round_to_fp8(value.to(tl.float32) * v_inverse, LIMIT, MANTISSA, MIN_EXPONENT)
    tl.store(destination, key.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(destination + stride_kv, value.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round_to_fp8(x, LIMIT: tl.constexpr, MANTISSA: tl.constexpr, MIN_EXPONENT: tl.constexpr):
    """x rounded to the nearest value of the fp8 format (ties to even), in float32, so the cast is exact.
    Rounding here rather than in the cast: Triton's interpreter rounds carries wrongly (31.9 -> 16)."""
    x = tl.clamp(x, -LIMIT, LIMIT)
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    quantum = tl.exp2((tl.maximum(exponent, MIN_EXPONENT) - MANTISSA).to(tl.float32))  # subnormals keep the least
    scaled = tl.abs(x) / quantum
    nearest = tl.floor(scaled + 0.5)
    nearest = tl.where((nearest - scaled == 0.5) & (nearest % 2 == 1), nearest - 1, nearest)
    return tl.where(x < 0, -nearest, nearest) * quantum
