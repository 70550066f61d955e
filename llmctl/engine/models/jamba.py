"""Jamba (`JambaForCausalLM`: Jamba 1.5/1.6/1.7 Mini and Large, Jamba Reasoning 3B): Mamba (1) layers whose dt, B
and C are RMS-normed with weights, attention without positional encoding on every attn_layer_period-th layer, and
after each a SwiGLU MLP or, every expert_layer_period-th layer, Mixtral-style experts (softmax top-k, weights not
renormalized). Checkpoint names: `mamba.*` / `self_attn.*`, `feed_forward.*` (`router`, `experts.N.*`),
`final_layernorm`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.mamba1 import Mamba1MixerSpec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.layers.mamba1_mixer import Mamba1Mixer
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext, Target
from llmctl.engine.models.granite_hybrid import NoPEAttention
from llmctl.engine.models.llama import LlamaMLP
from llmctl.engine.models.moe import MixtureOfExpertsForCausalLM, SparseMoeBlock


class JambaLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, shard: Any, mamba: bool,
                 mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.pre_ff_layernorm = RMSNorm(spec.hidden_size, eps)
        self.mamba: Mamba1Mixer | None = None
        if mamba:
            assert isinstance(spec.mixer, Mamba1MixerSpec)
            self.mamba = Mamba1Mixer(spec.mixer, shard.group, spec.quantization)
        else:
            self.self_attn = NoPEAttention(spec, rotary, eps, shard.group)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.mamba is not None:
            assert ctx.states is not None
            x = x + self.mamba(h, ctx.states, layer)
        else:
            x = x + self.self_attn(h, ctx, layer)
        return x + self.mlp(self.pre_ff_layernorm(x))


class JambaForCausalLM(MixtureOfExpertsForCausalLM):
    @staticmethod
    def routing_for(spec: ModelSpec, hf_config: Any) -> Routing:
        return Routing(spec.moe.top_k if spec.moe else 1, renormalize=False)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        spec, group = self.spec, self.shard.group
        sparse = spec.moe is not None and index in spec.moe.moe_layers
        mlp = SparseMoeBlock(spec, self.routing, group, self.shard.experts) if sparse else \
            LlamaMLP(spec.hidden_size, spec.intermediate_size, False, group, spec.quantization)
        mamba = spec.recurrent is not None and index in spec.recurrent.layers
        return JambaLayer(spec, rotary, eps, self.shard, mamba, mlp)

    def targets(self, name: str) -> list[Target]:
        name = name.replace(".feed_forward.router.", ".mlp.gate.").replace(".feed_forward.", ".mlp.")
        return super().targets(name.replace("model.final_layernorm.", "model.norm.", 1))
