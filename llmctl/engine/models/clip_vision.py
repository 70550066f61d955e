"""CLIP's image tower (LLaVA's): patches of one fixed-size image plus a class token, learned positions, a
LayerNorm before the blocks. transformers' names: `vision_tower.vision_model.*` (its `pre_layrnorm` spelling
included)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.engine.models.vision_encoder import VisionEncoder


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.class_embedding = nn.Parameter(torch.empty(hidden))
        self.patch_embedding = nn.Conv2d(config.num_channels, hidden, config.patch_size, config.patch_size, bias=False)
        self.num_positions = (config.image_size // config.patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(self.num_positions, hidden)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(pixels.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class CLIPVisionModel(nn.Module):
    def __init__(self, config: Any, num_layers: int) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = VisionEncoder(config, num_layers)

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """transformers' hidden_states: after the pre-norm, then after each block run."""
        return self.encoder(self.pre_layrnorm(self.embeddings(pixels)))
