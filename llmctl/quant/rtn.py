"""Group quantization parameters and round-to-nearest, the baseline GPTQ and AWQ must beat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmctl.quant.formats import QuantizedWeight


@dataclass(frozen=True)
class QuantConfig:
    bits: int = 4
    group_size: int = 128  # -1: one group per output channel (the whole input)
    symmetric: bool = False

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1

    def group_for(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def group_params(w: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero per row of `w` [rows, group]: min/max (asymmetric) or ±max (symmetric)."""
    maxq = config.maxq
    wmin = w.min(dim=1).values.clamp(max=0)
    wmax = w.max(dim=1).values.clamp(min=0)
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


def quantize_values(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Integers for `w` [rows, n] with per-row scale/zero."""
    return torch.clamp(torch.round(w / scale.unsqueeze(1)) + zero.unsqueeze(1), 0, maxq)


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
    """Quantize and dequantize in one go (AWQ's search evaluates candidates this way)."""
    return rtn_quantize(weight, config).dequantize().to(weight.dtype)
