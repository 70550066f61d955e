"""Fused element-wise layers for the GPU path: one launch where torch runs several.

- `rms_norm`: RMSNorm of each row, optionally after adding a residual (the sum is written back into the
  residual buffer, as vLLM's `fused_add_rms_norm`), in float32 as transformers computes it. Llama's form
  scales the normalized row cast back to the model's dtype by the weight; Gemma's (`unit_offset`) scales in
  float32 by (1 + weight), then casts. A [tokens, heads, head_dim] tensor is normed per head (QK-norm).
- `gated_activation`: silu(gate) * up or gelu_tanh(gate) * up of a fused [gate | up] projection.

Rows up to `limits.MAX_FUSED_WIDTH` wide (`llmctl.engine.layers.fused_ops.applies` checks it).

Each is tested under Triton's interpreter against the torch expression it replaces
(`llmctl.engine.layers.norms`, `llmctl.engine.layers.activations`) and compiled for sm_80/89/90 by the
compile check.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def norm_constexprs(width: int, unit_offset: bool, has_residual: bool) -> dict:
    """The norm kernel's compile-time parameters (shared with the compile check)."""
    return dict(WIDTH=width, BLOCK=triton.next_power_of_2(width), UNIT_OFFSET=unit_offset, RESIDUAL=has_residual)


def activation_constexprs(intermediate: int, gelu: bool) -> dict:
    return dict(INTERMEDIATE=intermediate, BLOCK=min(1024, triton.next_power_of_2(intermediate)), GELU=gelu)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             unit_offset: bool = False) -> torch.Tensor:
    """norm(x) or, with `residual`, norm(x + residual) with the sum stored into `residual`. x: [tokens, width]
    or [tokens, heads, width] (QK-norm, read through its strides: q and k may be views of one projection);
    returns a new contiguous tensor of x's shape and dtype."""
    tokens, width = x.shape[0], x.shape[-1]
    heads = x.shape[1] if x.dim() == 3 else 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    sums = residual if residual is not None else x
    _rms_norm_kernel[(tokens, heads)](out, x, sums, weight, eps, x.stride(0), x.stride(1) if x.dim() == 3 else 0,
                                      sums.stride(0), **norm_constexprs(width, unit_offset, residual is not None))
    return out


def gated_activation(fused: torch.Tensor, intermediate: int, gelu: bool = False) -> torch.Tensor:
    """silu(gate) * up (or gelu_tanh(gate) * up) of a [tokens, 2 × intermediate] projection."""
    tokens = fused.shape[0]
    out = torch.empty(tokens, intermediate, dtype=fused.dtype, device=fused.device)
    if tokens == 0:
        return out
    constexprs = activation_constexprs(intermediate, gelu)
    grid = (tokens, triton.cdiv(intermediate, constexprs["BLOCK"]))
    _gated_activation_kernel[grid](out, fused, fused.stride(0), **constexprs)
    return out


@triton.jit
def _rms_norm_kernel(out_ptr, x_ptr, residual_ptr, weight_ptr, eps, stride_token, stride_head, stride_residual,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, UNIT_OFFSET: tl.constexpr, RESIDUAL: tl.constexpr):
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < WIDTH
    x = tl.load(x_ptr + token * stride_token + head * stride_head + cols, mask=ok, other=0.0)
    if RESIDUAL:  # the sum is rounded to the model's dtype, as torch's `x + residual` is, before the norm
        at = residual_ptr + token * stride_residual + cols
        x = (x.to(tl.float32) + tl.load(at, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(at, x, mask=ok)
    value = x.to(tl.float32)
    normed = value * tl.rsqrt(tl.sum(value * value, 0) / WIDTH + eps)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0)
    if UNIT_OFFSET:
        result = normed * (1.0 + weight.to(tl.float32))
    else:  # Llama: the weight multiplies the normalized row already cast back
        result = weight * normed.to(x.dtype)
    out_at = out_ptr + (token * tl.num_programs(1) + head) * WIDTH + cols
    tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_activation_kernel(out_ptr, fused_ptr, stride_fused,
                             INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr, GELU: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTERMEDIATE
    gate = tl.load(fused_ptr + token * stride_fused + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(fused_ptr + token * stride_fused + INTERMEDIATE + cols, mask=ok, other=0.0)
    if GELU:  # tanh approximation: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))), tanh(y) = 2σ(2y) − 1
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        activated = gate * tl.sigmoid(2.0 * inner)
    else:
        activated = gate * tl.sigmoid(gate)
    # torch computes silu(gate) in the model's dtype, then multiplies by up in it
    result = activated.to(up.dtype) * up
    tl.store(out_ptr + token * INTERMEDIATE + cols, result, mask=ok)
