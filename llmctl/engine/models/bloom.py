"""BLOOM: ALiBi positions, fused per-head QKV layout, LayerNorm after the embedding."""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from llmctl.engine.layers.positions import alibi_slopes
from llmctl.engine.models.common import StepContext, WeightMismatchError, load_into
from llmctl.model.spec import ModelSpec


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation BLOOM was trained with (transformers' bloom_gelu_forward)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class BloomAttention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.head_dim = spec.attention.num_heads, spec.attention.head_dim
        self.query_key_value = nn.Linear(spec.hidden_size, 3 * spec.hidden_size)
        self.dense = nn.Linear(spec.hidden_size, spec.hidden_size)
        self.register_buffer("slopes", alibi_slopes(self.num_heads), persistent=False)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        qkv = self.query_key_value(x).view(-1, self.num_heads, 3, self.head_dim)  # per head: q, k, v
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        out = ctx.backend.forward(q.contiguous(), k.contiguous(), v.contiguous(), ctx.kv_caches[layer],
                                  scale=self.scale, alibi_slopes=self.slopes)
        return self.dense(out.reshape(-1, self.num_heads * self.head_dim))


class BloomBlock(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float, residual_after_norm: bool) -> None:
        super().__init__()
        h = spec.hidden_size
        self.input_layernorm = nn.LayerNorm(h, eps=eps)
        self.self_attention = BloomAttention(spec)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
        self.dense_h_to_4h = nn.Linear(h, spec.intermediate_size)
        self.dense_4h_to_h = nn.Linear(spec.intermediate_size, h)
        self.residual_after_norm = residual_after_norm

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        normed = self.input_layernorm(x)
        x = (normed if self.residual_after_norm else x) + self.self_attention(normed, ctx, layer)
        normed = self.post_attention_layernorm(x)
        residual = normed if self.residual_after_norm else x
        return residual + self.dense_4h_to_h(bloom_gelu(self.dense_h_to_4h(normed)))


class BloomForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any) -> None:
        super().__init__()
        self.spec = spec
        eps = float(getattr(hf_config, "layer_norm_epsilon", 1e-5))
        after = bool(getattr(hf_config, "apply_residual_connection_post_layernorm", False))
        self.word_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.word_embeddings_layernorm = nn.LayerNorm(spec.hidden_size, eps=eps)
        self.h = nn.ModuleList(BloomBlock(spec, eps, after) for _ in range(spec.num_layers))
        self.ln_f = nn.LayerNorm(spec.hidden_size, eps=eps)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.word_embeddings_layernorm(self.word_embeddings(input_ids))
        for index, block in enumerate(self.h):
            x = block(x, ctx, index)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.word_embeddings.weight.t()  # BLOOM ties its head to the embedding

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        renamed = []
        for name, tensor in tensors:
            name = name.removeprefix("transformer.")
            name = name.replace("self_attention.dense_h_to_4h", "dense_h_to_4h")
            name = name.replace("mlp.dense_h_to_4h", "dense_h_to_4h").replace("mlp.dense_4h_to_h", "dense_4h_to_h")
            renamed.append((name, tensor))
        loaded = load_into(self, renamed)
        missing = {n for n, _ in self.named_parameters()} - loaded
        if missing:
            raise WeightMismatchError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
