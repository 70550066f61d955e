"""Llama 4 text (`Llama4ForCausalLM`, Scout / Maverick's language model): Llama's decoder where
- three layers in four (`no_rope_layers`) rotate q and k — in interleaved pairs, the complex form Meta's code
  uses — then L2-normalize them without weights (`use_qk_norm`), and attend within aligned chunks of
  `attention_chunk_size` tokens (a KV group of its own that gives back what lies before the window);
- every fourth layer has no rotary, full attention, and scales q by log1p(⌊(p + 1) / floor_scale⌋) · attn_scale
  + 1 (`attn_temperature_tuning`);
- MoE layers (`moe_layers`, interleaved with dense ones of `intermediate_size_mlp`) route each token to its
  top-k experts by sigmoid(logit), weigh the expert's *input* by it, and add a shared expert.
The pairs are rotated as llmctl's rotate-half RoPE after q and k are permuted within each head (even dimensions
first): the same dot products, since q and k move alike, and the same norms.

The published checkpoints are `Llama4ForConditionalGeneration`: the language model under text_config and
`language_model.`, beside a vision tower that is not built yet — they are served text-only (said at load)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.stacked_experts import StackedExperts
from llmctl.engine.models.common import Shard, StepContext, Target
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP

logger = logging.getLogger(__name__)
LANGUAGE_PREFIXES = ("language_model.", "model.language_model.")  # as published, and as transformers 5 writes it
VISION_PREFIXES = ("vision_model.", "multi_modal_projector.", "model.vision_model.", "model.multi_modal_projector.")


def halves_first(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, heads · D] -> [T, heads, D] with each head's even dimensions first, then its odd ones."""
    pairs = x.unflatten(-1, (-1, head_dim // 2, 2))
    return pairs.transpose(-1, -2).flatten(-2)


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4Attention(LlamaAttention):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup, hf_config: Any,
                 index: int) -> None:
        super().__init__(spec, rotary, eps, group)
        self.eps = eps
        self.rotates = bool(hf_config.no_rope_layers[index])
        self.l2_norm = self.rotates and bool(hf_config.use_qk_norm)
        self.chunk = int(hf_config.attention_chunk_size) if spec.attention.layer_types[index] == "sliding" else None
        tuned = not self.rotates and bool(getattr(hf_config, "attn_temperature_tuning", False))
        self.temperature = (float(hf_config.floor_scale), float(hf_config.attn_scale)) if tuned else None

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.rotates:
            q, k = self.rotary(ctx.positions, halves_first(q, self.head_dim), halves_first(k, self.head_dim),
                               ctx.lengths)
            if self.l2_norm:
                q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        else:
            q, k = q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim)
        if self.temperature is not None:
            floor_scale, attn_scale = self.temperature
            scales = torch.log1p(torch.floor((ctx.positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
            q = (q.float() * scales.view(-1, 1, 1)).to(q.dtype)
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale, chunk=self.chunk)
        return self.o_proj(out.reshape(-1, self.q_size))


class Llama4MoE(nn.Module):
    def __init__(self, spec: ModelSpec, shard: Shard) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None  # config_readers.read_moe reads a llama4_text config's experts
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)  # on every rank
        self.experts = StackedExperts(moe.num_experts, spec.hidden_size, moe.expert_intermediate_size,
                                      Routing(moe.top_k, renormalize=False, scoring="sigmoid"), shard.group,
                                      shard.experts, scale_inputs=True)
        self.shared_expert = LlamaMLP(spec.hidden_size, moe.shared_expert_intermediate_size, False, shard.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared_expert(x) + self.experts(x, self.router(x))


class Llama4ForCausalLM(LlamaForCausalLM):
    supports_lora = False  # adapters on experts are not loaded yet

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        text = getattr(hf_config, "text_config", None)
        if text is not None:
            logger.warning("%s: served text-only — llmctl does not build Llama 4's vision tower yet, so requests "
                           "with images are refused", (spec.architectures or ["Llama 4"])[0])
        super().__init__(spec, text or hf_config, shard)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        assert self.spec.moe is not None
        attention = Llama4Attention(self.spec, rotary, eps, self.shard.group, hf_config, index)
        mlp = Llama4MoE(self.spec, self.shard) if index in self.spec.moe.moe_layers else None
        return self.decoder_layer(self.spec, rotary, eps, self.shard.group, self.multipliers, mlp, attention)

    def targets(self, name: str) -> list[Target]:
        """Meta's feed_forward is our mlp; a multimodal checkpoint's language model by its own names, its vision
        tower left on disk; the rest as Llama's."""
        if name.startswith(VISION_PREFIXES):
            return []
        for prefix in LANGUAGE_PREFIXES:
            if name.startswith(prefix):
                name = name.removeprefix(prefix)
                name = name if name.startswith(("model.", "lm_head.")) else f"model.{name}"
                break
        return super().targets(name.replace(".feed_forward.", ".mlp."))
