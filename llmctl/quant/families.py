"""What the layer-by-layer calibration forward needs from each family llmctl quantize takes.

Llama, Mistral, Qwen2/3, Granite, OLMo 2 and Phi-3 run transformers' decoder layers with SDPA, a
causal mask by default and one RoPE table; Phi-3's fused qkv_proj and gate_up_proj are quantized
whole. Gemma 2/3 run them with eager attention (SDPA has no logit soft-cap),
so the causal mask — with each sliding layer's window — is given explicitly; Gemma 3 has one RoPE
table per kind of layer; Gemma's embeddings are scaled by √hidden and its norms scale by
(1 + weight), which AWQ's scale folding must respect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "granite", "gemma2", "gemma3_text", "olmo2", "phi3",
                   "mixtral", "qwen2_moe", "qwen3_moe")
GEMMA_TYPES = ("gemma2", "gemma3_text")
# AWQ folds its scales into the norm in front of q/k/v and gate/up; these families have none there
NO_AWQ = {"olmo2": "OLMo 2 norms each block's output, not its input, so AWQ has no norm to fold its scales into",
          **{moe: "AWQ's scale search over routed experts is not built (GPTQ quantizes them expert by expert)"
             for moe in ("mixtral", "qwen2_moe", "qwen3_moe")}}


LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# Qwen2-MoE's shared expert, beside the routed ones (llmctl.quant.moe_experts)
SHARED_EXPERT = ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")
# Phi-3 stores q/k/v and gate/up fused; they are quantized whole, as GPTQModel and AutoAWQ do
FUSED_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


# Multimodal checkpoints whose language model is quantized: these towers stay dense, and the quantization
# config names them so that vLLM and transformers build them unquantized
DENSE_TOWERS = {"gemma3": ("vision_tower", "multi_modal_projector")}


def language_model_prefix(names: Iterable[str]) -> str:
    """Where the decoder's tensors are: 'model.' in text models; Gemma 3's multimodal checkpoints say
    'language_model.model.' as published, 'model.language_model.' as transformers 5 writes them."""
    candidates = sorted(name.removesuffix("embed_tokens.weight") for name in names
                        if name.endswith("embed_tokens.weight"))
    if not candidates:
        raise ValueError("the checkpoint has no embed_tokens.weight")
    return min(candidates, key=len)


def quantized_linears(hf_config: Any, layer: nn.Module) -> tuple[str, ...]:
    """The linears of one decoder layer that are quantized, by their names in transformers' layer (a mixture of
    experts' layer: attention and any shared expert; its routed experts are llmctl.quant.moe_experts')."""
    if hf_config.model_type == "phi3":
        return FUSED_LINEARS
    return tuple(name for name in LINEARS + SHARED_EXPERT if _has_module(layer, name))


def _has_module(layer: nn.Module, dotted: str) -> bool:
    for part in dotted.split("."):
        layer = getattr(layer, part, None)
        if layer is None:
            return False
    return isinstance(layer, nn.Linear)


def is_gemma(hf_config: Any) -> bool:
    return hf_config.model_type in GEMMA_TYPES


def attention_implementation(hf_config: Any) -> str:
    return "eager" if is_gemma(hf_config) else "sdpa"


def embedding_scale(hf_config: Any) -> float:
    """What the model multiplies its embeddings by before the first layer."""
    if is_gemma(hf_config):
        return float(hf_config.hidden_size) ** 0.5
    return float(getattr(hf_config, "embedding_multiplier", 1.0))  # Granite


def mlp_norm(layer: nn.Module) -> nn.Module:
    """The norm in front of the MLP's gate and up projections (Gemma has one of its own)."""
    return getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm


@dataclass
class LayerInputs:
    """Position embeddings and attention mask for each layer of the calibration forward."""

    hf_config: Any
    rotary: nn.Module
    positions: torch.Tensor  # [1, seq]
    _by_kind: dict[str | None, tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]] = \
        field(default_factory=dict)

    def for_layer(self, index: int, sample: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                                   torch.Tensor | None]:
        kinds = getattr(self.hf_config, "layer_types", None) if is_gemma(self.hf_config) else None
        kind = kinds[index] if kinds else None
        if kind not in self._by_kind:
            self._by_kind[kind] = (self._embeddings(kind, sample), self._mask(kind))
        return self._by_kind[kind]

    def _embeddings(self, kind: str | None, sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.hf_config.model_type == "gemma3_text":
            return self.rotary(sample, self.positions, layer_type=kind)
        return self.rotary(sample, self.positions)

    def _mask(self, kind: str | None) -> torch.Tensor | None:
        """None lets SDPA mask causally; eager attention, and a window shorter than the samples (Phi-3
        mini's 2047; Mistral's), get an additive causal (and window) mask."""
        length = self.positions.shape[1]
        window = self._window(kind)
        if not is_gemma(self.hf_config) and (window is None or window >= length):
            return None
        query, key = torch.arange(length).unsqueeze(1), torch.arange(length).unsqueeze(0)
        allowed = key <= query
        if window is not None:
            allowed &= key > query - window
        return torch.zeros(length, length).masked_fill(~allowed, float("-inf"))[None, None]

    def _window(self, kind: str | None) -> int | None:
        if is_gemma(self.hf_config):
            return self.hf_config.sliding_window if kind == "sliding_attention" else None
        windowed = self.hf_config.model_type in ("mistral", "phi3")  # Qwen2 names a window it does not use
        return getattr(self.hf_config, "sliding_window", None) if windowed else None
