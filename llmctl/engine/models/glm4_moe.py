"""GLM-4.5 / 4.6 (`glm4_moe`): Llama's attention — biased q/k/v projections, an optional QK-norm before a
partial rotary (rotate-half on the first partial_rotary_factor of each head) — with DeepSeek-V3's experts:
sigmoid scores chosen with the router's e_score_correction_bias and weighed without it, limited to the
topk_group best of n_group groups (scored by their two best experts), renormalised where norm_topk_prob is
set, × routed_scaling_factor, beside shared experts; the first `first_k_dense_replace` layers are dense."""

from __future__ import annotations

from typing import Any

from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import Target, layer_index
from llmctl.engine.models.deepseek import DeepseekMoE
from llmctl.engine.models.moe import MixtureOfExpertsForCausalLM


class Glm4MoeForCausalLM(MixtureOfExpertsForCausalLM):
    @staticmethod
    def routing_for(spec: ModelSpec, hf_config: Any) -> Routing:
        assert spec.moe is not None  # config_readers.read_moe reads a glm4_moe config's experts
        return Routing(spec.moe.top_k, bool(getattr(hf_config, "norm_topk_prob", True)), scoring="sigmoid",
                       num_groups=int(getattr(hf_config, "n_group", None) or 1),
                       topk_groups=int(getattr(hf_config, "topk_group", None) or 1), group_score="top2",
                       scaling=float(getattr(hf_config, "routed_scaling_factor", None) or 1.0))

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        assert self.spec.moe is not None
        mlp = DeepseekMoE(self.spec, self.routing, self.shard.group, self.shard.experts) \
            if index in self.spec.moe.moe_layers else None
        return self.decoder_layer(self.spec, rotary, eps, self.shard.group, self.multipliers, mlp)

    def targets(self, name: str) -> list[Target]:
        """The router's weight and correction bias by their own names; the rest as the MoE families'."""
        if ".mlp.gate." in name:
            layer = layer_index(name, "layers.")
            return [Target(name.removeprefix("model."))] if layer in self.stage_layers else []
        return super().targets(name)
