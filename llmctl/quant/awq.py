"""AWQ (Lin et al., 2023): scale salient input channels before rounding, then clip.

For each group of linears that read the same input, a grid of 20 exponents α trades
activation magnitude against weight magnitude: s = x̄^α / w̄^(1−α). The scale that gives the
smallest error of the block's output (attention, MLP, or the linear itself) is folded
into the operation before (a norm's weight or the previous linear's output rows), so the
model is unchanged before rounding. Then each linear's weights are clipped per group to
the range that minimizes its output error, and rounded asymmetrically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from llmctl.quant.rtn import QuantConfig, fake_quantize

GRID = 20
CLIP_GRID = 20
CLIP_MAX_SHRINK = 0.5
CLIP_TOKENS = 512
SEARCH_TOKENS = 512  # calibration tokens the α grid is scored on (the block runs 21 times per group): docs/quantize.md


@dataclass
class ScaleGroup:
    previous: nn.Module  # a norm (weight) or a linear (its last output rows)
    linears: list[nn.Linear]
    inputs: torch.Tensor  # [tokens, in] what the linears read
    block: Callable[[torch.Tensor], torch.Tensor]  # the module whose output error is minimized
    unit_offset: bool = False  # the previous norm scales by (1 + weight) (Gemma)


@torch.no_grad()
def search_scales(group: ScaleGroup, config: QuantConfig) -> torch.Tensor:
    x_mean = group.inputs.abs().reshape(-1, group.inputs.shape[-1]).float().mean(0)
    x = _subsample(group.inputs)
    weights = torch.cat([linear.weight for linear in group.linears], dim=0)
    size = config.group_for(weights.shape[1])
    w = weights.abs().reshape(-1, size)
    w = (w / w.amax(dim=1, keepdim=True).clamp(min=1e-8)).reshape(weights.shape)
    w_mean = w.mean(0)
    reference = group.block(x)
    originals = [linear.weight.detach().clone() for linear in group.linears]
    best_error, best_scales = float("inf"), torch.ones_like(x_mean)
    candidates = [torch.ones_like(x_mean)]  # no scaling: AWQ is never worse than plain rounding on the block
    for step in range(GRID):
        alpha = step / GRID
        scales = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        candidates.append(scales / (scales.max() * scales.min()).sqrt())
    for scales in candidates:
        for linear, original in zip(group.linears, originals):
            linear.weight.copy_(fake_quantize(original * scales, config) / scales)
        error = (group.block(x) - reference).float().pow(2).mean().item()
        if error < best_error:
            best_error, best_scales = error, scales.clone()
    for linear, original in zip(group.linears, originals):
        linear.weight.copy_(original)
    return best_scales


def _subsample(inputs: torch.Tensor) -> torch.Tensor:
    """Whole sequences (attention needs them) adding up to about SEARCH_TOKENS tokens."""
    if inputs.dim() < 3:
        return inputs
    sequences = max(1, SEARCH_TOKENS // inputs.shape[1])
    return inputs[:sequences]


@torch.no_grad()
def apply_scales(group: ScaleGroup, scales: torch.Tensor) -> None:
    """Divide the previous operation's output by s and multiply the linears' inputs by s."""
    fold_scales(group.previous, group.linears, scales, group.unit_offset)


@torch.no_grad()
def fold_scales(previous: nn.Module, linears: list[nn.Linear], scales: torch.Tensor, unit_offset: bool) -> None:
    """The model unchanged, its linears' input channels scaled by s: the previous operation's output (a norm's
    weight, or a linear's last rows) divided by s, the linears' weight columns multiplied by it (AWQ, SmoothQuant)."""
    if isinstance(previous, nn.Linear):  # its last rows: all of v_proj, or the v (up) part of a fused qkv (gate_up)
        rows = scales.numel()
        previous.weight[-rows:].div_(scales.unsqueeze(1))
        if previous.bias is not None:
            previous.bias[-rows:].div_(scales)
    elif unit_offset:  # (1 + w) / s = 1 + w'
        previous.weight.copy_((1 + previous.weight) / scales - 1)
    else:
        previous.weight.div_(scales)
        if getattr(previous, "bias", None) is not None:
            previous.bias.div_(scales)
    for linear in linears:
        linear.weight.mul_(scales.unsqueeze(0))


@torch.no_grad()
def clip_weights(linear: nn.Linear, inputs: torch.Tensor, config: QuantConfig) -> None:
    """Per output channel and group, the clipping range with the smallest output error."""
    weight = linear.weight.detach()
    out_features, in_features = weight.shape
    size = config.group_for(in_features)
    groups = in_features // size
    x = inputs.reshape(-1, in_features)
    x = x[torch.linspace(0, x.shape[0] - 1, min(CLIP_TOKENS, x.shape[0])).long()].float()
    x = x.view(-1, groups, size).transpose(0, 1)  # [groups, T, size]
    # the mean over tokens of (x·d)² is dᵀ G d with G = xᵀx / T per group: one small Gram matrix per group
    # rather than every token's product with every candidate
    gram = x.transpose(1, 2) @ x / x.shape[1]  # [groups, size, size]
    w = weight.float().view(out_features, groups, size)
    original_max = w.abs().amax(dim=-1, keepdim=True)  # [out, groups, 1]
    best_max = original_max.clone()
    best_error = torch.full((out_features, groups), float("inf"))
    for step in range(int(CLIP_MAX_SHRINK * CLIP_GRID)):
        max_val = original_max * (1 - step / CLIP_GRID)
        clipped = torch.clamp(w, -max_val, max_val)
        quantized = fake_quantize(clipped.view(out_features, in_features), config).view(out_features, groups, size)
        diff = (w - quantized).transpose(0, 1)  # [groups, out, size]
        error = ((diff @ gram) * diff).sum(-1).transpose(0, 1)  # [out, groups]
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_max = torch.where(better.unsqueeze(-1), max_val, best_max)
    linear.weight.copy_(torch.clamp(w, -best_max, best_max).view(out_features, in_features).to(weight.dtype))
