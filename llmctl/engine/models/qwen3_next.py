"""Qwen3-Next (`Qwen3NextForCausalLM`): three layers in four are gated DeltaNet linear attention
(llmctl.engine.layers.gated_delta_net), the fourth attends — Qwen3's attention with QK-norm and a partial rotary,
where q_proj also gives a gate per head (each head's query, then its gate) and the output is σ(gate) · attention —
and every layer's MLP is Qwen2-MoE's: routed experts with a shared expert behind a sigmoid gate. Its RMSNorms scale
by (1 + weight), Gemma's form."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.delta_net import GatedDeltaNetSpec
from llmctl.checkpoint.fused_experts import per_expert
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.gated_delta_net import GatedDeltaNet
from llmctl.engine.layers.linear import ColumnParallelLinear, Part
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import Shard, StepContext, Target, load_checkpoint
from llmctl.engine.models.gemma import GemmaRMSNorm
from llmctl.engine.models.llama import LlamaAttention, LlamaMLP
from llmctl.engine.models.moe import MixtureOfExpertsForCausalLM, SparseMoeBlock

logger = logging.getLogger(__name__)
SKIPPED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")  # Qwen3.5's vision tower, its MTP layers


class GatedAttention(LlamaAttention):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup) -> None:
        super().__init__(spec, rotary, eps, group)
        att = spec.attention
        q = Part.split(2 * att.num_heads * att.head_dim, group)  # each head's query, then its gate
        kv = Part.kv_heads(att.num_kv_heads, att.head_dim, group)
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, [q, kv, kv], spec.layout.qkv_bias, spec.quantization)

    def qk_norms(self, q: Part, kv: Part, eps: float, group: TPGroup) -> tuple[nn.Module, nn.Module]:
        return GemmaRMSNorm(self.head_dim, eps), GemmaRMSNorm(self.head_dim, eps)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        query_gate, k, v = self.qkv_proj(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = query_gate.view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q.contiguous())
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim))
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if getattr(ctx.backend, "rotates_on_store", False):  # Triton: RoPE inside the KV store's launch
            cos, sin = self.rotary.cos_sin(ctx.positions, q.dtype, ctx.lengths)
            out = ctx.backend.forward_rotated(q, k, v, cos, sin, ctx.kv_caches[layer],  # type: ignore[attr-defined]
                                              scale=self.scale)
        else:
            q, k = self.rotary(ctx.positions, q, k, ctx.lengths)
            out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale)
        out = out.reshape(-1, self.q_size) * torch.sigmoid(gate.reshape(-1, self.q_size))
        return self.o_proj(out)


class Qwen3NextLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, shard: Shard, mlp: nn.Module,
                 linear: bool) -> None:
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(spec.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(spec.hidden_size, eps)
        if linear:
            assert isinstance(spec.mixer, GatedDeltaNetSpec)
            self.linear_attn = GatedDeltaNet(spec.mixer, eps, shard.group, spec.quantization)
        else:
            self.self_attn = GatedAttention(spec, rotary, eps, shard.group)
        self.linear = linear
        self.mlp = mlp

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.linear:
            assert ctx.states is not None
            h = self.linear_attn(h, ctx.states, layer)
        else:
            h = self.self_attn(h, ctx, layer)
        mixed, x = self.post_attention_layernorm.add_and_norm(h, x)
        return x + self.mlp(mixed)


class Qwen3NextForCausalLM(MixtureOfExpertsForCausalLM):
    """Also Qwen3.5 (dense, `Qwen3_5ForCausalLM`, and MoE) — its DeltaNet projects q·k·v, z, b and a apart — and the
    published multimodal Qwen3.5 checkpoints, served text-only (said at load), their experts whole-layer tensors."""

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        text = getattr(hf_config, "text_config", None)
        if text is not None:
            logger.warning("%s: served text-only — llmctl does not build Qwen3.5's vision tower yet, so requests "
                           "with images are refused", (spec.architectures or ["Qwen3.5"])[0])
        super().__init__(spec, text or hf_config, shard)
        if self.norm is not None:
            self.norm = GemmaRMSNorm(spec.hidden_size, self.norm.eps)

    @staticmethod
    def routing_for(spec: ModelSpec, hf_config: Any) -> Routing:
        return MixtureOfExpertsForCausalLM.routing_for(spec, hf_config) if spec.moe else Routing(1, False)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        assert self.spec.recurrent is not None
        sparse = self.spec.moe is not None and index in self.spec.moe.moe_layers
        mlp = SparseMoeBlock(self.spec, self.routing, self.shard.group, self.shard.experts) if sparse else \
            LlamaMLP(self.spec.hidden_size, self.spec.intermediate_size, False, self.shard.group,
                     self.spec.quantization)
        return Qwen3NextLayer(self.spec, rotary, eps, self.shard, mlp, index in self.spec.recurrent.layers)

    def load_weights(self, tensors: Any) -> None:
        load_checkpoint(self, per_expert(tensors), self.targets)

    def targets(self, name: str) -> list[Target]:
        """The attention's q_proj holds q and the gate (one part); the DeltaNet's tensors by their own names; a
        multimodal checkpoint's language model by its own names, its vision tower and MTP layers left on disk."""
        if name.startswith(SKIPPED_PREFIXES):
            return []
        name = name.replace("model.language_model.", "model.", 1)
        if ".self_attn.q_proj." in name:
            short = name.removeprefix("model.")
            return [Target(short.replace(".q_proj.", ".qkv_proj."), 0)]
        if ".linear_attn." in name:
            return [Target(name.removeprefix("model."))]
        return super().targets(name)
