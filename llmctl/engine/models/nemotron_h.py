"""Nemotron-H (`NemotronHForCausalLM`: Nemotron-H 8B/47B/56B, Nemotron Nano 9B/12B v2, Nemotron 3 Nano): a stack of
single blocks, each behind its own RMSNorm and residual — a Mamba2 mixer ("M"), NoPE GQA attention ("*"), a
squared-ReLU MLP ("-"), or squared-ReLU experts routed as DeepSeek-V3's (sigmoid, correction bias, groups) beside a
shared expert ("E"), in a narrower latent where `moe_latent_size` says so. Checkpoints name every block
`backbone.layers.N.mixer.*`, whatever its kind; multi-token-prediction layers (`mtp.*`) are skipped."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.mamba2_mixer import Mamba2Mixer
from llmctl.engine.layers.moe import Routing
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.squared_relu import SquaredReluExperts, SquaredReluMLP
from llmctl.engine.models.common import StepContext, Target, layer_index
from llmctl.engine.models.deepseek import Router
from llmctl.engine.models.granite_hybrid import NoPEAttention
from llmctl.engine.models.llama import LlamaForCausalLM


class NemotronHMoE(nn.Module):
    def __init__(self, spec: ModelSpec, routing: Routing, group: TPGroup, experts: ExpertPlacement | None) -> None:
        super().__init__()
        moe, hidden, bias = spec.moe, spec.hidden_size, spec.layout.mlp_bias
        assert moe is not None
        latent = moe.latent_size
        self.gate = Router(hidden, moe.num_experts, correction_bias=True)
        self.experts = SquaredReluExperts(moe.num_experts, latent or hidden, moe.expert_intermediate_size, routing,
                                          group, experts)
        self.shared_experts = SquaredReluMLP(hidden, moe.shared_expert_intermediate_size, bias, group) \
            if moe.num_shared_experts else None
        # the latent projections are small: every rank holds them whole, around the experts' all-reduce
        self.fc1_latent_proj = nn.Linear(hidden, latent, bias=bias) if latent else None
        self.fc2_latent_proj = nn.Linear(latent, hidden, bias=bias) if latent else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        out = self.experts(routed, self.gate(x), self.gate.e_score_correction_bias)
        if self.fc2_latent_proj is not None:
            out = self.fc2_latent_proj(out)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class NemotronHBlock(nn.Module):
    def __init__(self, kind: str, mixer: nn.Module, hidden: int, eps: float) -> None:
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(hidden, eps)
        self.mixer = mixer

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == "mamba":
            assert ctx.states is not None
            return x + self.mixer(h, ctx.states, layer)
        return x + (self.mixer(h, ctx, layer) if self.kind == "attention" else self.mixer(h))


class NemotronHForCausalLM(LlamaForCausalLM):
    supports_lora = False  # PEFT's targets in the Mamba blocks (in_proj, out_proj) have no LoRA slots

    def __init__(self, spec: ModelSpec, hf_config: Any, shard=None) -> None:
        self.routing = Routing(spec.moe.top_k if spec.moe else 1, bool(getattr(hf_config, "norm_topk_prob", True)),
                               scoring="sigmoid", num_groups=int(getattr(hf_config, "n_group", None) or 1),
                               topk_groups=int(getattr(hf_config, "topk_group", None) or 1), group_score="top2",
                               scaling=float(getattr(hf_config, "routed_scaling_factor", None) or 1.0))
        super().__init__(spec, hf_config, shard)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        spec, group = self.spec, self.shard.group
        assert spec.layout.blocks is not None
        kind = spec.layout.blocks[index]
        mixer: nn.Module
        if kind == "mamba":
            assert isinstance(spec.mixer, Mamba2MixerSpec)
            mixer = Mamba2Mixer(spec.mixer, eps, group, spec.quantization)
        elif kind == "attention":
            mixer = NoPEAttention(spec, rotary, eps, group)
        elif kind == "mlp":
            mixer = SquaredReluMLP(spec.hidden_size, spec.intermediate_size, spec.layout.mlp_bias, group,
                                   spec.quantization)
        else:
            mixer = NemotronHMoE(spec, self.routing, group, self.shard.experts)
        return NemotronHBlock(kind, mixer, spec.hidden_size, eps)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("backbone.")
        if name.startswith("mtp."):
            return []
        name = name.replace("embeddings.", "embed_tokens.", 1) if name.startswith("embeddings.") else \
            name.replace("norm_f.", "norm.", 1) if name.startswith("norm_f.") else name
        layer = layer_index(name, "layers.")
        if layer is None or layer not in self.stage_layers:
            return super().targets(name)
        assert self.spec.layout.blocks is not None
        kind = self.spec.layout.blocks[layer]
        if kind == "attention":  # q, k, v into qkv_proj
            return super().targets(name)
        if kind == "moe" and ".mixer.experts." in name:
            expert, projection, suffix = name.split(".mixer.experts.", 1)[1].split(".")
            moe = self.layers[layer].mixer
            assert isinstance(moe, NemotronHMoE)
            if suffix != "weight" or not moe.experts.holds(int(expert)):
                return []  # expert parallel: another rank's expert
            stacked = {"up_proj": "w13", "down_proj": "w2"}[projection]
            return [Target(f"layers.{layer}.mixer.experts.{stacked}", int(expert))]
        return [Target(name)]
