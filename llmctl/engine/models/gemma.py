"""Gemma 2 and Gemma 3 (text, and the language model of Gemma3ForConditionalGeneration: gemma3_vision).

Llama's projections with: embeddings × √hidden (rounded to the model's dtype, as transformers
does), RMSNorm scaled by (1 + weight), norms before *and* after attention and the MLP, GeGLU
(tanh GELU), the softmax scale 1/√query_pre_attn_scalar, and layers that alternate between a
sliding window and full attention. Gemma 2 soft-caps attention scores and final logits
(cap · tanh(x / cap)); Gemma 3 norms each head of q and k and gives its sliding and full layers
RoPE of their own (10k base locally, 1M — scaled in the larger models — globally).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.activations import gelu_tanh_and_mul
from llmctl.engine.layers.attention import soft_cap
from llmctl.engine.layers.linear import Part
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext, Target
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from llmctl.errors import UnsupportedModelError
from llmctl.kernels import cpu as cpu_kernels

TEXT_TOWER_PREFIXES = ("model.language_model.", "language_model.model.")  # transformers 5 and the original names
OTHER_TOWERS = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) · (1 + weight), in float32 before the cast back (transformers' Gemma order). A float32
    model on a CPU runs llmctl's fused RMSNorm with the weight 1 + w (the same products in float32)."""

    unit_offset = True

    def cpu_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and _fusable(x):
            return cpu_kernels.rms_norm(x, self.unit_offset_weight(), self.eps)
        return self.reference(x)

    def cpu_add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.float32 and _fusable(x) and _fusable(residual):
            return cpu_kernels.rms_norm(residual, self.unit_offset_weight(), self.eps, residual=x), residual
        total = x + residual
        return self.reference(total), total

    def unit_offset_weight(self) -> torch.Tensor:
        """1 + weight, made once the checkpoint's weight is in (finish_loading) or on first use."""
        if getattr(self, "_offset", None) is None or self._offset.device != self.weight.device:
            self._offset = (1.0 + self.weight.detach().float()).contiguous()
        return self._offset

    def finish_loading(self) -> None:
        self._offset = None

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(LlamaAttention):
    def qk_norms(self, q: Part, kv: Part, eps: float, group: TPGroup) -> tuple[nn.Module, nn.Module]:
        return GemmaRMSNorm(self.head_dim, eps), GemmaRMSNorm(self.head_dim, eps)  # Gemma 3: one per head


class GemmaMLP(LlamaMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x), self.intermediate))


def _fusable(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.is_contiguous() and cpu_kernels.fused_layers_for(x)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, model: GemmaForCausalLM, hf_config: Any, rotary: RotaryEmbedding, eps: float,
                 window: int | None) -> None:
        super().__init__()
        spec, group = model.spec, model.shard.group
        self.self_attn = GemmaAttention(spec, rotary, eps, group, scale=float(hf_config.query_pre_attn_scalar) ** -0.5)
        self.self_attn.window = window
        self.self_attn.softcap = getattr(hf_config, "attn_logit_softcapping", None)
        self.mlp = GemmaMLP(spec.hidden_size, spec.intermediate_size, False, group, spec.quantization)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(spec.hidden_size, eps))

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        attended = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx, layer))
        normed, x = self.pre_feedforward_layernorm.add_and_norm(attended, x)  # the residual add fused in
        return x + self.post_feedforward_layernorm(self.mlp(normed))


def text_config(hf_config: Any) -> Any:
    """Gemma3ForConditionalGeneration keeps the language model's settings under text_config."""
    return getattr(hf_config, "text_config", None) or hf_config


class GemmaForCausalLM(LlamaForCausalLM):
    def __init__(self, spec: Any, hf_config: Any, shard: Any = None) -> None:
        config = text_config(hf_config)
        activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
        if activation not in GELU_TANH:
            raise UnsupportedModelError(f"Gemma with hidden_activation={activation!r}: llmctl runs "
                                        f"{' / '.join(GELU_TANH)}")
        super().__init__(spec, config, shard)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        self.norm = GemmaRMSNorm(spec.hidden_size, self.norm.eps) if self.norm is not None else None

    def make_rotary(self, hf_config: Any, head_dim: int) -> RotaryEmbedding:
        """Gemma 3 keeps RoPE parameters per kind of layer; Gemma 2 one set for all."""
        per_kind = isinstance((getattr(hf_config, "rope_parameters", None) or {}).get("full_attention"), dict)
        self.rotaries = {kind: RotaryEmbedding(hf_config, head_dim, f"{kind}_attention" if per_kind else None)
                         for kind in ("full", "sliding")}
        return self.rotaries["full"]

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        att = self.spec.attention
        kind = att.layer_types[index] if att.layer_types else "full"
        window = att.sliding_window if kind == "sliding" else None
        return GemmaDecoderLayer(self, hf_config, self.rotaries[kind], eps, window)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.spec.hidden_size ** 0.5, dtype=x.dtype)  # the scale in the model's dtype

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        if ctx.input_embeds is not None:  # scaled text embeddings with the images' (unscaled) merged in
            hidden = ctx.input_embeds
        elif self.embed_tokens is not None:
            hidden = self.embed(input_ids)
        for index in self.stage_layers:
            hidden = self.layers[index](hidden, ctx, index)
        return self.norm(hidden) if self.norm is not None else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.logits(hidden)
        return soft_cap(logits, self.final_softcap) if self.final_softcap else logits

    def targets(self, name: str) -> list[Target]:
        if name.startswith(OTHER_TOWERS):
            return []  # served text-only: the vision tower and its projector stay on disk
        for prefix in TEXT_TOWER_PREFIXES:
            if name.startswith(prefix):
                name = "model." + name.removeprefix(prefix)
        if name == "lm_head.weight" and self.spec.tie_word_embeddings:
            return []
        return super().targets(name)
