"""DeepSeek-V2 / V2-Lite / V3: multi-head latent attention (MLA) and routed experts beside shared ones.

Attention keeps one latent per token (llmctl.engine.layers.mla_attention): kv_a_proj_with_mqa gives the
KV latent c (normalised) and a RoPE key shared by every head; kv_b_proj is never run as a linear — its
key rows W_UK fold into the query (q_nope · W_UK) and its value rows W_UV map the attended latent to each
head's value, so decode reads only the latent. YaRN scaling comes from transformers' own RoPE functions;
its mscale_all_dim enters the softmax scale as transformers and DeepSeek apply it.

The first `first_k_dense_replace` layers have a dense MLP. The others route each token to top-k experts
(llmctl.engine.layers.moe): V2 by softmax, limited to the topk_group best groups (group_limited_greedy);
V3 by sigmoid, choosing with e_score_correction_bias but weighing without it, groups scored by their two
best experts; both × routed_scaling_factor. V3's multi-token-prediction layers are not run (they are
skipped when loading; speculation with them is future work)."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.activation_quant import dynamic_activations_of
from llmctl.engine.layers.coded_experts import coded_experts_method
from llmctl.engine.layers.linear import ColumnParallelLinear, LoadError, Part, RowParallelLinear
from llmctl.engine.layers.moe import FusedMoE, Routing
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext, Target, layer_index
from llmctl.engine.models.llama import LlamaMLP
from llmctl.engine.models.moe import MixtureOfExpertsForCausalLM

logger = logging.getLogger("llmctl.engine")
LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: DeepSeek's default, not rms_norm_eps


def mla_softmax_scale(hf_config: Any, qk_head_dim: int) -> float:
    """1/√qk_head_dim, × mscale² under YaRN with mscale_all_dim (transformers' yarn_apply_mscale)."""
    scale = qk_head_dim ** -0.5
    params = getattr(hf_config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        factor = float(params["factor"])
        mscale = 0.1 * float(params["mscale_all_dim"]) * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= mscale * mscale
    return scale


def _whole(size: int) -> list[Part]:
    """Every row on every rank: the down-projections into the latents are replicated."""
    return [Part(size, 0, size)]


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any, rotary: RotaryEmbedding, group: TPGroup) -> None:
        super().__init__()
        att, hidden = spec.attention, spec.hidden_size
        self.nope, self.rope, self.v_dim = att.qk_nope_head_dim or 0, att.qk_rope_head_dim or 0, att.v_head_dim or 0
        self.latent = att.kv_lora_rank or 0
        self.num_heads = att.num_heads // group.size
        qk = self.nope + self.rope
        bias = bool(getattr(hf_config, "attention_bias", False))
        self.q_lora = bool(att.q_lora_rank)
        if self.q_lora:
            self.q_a_proj = ColumnParallelLinear(hidden, _whole(att.q_lora_rank), bias)
            self.q_a_layernorm = RMSNorm(att.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(att.q_lora_rank, [Part.split(att.num_heads * qk, group)], False)
        else:
            self.q_proj = ColumnParallelLinear(hidden, [Part.split(att.num_heads * qk, group)], False)
        self.kv_a_proj_with_mqa = ColumnParallelLinear(hidden, _whole(self.latent + self.rope), bias)
        self.kv_a_layernorm = RMSNorm(self.latent, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(self.latent, [Part.split(att.num_heads * (self.nope + self.v_dim),
                                                                       group)], False, read_only=True)
        self.o_proj = RowParallelLinear(Part.split(att.num_heads * self.v_dim, group), hidden, bias, group)
        self.rotary = rotary
        # V2 rotates pairs (x0, x1), (x2, x3)…; V3 too when rope_interleave (its default)
        self.interleaved = spec.model_type == "deepseek_v2" or bool(getattr(hf_config, "rope_interleave", False))
        self.scale = mla_softmax_scale(hf_config, qk)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q_nope, q_rope = q.view(-1, self.num_heads, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.latent, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())
        q_rope, k_rope = self._rotate(ctx.positions, q_rope, k_rope.unsqueeze(1))
        entries = torch.cat([latent, k_rope.squeeze(1)], dim=-1)  # what the cache keeps: [T, latent + rope]
        w_uk, w_uv = self._absorbed()
        query = torch.cat([torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_rope], dim=-1)
        attended = ctx.backend.attend_latent(query, entries, ctx.kv_caches[layer], scale=self.scale,
                                             latent_dim=self.latent)  # [T, H, latent]
        out = torch.bmm(attended.transpose(0, 1), w_uv)  # [H, T, v]
        return self.o_proj(out.transpose(0, 1).reshape(-1, self.num_heads * self.v_dim))

    def _absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj as W_UK [H, nope, latent] and W_UVᵀ [H, latent, v]: views of its weight, no copies."""
        weight = self.kv_b_proj.inner.weight.view(self.num_heads, self.nope + self.v_dim, self.latent)
        return weight[:, :self.nope], weight[:, self.nope:].transpose(1, 2)

    def _rotate(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Interleaved pairs as rotate-half over (evens, odds): the scores q·k do not depend on the order."""
        if self.interleaved:
            q = torch.cat([q[..., 0::2], q[..., 1::2]], dim=-1)
            k = torch.cat([k[..., 0::2], k[..., 1::2]], dim=-1)
        return self.rotary(positions, q.contiguous(), k.contiguous())


class Router(nn.Module):
    """The gate: float32 logits over the experts, and V3's correction bias (a buffer: plan counts it apart
    from the weights, as transformers keeps it)."""

    def __init__(self, hidden: int, experts: int, correction_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden), requires_grad=False)
        self.register_buffer("e_score_correction_bias", torch.zeros(experts) if correction_bias else None)

    def expected(self) -> set[tuple[str, int]]:
        return {("weight", 0)} | ({("e_score_correction_bias", 0)} if self.e_score_correction_bias is not None
                                  else set())

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        target = self.weight if kind == "weight" else self.e_score_correction_bias
        if target is None or tuple(tensor.shape) != tuple(target.shape):
            raise LoadError(f"{tensor.name}: checkpoint shape {tuple(tensor.shape)}, the router expects "
                            f"{None if target is None else tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor.read())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float())


class DeepseekMoE(nn.Module):
    def __init__(self, spec: ModelSpec, routing: Routing, group: TPGroup, experts: ExpertPlacement | None) -> None:
        super().__init__()
        moe = spec.moe
        self.gate = Router(spec.hidden_size, moe.num_experts, moe.router_bias)
        self.experts = FusedMoE(moe.num_experts, spec.hidden_size, moe.expert_intermediate_size, routing, group,
                                experts, coded_experts_method(spec.quantization),
                                dynamic_activations_of(spec.quantization))
        self.shared_experts = LlamaMLP(spec.hidden_size, moe.shared_expert_intermediate_size, False, group) \
            if moe.num_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x), self.gate.e_score_correction_bias)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class DeepseekForCausalLM(MixtureOfExpertsForCausalLM):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard=None) -> None:
        super().__init__(spec, hf_config, shard)
        if spec.mtp_layers and self.shard.is_first and self.shard.group.rank == 0:
            logger.info("config.json names %d multi-token-prediction layer(s): the model runs without them; "
                        "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}' drafts with the "
                        "first", spec.mtp_layers)

    @staticmethod
    def routing_for(spec: ModelSpec, hf_config: Any) -> Routing:
        v3 = spec.model_type == "deepseek_v3"
        grouped = v3 or getattr(hf_config, "topk_method", "greedy") == "group_limited_greedy"
        # V2: renormalised when norm_topk_prob is set, as DeepSeek's and vLLM's code do (transformers' port
        # never renormalises; V2 checkpoints set it false)
        return Routing(spec.moe.top_k, bool(getattr(hf_config, "norm_topk_prob", False)),
                       scoring="sigmoid" if v3 else "softmax",
                       num_groups=int(getattr(hf_config, "n_group", None) or 1) if grouped else 1,
                       topk_groups=int(getattr(hf_config, "topk_group", None) or 1),
                       group_score="top2" if v3 else "max",
                       scaling=float(getattr(hf_config, "routed_scaling_factor", None) or 1.0))

    def make_rotary(self, hf_config: Any, head_dim: int) -> RotaryEmbedding:
        return RotaryEmbedding(hf_config, self.spec.attention.qk_rope_head_dim)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        group = self.shard.group
        mlp = DeepseekMoE(self.spec, self.routing, group, self.shard.experts) \
            if index in self.spec.moe.moe_layers else None
        attention = MultiHeadLatentAttention(self.spec, hf_config, rotary, group)
        return self.decoder_layer(self.spec, rotary, eps, group, self.multipliers, mlp, attention)

    def targets(self, name: str) -> list[Target]:
        """Attention and router tensors by their own names (q_proj is not fused with k/v here)."""
        if ".self_attn." in name or ".mlp.gate." in name:
            layer = layer_index(name, "layers.")
            return [Target(name.removeprefix("model."))] if layer in self.stage_layers else []
        return super().targets(name)
