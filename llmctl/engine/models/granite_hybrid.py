"""Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Granite's multipliers around a stack where most layers are Mamba2
mixers and a few attend (`layer_types`), the attention without rotary where `position_embedding_type` is "nope"
(the published models) and RoPE otherwise; every layer's MLP is a shared SwiGLU (`shared_mlp.input_linear` holds
gate then up) plus, in the MoE sizes (H-Tiny, H-Small), top-k experts softmax-weighted over their logits, stored as
whole-layer tensors `input_linear` [E, 2I, H] and `output_linear` [E, H, I] (GraniteMoe's format)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.mamba2_mixer import Mamba2Mixer
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.stacked_experts import StackedExperts
from llmctl.engine.models.common import Shard, StepContext, Target, layer_index
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, Multipliers


class GraniteExperts(StackedExperts):
    kinds = ("input_linear", "output_linear")

    def _store(self, kind: str, ours: torch.Tensor) -> None:
        rows = slice(self.part.start, self.part.start + self.part.size)
        if kind == "input_linear":  # [e, 2I, H]: gate rows, then up rows
            gate, up = ours.chunk(2, dim=1)
            self.w13.copy_(torch.cat([gate[:, rows], up[:, rows]], dim=1))
        else:  # output_linear [e, H, I]
            self.w2.copy_(ours[:, :, rows])


class GraniteMoE(nn.Module):
    def __init__(self, spec: ModelSpec, shard: Shard) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)  # on every rank
        self.experts = GraniteExperts(moe.num_experts, spec.hidden_size, moe.expert_intermediate_size,
                                      Routing(moe.top_k, renormalize=True), shard.group, shard.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x))


class NoPEAttention(LlamaAttention):
    """Granite 4.0-H's attention: no rotary embedding at all (position_embedding_type "nope")."""

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = ctx.backend.forward(q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                                  v.view(-1, self.num_kv_heads, self.head_dim), ctx.kv_caches[layer], scale=self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))


class GraniteHybridLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup, multipliers: Multipliers,
                 hf_config: Any, mamba: bool, shard: Shard) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps)
        self.mamba = Mamba2Mixer(spec.mixer, eps, group, spec.quantization) \
            if mamba and isinstance(spec.mixer, Mamba2MixerSpec) else None
        if self.mamba is None:
            nope = getattr(hf_config, "position_embedding_type", None) != "rope"
            attention = NoPEAttention if nope else LlamaAttention
            self.self_attn = attention(spec, rotary, eps, group, multipliers.attention)
        self.shared_mlp = LlamaMLP(spec.hidden_size, int(hf_config.shared_intermediate_size), False, group)
        self.block_sparse_moe = GraniteMoE(spec, shard) if spec.moe is not None else None
        self.residual = multipliers.residual

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        h = self.input_layernorm(x)
        assert ctx.states is not None or self.mamba is None
        h = self.mamba(h, ctx.states, layer) if self.mamba is not None else self.self_attn(h, ctx, layer)
        x = x + h * self.residual
        h = self.post_attention_layernorm(x)
        out = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            out = out + self.block_sparse_moe(h)
        return x + out * self.residual


class GraniteMoeHybridForCausalLM(LlamaForCausalLM):
    supports_lora = False  # PEFT targets of the Mamba layers (in_proj, out_proj) have no LoRA slots

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        self.hf_shared_intermediate = int(hf_config.shared_intermediate_size)  # where up starts in input_linear
        mamba = self.spec.recurrent is not None and index in self.spec.recurrent.layers
        return GraniteHybridLayer(self.spec, rotary, eps, self.shard.group, self.multipliers, hf_config, mamba,
                                  self.shard)

    def targets(self, name: str) -> list[Target]:
        """GraniteMoe's names: shared_mlp.input_linear is gate then up; the experts are whole-layer tensors."""
        short = name.removeprefix("model.")
        layer = layer_index(short, "layers.")
        if layer is None or layer not in self.stage_layers:
            return super().targets(name)
        prefix = f"layers.{layer}."
        if ".shared_mlp.input_linear." in short:
            half = int(self.hf_shared_intermediate)
            path = prefix + "shared_mlp.gate_up_proj." + short.rsplit(".", 1)[1]
            return [Target(path, 0, 0), Target(path, 1, half)]
        if ".shared_mlp.output_linear." in short:
            return [Target(short.replace("output_linear", "down_proj"))]
        if ".block_sparse_moe.router.layer." in short:
            return [Target(short.replace("router.layer.", "router."))]
        if short.endswith(("block_sparse_moe.input_linear.weight", "block_sparse_moe.output_linear.weight")):
            kind = short.split(".")[-2]
            return [Target(prefix + "block_sparse_moe.experts." + kind)]
        return super().targets(name)
