"""SmoothQuant (Xiao et al., 2023), as llm-compressor's SmoothQuantModifier runs it before GPTQ in its W8A8 recipe.

Activations quantized per token suffer from a few input channels much larger than the rest. SmoothQuant
moves that range into the weights, which are quantized per output channel and take it well: for the linears
that read one norm's output (q/k/v; gate/up), each input channel j gets
s_j = a_j^α / w_j^(1−α), where a_j is the channel's range over the calibration tokens (max − min) and w_j twice
the largest |weight| of column j among the linears (llm-compressor's own definitions; α = 0.8, its W8A8
examples' smoothing strength). The norm's weight is divided by s and the columns multiplied by it
(llmctl.quant.awq.fold_scales): the model is unchanged before rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from llmctl.quant.awq import fold_scales
from llmctl.quant.families import is_gemma, mlp_norm

STRENGTH = 0.8
MINIMUM_SCALE = 1e-5  # llm-compressor's floor: no channel is scaled to nothing


@torch.no_grad()
def smoothing_scales(ranges: torch.Tensor, linears: list[nn.Linear], strength: float = STRENGTH) -> torch.Tensor:
    """Each input channel's s from its activation range and the linears' columns."""
    weight = 2.0 * torch.stack([linear.weight.abs().amax(dim=0) for linear in linears]).amax(dim=0)
    scales = ranges.pow(strength) / weight.pow(1 - strength)
    return torch.where(weight > 0, scales, ranges).clamp(min=MINIMUM_SCALE)


class ChannelRanges:
    """max − min of each input channel over every token a linear reads (a forward hook's consumer)."""

    def __init__(self) -> None:
        self.low: dict[str, torch.Tensor] = {}
        self.high: dict[str, torch.Tensor] = {}

    def add(self, name: str, inputs: torch.Tensor) -> None:
        flat = inputs.reshape(-1, inputs.shape[-1]).float()
        low, high = flat.amin(dim=0), flat.amax(dim=0)
        self.low[name] = torch.minimum(self.low[name], low) if name in self.low else low
        self.high[name] = torch.maximum(self.high[name], high) if name in self.high else high

    def of(self, name: str) -> torch.Tensor:
        return self.high[name] - self.low[name]


def smooth_layer(layer: nn.Module, capture: Callable[[tuple[str, ...], Callable[[str, torch.Tensor], None]], None],
                 strength: float = STRENGTH) -> None:
    """llm-compressor's default mappings: input_layernorm → q/k/v, post-attention norm → gate/up (fused
    qkv_proj and gate_up_proj as one linear each). `capture(names, consume)` runs the calibration tokens
    through the layer and hands each named linear's inputs to `consume`."""
    attn: Any = layer.self_attn
    mlp: Any = layer.mlp
    qkv = [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
    first = ("self_attn.qkv_proj" if hasattr(attn, "qkv_proj") else "self_attn.q_proj",
             "mlp.gate_up_proj" if hasattr(mlp, "gate_up_proj") else "mlp.gate_proj")
    ranges = ChannelRanges()
    capture(first, ranges.add)  # both from the unsmoothed layer, as llm-compressor calibrates before smoothing
    offset = is_gemma(attn.config)  # Gemma's norms scale by (1 + weight)
    norms: list[Any] = [layer.input_layernorm, mlp_norm(layer)]
    for norm, linears, name in ((norms[0], qkv, first[0]), (norms[1], gate_up, first[1])):
        fold_scales(norm, linears, smoothing_scales(ranges.of(name), linears, strength), offset)
