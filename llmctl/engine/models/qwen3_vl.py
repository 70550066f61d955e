"""Qwen3-VL (Qwen3VLForConditionalGeneration): Qwen2-VL's dynamic-resolution tower with learned positions
(a square table resampled bilinearly to each image's grid), LayerNorm blocks with a GELU MLP, and DeepStack —
the outputs of some blocks (deepstack_visual_indexes), merged like the last, are added to the image tokens'
hidden states after the first language layers; the Qwen3 language model (q/k norms) turns by interleaved
M-RoPE (t, h, w frequencies in turn)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.layers.positions import MRotaryEmbedding, RotaryEmbedding
from llmctl.engine.models.common import Shard, StepContext, Target
from llmctl.engine.models.qwen2_vl import GridRotary, PatchEmbed, Qwen2VisionBlock, Qwen2VLForConditionalGeneration
from llmctl.errors import UnsupportedModelError


class Qwen3PatchMerger(nn.Module):
    """merge × merge patches into one language token; DeepStack's mergers norm after folding, the last before."""

    def __init__(self, config: Any, norm_after_folding: bool) -> None:
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size**2
        self.norm_after_folding = norm_after_folding
        self.norm = nn.LayerNorm(self.width if norm_after_folding else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.act = nn.GELU()
        self.linear_fc2 = nn.Linear(self.width, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.norm_after_folding else self.norm(x).view(-1, self.width)
        return self.linear_fc2(self.act(self.linear_fc1(x)))


def _axis_taps(size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (align_corners) of `size` points into a `side`-long table: [size, 2] indices, weights."""
    source = torch.arange(size, dtype=torch.float32) * (side - 1) / max(size - 1, 1)
    floor = source.floor()
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def resampled_positions(table: torch.Tensor, t: int, h: int, w: int, merge: int) -> torch.Tensor:
    """The square learned position table [side², width] resampled to an h × w grid (transformers' bilinear
    taps), patches in merge-block order, repeated for each of t frames: [t·h·w, width]."""
    side = int(table.shape[0] ** 0.5)
    (rows, row_weights), (cols, col_weights) = _axis_taps(h, side), _axis_taps(w, side)
    indices = (rows[:, None, :, None] * side + cols[None, :, None, :]).reshape(h, w, 4).to(table.device)
    weights = (row_weights[:, None, :, None] * col_weights[None, :, None, :]).reshape(h, w, 4).to(table.device)
    grid = (table[indices] * weights[..., None]).sum(2)  # [h, w, width]
    grid = grid.view(h // merge, merge, w // merge, merge, -1).permute(0, 2, 1, 3, 4).reshape(h * w, -1)
    return grid.repeat(t, 1)


class Qwen3VisionModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        width, self.merge = config.hidden_size, config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, width, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, width)
        self.rotary = GridRotary(config, width // config.num_heads)
        self.blocks = nn.ModuleList(Qwen2VisionBlock(width, config.num_heads, config.intermediate_size,
                                                     config.hidden_act) for _ in range(config.depth))
        self.merger = Qwen3PatchMerger(config, norm_after_folding=False)
        self.deepstack_indexes = list(config.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(Qwen3PatchMerger(config, norm_after_folding=True)
                                                   for _ in self.deepstack_indexes)

    def forward(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """One image → [t·h·w / merge², out_hidden · (1 + DeepStack layers)]: its tokens, then their features
        for each DeepStack layer side by side."""
        t, h, w = (int(v) for v in grid[0])
        x = self.patch_embed(pixels)
        x = x + resampled_positions(self.pos_embed.weight, t, h, w, self.merge).to(x.dtype)
        cos, sin = self.rotary(t, h, w, x.device)
        features = []
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, [h * w] * t)
            if index in self.deepstack_indexes:
                features.append(self.deepstack_merger_list[self.deepstack_indexes.index(index)](x))
        return torch.cat([self.merger(x), *features], dim=-1)


class Qwen3VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    tower = Qwen3VisionModel

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.deepstack_layers = len(hf_config.vision_config.deepstack_visual_indexes)
        if not self.shard.is_first and self.stage_layers and self.stage_layers[0] < self.deepstack_layers:
            raise UnsupportedModelError(f"Qwen3-VL adds image features after its first {self.deepstack_layers} "
                                        "layers: the first pipeline stage must hold them (use fewer stages)")

    def make_rotary(self, hf_config: Any, head_dim: int) -> RotaryEmbedding:
        return MRotaryEmbedding(hf_config, head_dim, interleaved=True)

    def targets(self, name: str) -> list[Target]:
        return super().targets(name.replace(".mlp.linear_fc", ".mlp.fc"))  # the blocks' MLP as Qwen2-VL's

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        if ctx.deepstack is None:
            return super().forward(input_ids, ctx, hidden)
        assert ctx.input_embeds is not None  # DeepStack features come with the images' embeddings
        x, width = ctx.input_embeds, ctx.input_embeds.shape[-1]
        for index in self.stage_layers:
            x = self.layers[index](x, ctx, index)
            if index < self.deepstack_layers:
                x = x + ctx.deepstack[:, index * width:(index + 1) * width]
        return self.norm(x) if self.norm is not None else x
