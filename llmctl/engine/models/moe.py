"""Mixture-of-experts families on Llama's attention: Mixtral, Qwen2-MoE (a shared expert behind a
sigmoid gate; dense and sparse layers by `decoder_sparse_step` / `mlp_only_layers`) and Qwen3-MoE
(QK-norm, read from the config as for dense Qwen3). The routed experts are llmctl.engine.layers.moe."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.activation_quant import dynamic_activations_of
from llmctl.engine.layers.coded_experts import CODED_FIELDS, coded_experts_method
from llmctl.engine.layers.moe import FusedMoE, Routing
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import Target, layer_index
from llmctl.engine.models.llama import LlamaForCausalLM, LlamaMLP

# checkpoint name of an expert's projection -> (stacked parameter, part offset within the expert)
EXPERT_PROJECTIONS = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", 0),  # Mixtral
                      "gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}  # Qwen


class SparseMoeBlock(nn.Module):
    """Router, routed experts, and (Qwen2-MoE) a shared expert every token goes through."""

    def __init__(self, spec: ModelSpec, routing: Routing, group: TPGroup, experts: ExpertPlacement | None = None) -> None:
        super().__init__()
        moe = spec.moe
        self.gate = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)  # the router, on every rank
        self.experts = FusedMoE(moe.num_experts, spec.hidden_size, moe.expert_intermediate_size, routing, group,
                                experts, coded_experts_method(spec.quantization),
                                dynamic_activations_of(spec.quantization))
        self.shared_expert = LlamaMLP(spec.hidden_size, moe.shared_expert_intermediate_size, False, group,
                                      spec.quantization) if moe.num_shared_experts else None
        self.shared_expert_gate = nn.Linear(spec.hidden_size, 1, bias=False) if moe.shared_expert_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


class MixtureOfExpertsForCausalLM(LlamaForCausalLM):
    supports_lora = False  # adapters on experts are not loaded yet

    def __init__(self, spec: ModelSpec, hf_config: Any, shard=None) -> None:
        self.routing = self.routing_for(spec, hf_config)
        super().__init__(spec, hf_config, shard)

    @staticmethod
    def routing_for(spec: ModelSpec, hf_config: Any) -> Routing:
        """Mixtral always renormalises its top-k; Qwen does when norm_topk_prob is set."""
        return Routing(spec.moe.top_k, bool(getattr(hf_config, "norm_topk_prob", True)))

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        sparse = index in self.spec.moe.moe_layers
        mlp = SparseMoeBlock(self.spec, self.routing, self.shard.group, self.shard.experts) if sparse else None
        return self.decoder_layer(self.spec, rotary, eps, self.shard.group, self.multipliers, mlp)

    def targets(self, name: str) -> list[Target]:
        """Experts' per-expert tensors into the stacked ones; Mixtral's block_sparse_moe is our mlp."""
        name = name.replace(".block_sparse_moe.", ".mlp.")
        layer = layer_index(name, "layers.")
        if layer is not None and ".mlp.experts." in name:
            if layer not in self.stage_layers:
                return []
            prefix, rest = name.removeprefix("model.").split(".mlp.experts.", 1)
            expert, projection, kind = rest.split(".")
            stacked, slot = EXPERT_PROJECTIONS[projection]
            part = 2 * int(expert) + slot if stacked == "w13" else int(expert)
            if kind not in ("weight", *CODED_FIELDS) or not self.layers[layer].mlp.experts.holds(int(expert)):
                return []  # expert parallel: another rank's expert
            suffix = "" if kind == "weight" else f"_{kind}"  # codes, scales, offsets: experts kept coded
            return [Target(f"{prefix}.mlp.experts.{stacked}{suffix}", part)]
        return super().targets(name)
