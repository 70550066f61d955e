"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): Qwen2-VL's dynamic-resolution tower with RMSNorm, a gated
MLP and window attention — patches are regrouped window by window (window_size pixels square, in merged
2 × 2 units), most blocks attend within a window and the fullatt_block_indexes blocks over the whole image;
the merged tokens go back to row order for the same M-RoPE Qwen2 language model as Qwen2-VL."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.engine.models.qwen2_vl import (
    GridRotary,
    PatchEmbed,
    PatchMerger,
    Qwen2VisionAttention,
    Qwen2VLForConditionalGeneration,
)
from llmctl.engine.models.vision_encoder import vision_activation


class VisionRMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class GatedVisionMLP(nn.Module):
    def __init__(self, width: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(width, intermediate), nn.Linear(width, intermediate)
        self.down_proj = nn.Linear(intermediate, width)
        self.act = nn.SiLU() if activation == "silu" else vision_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Qwen25VisionBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        width = config.hidden_size
        self.norm1, self.norm2 = VisionRMSNorm(width), VisionRMSNorm(width)
        self.attn = Qwen2VisionAttention(width, config.num_heads)
        self.mlp = GatedVisionMLP(width, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


def window_order(t: int, h: int, w: int, merge: int, side: int) -> tuple[torch.Tensor, list[int]]:
    """The merged units (merge × merge patches, in row order) regrouped window by window — side × side units,
    the last row and column of windows cut by the image's edge — and each window's number of units."""
    rows, cols = h // merge, w // merge
    units = torch.arange(t * rows * cols).view(t, rows, cols)
    order, sizes = [], []
    for frame in units:
        for top in range(0, rows, side):
            for left in range(0, cols, side):
                window = frame[top:top + side, left:left + side].flatten()
                order.append(window)
                sizes.append(window.numel())
    return torch.cat(order), sizes


class Qwen25VisionModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        width, self.merge = config.hidden_size, config.spatial_merge_size
        self.window_units = config.window_size // config.spatial_merge_size // config.patch_size
        self.full_attention = set(config.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(config, width)
        self.rotary = GridRotary(config, width // config.num_heads)
        self.blocks = nn.ModuleList(Qwen25VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(width, self.merge, config.out_hidden_size, VisionRMSNorm(width))

    def forward(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """One image: pixel_values [t·h·w, C·T·P·P], grid [1, 3] (t, h, w) → [t·h·w / merge², out_hidden]."""
        t, h, w = (int(v) for v in grid[0])
        order, windows = window_order(t, h, w, self.merge, self.window_units)
        unit = self.merge**2
        x = self._by_window(self.patch_embed(pixels), order, unit)
        cos, sin = (self._by_window(angles, order, unit) for angles in self.rotary(t, h, w, x.device))
        frames, windowed = [h * w] * t, [size * unit for size in windows]
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames if index in self.full_attention else windowed)
        return self.merger(x)[torch.argsort(order)]

    @staticmethod
    def _by_window(rows: torch.Tensor, order: torch.Tensor, unit: int) -> torch.Tensor:
        return rows.view(-1, unit, rows.shape[-1])[order].flatten(0, 1)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    tower = Qwen25VisionModel
