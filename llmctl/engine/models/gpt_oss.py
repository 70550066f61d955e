"""gpt-oss (20B / 120B): Llama's decoder with biased q/k/v/o projections, YaRN rotary, attention sinks (a
learned logit per head that joins each softmax's denominator and weighs no value), layers alternating between
a 128-token sliding window and full attention (config.json's layer_types: two KV groups, the sliding one giving
back the blocks its window has passed), and a mixture of experts in every layer: a biased router whose top-k
logits are softmaxed — the same weights as softmax, top-k, renormalise — and experts with biases and a clamped
SwiGLU (llmctl.engine.layers.stacked_experts) — on GPUs kept in the published MXFP4 (llmctl.engine.layers.mxfp4_experts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.linear import LoadError, Part
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.mxfp4_experts import Mxfp4Experts
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.stacked_experts import ClampedSwigluExperts
from llmctl.engine.models.common import Shard, Target, layer_index
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM


class HeadSinks(nn.Module):
    """A rank's slice of the layer's per-head sink logits (kept in float32: they enter every softmax)."""

    def __init__(self, heads: Part, head_dim: int) -> None:
        super().__init__()
        self.first, self.count = heads.start // head_dim, heads.size // head_dim
        self.logits = nn.Parameter(torch.empty(self.count, dtype=torch.float32), requires_grad=False)

    def expected(self) -> set[tuple[str, int]]:
        return {("logits", 0)}

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        if len(tensor.shape) != 1:
            raise LoadError(f"{tensor.name}: sinks are one logit per head, not {tensor.shape}")
        with torch.no_grad():
            self.logits.copy_(tensor.read(0, self.first, self.first + self.count).float())


class GptOssAttention(LlamaAttention):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup,
                 window: int | None) -> None:
        super().__init__(spec, rotary, eps, group)
        att = spec.attention
        self.window = window
        self.sinks = HeadSinks(Part.split(att.num_heads * att.head_dim, group), att.head_dim)

    def sink_logits(self) -> torch.Tensor | None:
        return self.sinks.logits


class GptOssMoE(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard, mxfp4: bool = False) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None  # config_readers.read_moe reads num_local_experts
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=True)  # on every rank
        self.experts = (Mxfp4Experts if mxfp4 else ClampedSwigluExperts)(
            moe.num_experts, spec.hidden_size, moe.expert_intermediate_size, Routing(moe.top_k, renormalize=True),
            shard.group, shard.experts, alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
            limit=float(getattr(hf_config, "swiglu_limit", 7.0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x))


class GptOssForCausalLM(LlamaForCausalLM):
    supports_lora = False  # adapters on experts are not loaded yet

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        # quantization "mxfp4" (llmctl.engine.models.registry.layer_form): the experts kept MXFP4, all else dense
        self.mxfp4_experts = spec.quantization is not None and spec.quantization.method == "mxfp4"
        super().__init__(replace(spec, quantization=None) if self.mxfp4_experts else spec, hf_config, shard)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        att = self.spec.attention
        window = att.sliding_window if att.layer_types[index] == "sliding" else None
        attention = GptOssAttention(self.spec, rotary, eps, self.shard.group, window)
        return self.decoder_layer(self.spec, rotary, eps, self.shard.group, self.multipliers,
                                  GptOssMoE(self.spec, hf_config, self.shard, self.mxfp4_experts), attention)

    def targets(self, name: str) -> list[Target]:
        """Sinks into each attention's HeadSinks; experts' whole-layer tensors into the experts module."""
        layer = layer_index(name, "layers.")
        if layer is not None and name.endswith(".self_attn.sinks"):
            return [Target(f"layers.{layer}.self_attn.sinks.logits")] if layer in self.stage_layers else []
        return super().targets(name)
