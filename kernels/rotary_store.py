"""RoPE and the KV store in one launch: each program takes one token, rotates its query heads into a
fresh [T, H, D] tensor and its key heads straight into their cache slot, and stores its value heads beside
them. q, k and v are read through their strides, so they stay views of the fused qkv projection (no copies).

Rotation is transformers' rotate-half layout over the first `rotary` dimensions (the rest pass through):
x·cos + rotate_half(x)·sin, with cos/sin per token as `llmctl.engine.layers.positions.RotaryEmbedding`
computes them (scaling rules, LongRoPE and attention scaling already in). Each product and the sum are
rounded to the model's dtype as torch's three ops round them. The cache side is `kv_store`'s: slot -1
stores nothing, fp8 caches store value / scale rounded to their format (e4m3 or e5m2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmctl.kernels.fp8 import Fp8Format, fp8_format
from llmctl.kernels.kv_store import _round_to_fp8, fp8_constexprs


def rotary_constexprs(heads: int, kv_heads: int, head_dim: int, rotary: int, fp8: Fp8Format | None) -> dict:
    """The kernel's compile-time parameters (shared with `llmctl.kernels.compile_check`)."""
    return dict(HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, ROTARY=rotary,
                PADDED_HEADS=triton.next_power_of_2(heads), PADDED_KV_HEADS=triton.next_power_of_2(kv_heads),
                PADDED_DIM=triton.next_power_of_2(head_dim), **fp8_constexprs(fp8))


def rotary_store(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 kv_cache: torch.Tensor, slots: torch.Tensor, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> torch.Tensor:
    """query [T, H, D], key/value [T, KVH, D] (last dimension contiguous, any token and head strides);
    cos/sin [T, rotary] (or [T, 1, rotary]); kv_cache [blocks, block_size, 2, KVH, D]; slots [T].
    Returns the rotated query, contiguous; the rotated key and the value are in the cache."""
    tokens, heads, head_dim = query.shape
    out = torch.empty(tokens, heads, head_dim, dtype=query.dtype, device=query.device)
    if tokens == 0:
        return out
    cos, sin = cos.reshape(tokens, -1), sin.reshape(tokens, -1)
    _rotary_store_kernel[(tokens,)](
        out, query, key, value, cos, sin, kv_cache, slots, 1.0 / k_scale, 1.0 / v_scale,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos.stride(0), sin.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        **rotary_constexprs(heads, key.shape[1], head_dim, cos.shape[1], fp8_format(kv_cache.dtype)))
    return out


@triton.jit
def _rotate(base, stride_head, heads, cos, sin, HEADS: tl.constexpr, PADDED: tl.constexpr,
            HEAD_DIM: tl.constexpr, PADDED_DIM: tl.constexpr, ROTARY: tl.constexpr):
    """[PADDED, PADDED_DIM] heads of one token, rotated over their first ROTARY dimensions."""
    head = tl.arange(0, PADDED)[:, None]
    dim = tl.arange(0, PADDED_DIM)[None, :]
    ok = (head < HEADS) & (dim < HEAD_DIM)
    x = tl.load(base + head * stride_head + dim, mask=ok, other=0.0)
    half = ROTARY // 2
    first_half = dim < half
    rotated = (dim < ROTARY) & ok
    partner = tl.load(base + head * stride_head + tl.where(first_half, dim + half, dim - half), mask=rotated,
                      other=0.0)
    partner = tl.where(first_half, -partner, partner)  # rotate_half: (-x2, x1)
    straight = (x.to(tl.float32) * cos.to(tl.float32)).to(x.dtype)
    turned = (partner.to(tl.float32) * sin.to(tl.float32)).to(x.dtype)
    return tl.where(rotated, (straight.to(tl.float32) + turned.to(tl.float32)).to(x.dtype), x), head, dim, ok


@triton.jit
def _rotary_store_kernel(out_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr, k_inverse, v_inverse,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
                         stride_slot, stride_kv, stride_cache_head,
                         HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY: tl.constexpr,
                         PADDED_HEADS: tl.constexpr, PADDED_KV_HEADS: tl.constexpr, PADDED_DIM: tl.constexpr,
                         FP8: tl.constexpr, LIMIT: tl.constexpr, MANTISSA: tl.constexpr,
                         MIN_EXPONENT: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)  # token × stride passes 2^31 in a long prefill
    dim = tl.arange(0, PADDED_DIM)[None, :]
    on_rotary = dim < ROTARY
    cos = tl.load(cos_ptr + token * stride_cos + dim, mask=on_rotary, other=1.0)
    sin = tl.load(sin_ptr + token * stride_sin + dim, mask=on_rotary, other=0.0)

    query, head, dim, ok = _rotate(q_ptr + token * stride_qt, stride_qh, HEADS, cos, sin, HEADS, PADDED_HEADS,
                                   HEAD_DIM, PADDED_DIM, ROTARY)
    tl.store(out_ptr + (token * HEADS + head) * HEAD_DIM + dim, query, mask=ok)

    key, head, dim, ok = _rotate(k_ptr + token * stride_kt, stride_kh, KV_HEADS, cos, sin, KV_HEADS,
                                 PADDED_KV_HEADS, HEAD_DIM, PADDED_DIM, ROTARY)
    value = tl.load(v_ptr + token * stride_vt + head * stride_vh + dim, mask=ok, other=0.0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    ok = ok & (dim < tl.where(slot >= 0, HEAD_DIM, 0))  # slot -1: store nothing
    if FP8:
        key = _round_to_fp8(key.to(tl.float32) * k_inverse, LIMIT, MANTISSA, MIN_EXPONENT)
        value = _round_to_fp8(value.to(tl.float32) * v_inverse, LIMIT, MANTISSA, MIN_EXPONENT)
    destination = cache_ptr + slot * stride_slot + head * stride_cache_head + dim
    tl.store(destination, key.to(cache_ptr.dtype.element_ty), mask=ok)
    tl.store(destination + stride_kv, value.to(cache_ptr.dtype.element_ty), mask=ok)
