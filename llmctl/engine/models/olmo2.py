"""OLMo 2: Llama's attention and MLP, with each block's output normed before the residual add
(no norm on the block's input) and RMSNorm over the whole q and k projections, not per head."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.linear import Part
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, Multipliers


class ProjectionRMSNorm(nn.Module):
    """RMSNorm over a projection TP splits: this rank holds `part` of it, so the sum of squares is
    reduced over the group (each K head counted once where TP replicates it)."""

    def __init__(self, part: Part, eps: float, group: TPGroup, replicas: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(part.total))  # small: every rank keeps the whole vector
        self.part, self.eps, self.group, self.replicas = part, eps, group, replicas

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        squares = x.pow(2).sum(-1, keepdim=True)
        if self.group.size > 1:
            squares = self.group.all_reduce(squares) / self.replicas
        x = x * torch.rsqrt(squares / self.part.total + self.eps)
        return (self.weight[self.part.start:self.part.start + self.part.size] * x).to(dtype)


class Olmo2Attention(LlamaAttention):
    def qk_norms(self, q: Part, kv: Part, eps: float, group: TPGroup) -> tuple[nn.Module, nn.Module]:
        kv_replicas = max(1, group.size // (kv.total // self.head_dim))
        return ProjectionRMSNorm(q, eps, group, 1), ProjectionRMSNorm(kv, eps, group, kv_replicas)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup,
                 multipliers: Multipliers = Multipliers()) -> None:
        super().__init__()
        self.self_attn = Olmo2Attention(spec, rotary, eps, group)
        self.mlp = LlamaMLP(spec.hidden_size, spec.intermediate_size, spec.layout.mlp_bias, group, spec.quantization)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(spec.hidden_size, eps)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(x, ctx, layer))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Olmo2DecoderLayer
