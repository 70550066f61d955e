"""Group quantization parameters and round-to-nearest, the baseline GPTQ and AWQ must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmctl.checkpoint.quant_formats import QuantizedWeight


@dataclass(frozen=True)
class QuantConfig:
    bits: int = 4
    group_size: int = 128  # -1: one group per output channel (the whole input)
    symmetric: bool = False
    # GPTQ only: visit columns by decreasing Hessian diagonal (the most sensitive first) while
    # keeping groups contiguous in the original order ("static groups"), so the checkpoint is
    # still desc_act false with a trivial g_idx, which every GPTQ kernel (vLLM's included) reads.
    # Off: the original order, group parameters taken at each group start from the updated weights.
    act_order: bool = True

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1

    def group_for(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def group_params(w: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero per row of `w` [rows, group]: min/max (asymmetric) or ±max (symmetric)."""
    maxq = config.maxq
    wmin, wmax = torch.aminmax(w, dim=1)
    wmin, wmax = wmin.clamp(max=0), wmax.clamp(min=0)
    if config.symmetric:
        wmax = torch.maximum(wmin.abs(), wmax)
        wmin = -wmax
    flat = (wmax - wmin) == 0
    wmin, wmax = torch.where(flat, -1.0, wmin), torch.where(flat, 1.0, wmax)
    scale = (wmax - wmin) / maxq
    if config.symmetric:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.round(-wmin / scale).clamp(0, maxq)
    return scale, zero


def search_group_params(w: torch.Tensor, config: QuantConfig, steps: int = 20,
                        max_shrink: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `group_params`, but tries ranges shrunk by up to `max_shrink` and keeps, per row, the one
    with the least squared rounding error (GPTQ's "mse" quantizer): clipping a few outliers buys
    finer steps for all the other weights."""
    best_scale, best_zero = group_params(w, config)
    best_error = _rounding_error(w, best_scale, best_zero, config.maxq)
    for step in range(1, steps + 1):
        shrink = 1 - max_shrink * step / steps
        scale, zero = group_params(w * shrink, config)
        error = _rounding_error(w, scale, zero, config.maxq)
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
        best_error = torch.minimum(error, best_error)
    return best_scale, best_zero


def _rounding_error(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    q = quantize_values(w, scale, zero, maxq)
    return q.sub_(zero.unsqueeze(1)).mul_(scale.unsqueeze(1)).sub_(w).pow_(2).sum(dim=1)


def quantize_values(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Integers for `w` [rows, n] with per-row scale/zero (in place on one new tensor: these run per candidate)."""
    return (w / scale.unsqueeze(1)).round_().add_(zero.unsqueeze(1)).clamp_(0, maxq)


def rtn_quantize(weight: torch.Tensor, config: QuantConfig) -> QuantizedWeight:
    """Round-to-nearest with per-group parameters; weight [out, in]."""
    out_features, in_features = weight.shape
    group = config.group_for(in_features)
    grouped = weight.float().reshape(out_features * (in_features // group), group)
    scale, zero = group_params(grouped, config)
    q = quantize_values(grouped, scale, zero, config.maxq)
    groups = in_features // group
    return QuantizedWeight(q.reshape(out_features, in_features).to(torch.int32), scale.reshape(out_features, groups),
                           zero.reshape(out_features, groups).to(torch.int32), config.bits, group)


def fake_quantize(weight: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """Quantize and dequantize in one go (AWQ's search evaluates candidates this way): the values of
    `rtn_quantize(weight, config).dequantize()`, computed group-wise without the integer tensors."""
    grouped = weight.float().reshape(-1, config.group_for(weight.shape[1]))
    scale, zero = group_params(grouped, config)
    q = quantize_values(grouped, scale, zero, config.maxq)
    return q.sub_(zero.unsqueeze(1)).mul_(scale.unsqueeze(1)).reshape(weight.shape).to(weight.dtype)
