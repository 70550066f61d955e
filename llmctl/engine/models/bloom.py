"""BLOOM: ALiBi positions, fused per-head QKV layout, LayerNorm after the embedding."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear, VocabParallelEmbedding
from llmctl.engine.layers.positions import alibi_slopes
from llmctl.engine.models.common import (
    Shard,
    StepContext,
    Target,
    embedding_targets,
    layer_index,
    load_checkpoint,
)


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation BLOOM was trained with (transformers' bloom_gelu_forward)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class BloomAttention(nn.Module):
    def __init__(self, spec: ModelSpec, group: TPGroup) -> None:
        super().__init__()
        heads, self.head_dim = spec.attention.num_heads, spec.attention.head_dim
        self.num_heads = heads // group.size
        first = group.rank * self.num_heads
        # query_key_value rows are [head][q, k, v][head_dim]: a rank's heads are one contiguous run of rows
        self.query_key_value = ColumnParallelLinear(spec.hidden_size, [Part.split(3 * spec.hidden_size, group)], True)
        self.dense = RowParallelLinear(Part.split(spec.hidden_size, group), spec.hidden_size, True, group)
        self.register_buffer("slopes", alibi_slopes(heads)[first:first + self.num_heads].contiguous(),
                             persistent=False)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        qkv = self.query_key_value(x).view(-1, self.num_heads, 3, self.head_dim)  # per head: q, k, v
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        out = ctx.backend.forward(q.contiguous(), k.contiguous(), v.contiguous(), ctx.kv_caches[layer],
                                  scale=self.scale, alibi_slopes=self.slopes)
        return self.dense(out.reshape(-1, self.num_heads * self.head_dim))


class BloomBlock(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float, residual_after_norm: bool, group: TPGroup) -> None:
        super().__init__()
        h = spec.hidden_size
        self.input_layernorm = nn.LayerNorm(h, eps=eps)
        self.self_attention = BloomAttention(spec, group)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
        inner = Part.split(spec.intermediate_size, group)
        self.dense_h_to_4h = ColumnParallelLinear(h, [inner], True)
        self.dense_4h_to_h = RowParallelLinear(inner, h, True, group)
        self.residual_after_norm = residual_after_norm

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        normed = self.input_layernorm(x)
        x = (normed if self.residual_after_norm else x) + self.self_attention(normed, ctx, layer)
        normed = self.post_attention_layernorm(x)
        residual = normed if self.residual_after_norm else x
        return residual + self.dense_4h_to_h(bloom_gelu(self.dense_h_to_4h(normed)))


class BloomForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__()
        shard = shard or Shard()
        self.spec, self.stage_layers = spec, shard.stage_layers(spec.num_layers)
        eps = float(getattr(hf_config, "layer_norm_epsilon", 1e-5))
        after = bool(getattr(hf_config, "apply_residual_connection_post_layernorm", False))
        h, group = spec.hidden_size, shard.group
        self.word_embeddings = VocabParallelEmbedding(spec.vocab_size, h, group) if shard.is_first else None
        self.word_embeddings_layernorm = nn.LayerNorm(h, eps=eps) if shard.is_first else None
        self.h = nn.ModuleList(BloomBlock(spec, eps, after, group) if i in self.stage_layers else nn.Identity()
                               for i in range(spec.num_layers))
        self.ln_f = nn.LayerNorm(h, eps=eps) if shard.is_last else None
        self.lm_head = None  # BLOOM ties its head to the embedding; a later stage keeps its own copy
        if shard.is_last:
            self.lm_head = self.word_embeddings or VocabParallelEmbedding(spec.vocab_size, h, group)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings_layernorm(self.word_embeddings(input_ids)) if self.word_embeddings is not None \
            else hidden
        for index in self.stage_layers:
            x = self.h[index](x, ctx, index)
        return self.ln_f(x) if self.ln_f is not None else x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def load_weights(self, tensors: Any) -> None:
        load_checkpoint(self, tensors, self.targets)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("transformer.")
        name = name.replace("self_attention.dense_h_to_4h", "dense_h_to_4h")
        name = name.replace("mlp.dense_h_to_4h", "dense_h_to_4h").replace("mlp.dense_4h_to_h", "dense_4h_to_h")
        layer = layer_index(name, "h.")
        if name.startswith("h.") and layer is not None and layer not in self.stage_layers:
            return []
        if name == "word_embeddings.weight":
            return embedding_targets(name, self.word_embeddings, self.lm_head, True)
        return [Target(name)]
