"""The transformer blocks of the ViT image towers (CLIP, SigLIP): pre-norm attention over every patch of
one image, then an MLP. Replicated on every rank: a tower is small next to its language model."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def vision_activation(name: str) -> Any:
    """The towers' activations by their transformers names."""
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"vision tower activation {name!r} is not implemented")


class VisionAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [images, patches, hidden]; mask: [images, 1, patches, patches] additive, or None."""
        shape = (x.shape[0], x.shape[1], self.heads, self.head_dim)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(self.head_dim))
        return self.out_proj(out.transpose(1, 2).flatten(2))


class VisionMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.act = vision_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.self_attn = VisionAttention(hidden, config.num_attention_heads)
        self.mlp = VisionMLP(hidden, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    """transformers' `encoder.layers.N` of a CLIP or SigLIP tower; `num_layers` may stop early (LLaVA takes the
    hidden states of a layer before the last)."""

    def __init__(self, config: Any, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Every hidden state, the input's first (transformers' `hidden_states`)."""
        states = [x]
        for layer in self.layers:
            states.append(layer(states[-1], mask))
        return states
