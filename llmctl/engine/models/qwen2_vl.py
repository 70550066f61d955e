"""Qwen2-VL (Qwen2VLForConditionalGeneration): each image at its own resolution is a grid of 14 px patches
(two copies of the frame stacked in time); a ViT with 2-D rotary positions attends over the whole image, a
merger folds each 2 × 2 block of patches into one token for the Qwen2 language model, whose rotary positions
are multimodal (M-RoPE: temporal, height and width sections; llmctl.engine.multimodal.mrope)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.layers.positions import MRotaryEmbedding, RotaryEmbedding
from llmctl.engine.models.common import Shard, Target
from llmctl.engine.models.vision_encoder import VisionMLP
from llmctl.engine.models.vision_language import VisionLanguageModel


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen2VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[int]) -> torch.Tensor:
        """x [patches, dim]; cos, sin [patches, head_dim]: rotated in float32 as transformers does. Each
        segment (a frame, or a window) of consecutive patches attends within itself."""
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
        cos, sin = cos[:, None].float(), sin[:, None].float()
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(x.dtype)
        parts = [F.scaled_dot_product_attention(q_.transpose(0, 1), k_.transpose(0, 1), v_.transpose(0, 1))
                 for q_, k_, v_ in zip(q.split(segments), k.split(segments), v.split(segments))]
        return self.proj(torch.cat(parts, dim=1).transpose(0, 1).reshape(x.shape[0], -1))


class Qwen2VisionBlock(nn.Module):
    """LayerNorm, attention with 2-D rotary positions, LayerNorm, MLP (Qwen2-VL's and Qwen3-VL's blocks)."""

    def __init__(self, width: int, heads: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = Qwen2VisionAttention(width, heads)
        self.mlp = VisionMLP(width, intermediate, activation)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Each merge × merge block of patches (consecutive rows here), normed, folded into one language token."""

    def __init__(self, width: int, merge: int, out: int, norm: nn.Module) -> None:
        super().__init__()
        folded = self.width = width * merge**2
        self.ln_q = norm
        self.mlp = nn.Sequential(nn.Linear(folded, folded), nn.GELU(), nn.Linear(folded, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class PatchEmbed(nn.Module):
    def __init__(self, config: Any, width: int, bias: bool = False) -> None:
        super().__init__()
        self.shape = (config.in_channels, config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, width, self.shape[1:], self.shape[1:], bias=bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(pixels.view(-1, *self.shape).to(self.proj.weight.dtype)).flatten(1)


class GridRotary(nn.Module):
    """The towers' 2-D rotary angles: a patch's row turns one half of each head's pairs, its column the other."""

    def __init__(self, config: Any, head_dim: int) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        half = head_dim // 2
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, half, 2).float() / half), persistent=False)

    def forward(self, t: int, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [t·h·w, head_dim] of each patch's (row, column), patches ordered block by merge × merge block."""
        m = self.merge
        rows = torch.arange(h, device=device)[:, None].expand(h, w).reshape(h // m, m, w // m, m)
        cols = torch.arange(w, device=device)[None, :].expand(h, w).reshape(h // m, m, w // m, m)
        rows, cols = rows.transpose(1, 2).flatten().repeat(t), cols.transpose(1, 2).flatten().repeat(t)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]  # a buffer
        freqs = torch.cat([rows[:, None].float() * inv_freq, cols[:, None].float() * inv_freq], dim=-1)
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos(), angles.sin()


class Qwen2VisionModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        width = config.embed_dim
        self.patch_embed = PatchEmbed(config, width)
        self.rotary = GridRotary(config, width // config.num_heads)
        self.blocks = nn.ModuleList(Qwen2VisionBlock(width, config.num_heads, int(width * config.mlp_ratio),
                                                     config.hidden_act) for _ in range(config.depth))
        self.merger = PatchMerger(width, config.spatial_merge_size, config.hidden_size, nn.LayerNorm(width, eps=1e-6))

    def forward(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """One image: pixel_values [t·h·w, C·T·P·P], grid [1, 3] (t, h, w) → [t·h·w / merge², hidden]."""
        t, h, w = (int(v) for v in grid[0])
        x = self.patch_embed(pixels)
        cos, sin = self.rotary(t, h, w, x.device)
        for block in self.blocks:
            x = block(x, cos, sin, [h * w] * t)  # attention within each frame (an image has one)
        return self.merger(x)


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    tower: type[nn.Module] = Qwen2VisionModel

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.visual = self.tower(hf_config.vision_config) if self.takes_images else None

    def make_rotary(self, hf_config: Any, head_dim: int) -> RotaryEmbedding:
        return MRotaryEmbedding(hf_config, head_dim)

    def encode_image(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        assert self.visual is not None  # the first stage's
        return self.visual(data["pixel_values"], data["image_grid_thw"])

    def targets(self, name: str) -> list[Target]:
        """The published names (model.layers…, visual…) and transformers 5's (model.language_model…, model.visual…)."""
        if name.startswith(("visual.", "model.visual.")):
            return [Target(name.removeprefix("model."))] if self.takes_images else []
        return super().targets(name.replace("model.language_model.", "model.", 1))
