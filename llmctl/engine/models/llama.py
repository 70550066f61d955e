"""The Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5 (QKV bias), SmolLM2."""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.quant_linear import QuantLinear
from llmctl.engine.models.common import RMSNorm, StepContext, WeightMismatchError, load_into
from llmctl.model.spec import ModelSpec, QuantizationSpec

PACKED = ("qweight", "qzeros", "scales", "g_idx")


def make_linear(in_features: int, out_features: int, bias: bool, quant: QuantizationSpec | None) -> nn.Module:
    """nn.Linear, or a QuantLinear for GPTQ/AWQ checkpoints."""
    if quant is None or quant.method not in ("gptq", "awq"):
        return nn.Linear(in_features, out_features, bias=bias)
    return QuantLinear(in_features, out_features, bias, quant.method, quant.bits or 4, quant.group_size or 128)


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding) -> None:
        super().__init__()
        att = spec.attention
        self.num_heads, self.num_kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        self.q_size, self.kv_size = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
        quant = spec.quantization
        self.qkv_proj = make_linear(spec.hidden_size, self.q_size + 2 * self.kv_size, spec.layout.qkv_bias, quant)
        self.o_proj = make_linear(self.q_size, spec.hidden_size, spec.layout.o_bias, quant)
        self.rotary = rotary
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(ctx.positions, q, k)
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = make_linear(hidden, 2 * intermediate, bias, quant)
        self.down_proj = make_linear(intermediate, hidden, bias, quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, rotary)
        self.mlp = LlamaMLP(spec.hidden_size, spec.intermediate_size, spec.layout.mlp_bias, spec.quantization)
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any) -> None:
        super().__init__()
        self.spec = spec
        eps = float(getattr(hf_config, "rms_norm_eps", 1e-6))
        rotary = RotaryEmbedding(hf_config, spec.attention.head_dim)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, rotary, eps) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for index, layer in enumerate(self.layers):
            x = layer(x, ctx, index)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """transformers names; q/k/v and gate/up are fused into one matmul each."""
        pending: dict[str, dict[str, torch.Tensor]] = {}
        packed: dict[str, dict[int, dict[str, torch.Tensor]]] = {}  # fused target -> slot -> packed tensors
        direct = []
        fused = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                 "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
        for name, tensor in tensors:
            name = name.removeprefix("model.")
            if "rotary_emb." in name:
                continue
            parts = name.split(".")
            if parts[-1] in PACKED:
                target, slot = fused.get(parts[-2], (parts[-2], 0))
                packed.setdefault(".".join(parts[:-2] + [target]), {}).setdefault(slot, {})[parts[-1]] = tensor
                continue
            if len(parts) >= 2 and parts[-2] in fused:
                target, slot = fused[parts[-2]]
                key = ".".join(parts[:-2] + [target, parts[-1]])
                pending.setdefault(key, {})[slot] = tensor
                continue
            direct.append((name, tensor))
        for key, pieces in pending.items():
            if len(pieces) != (3 if ".qkv_proj." in key else 2):
                raise WeightMismatchError(f"{key}: checkpoint lacks some of its fused parts")
            direct.append((key, torch.cat([pieces[i] for i in sorted(pieces)], dim=0)))
        loaded = load_into(self, direct)
        modules = dict(self.named_modules())
        for target, slots in packed.items():
            module = modules.get(target)
            if not isinstance(module, QuantLinear):
                raise WeightMismatchError(f"{target}: packed quantized tensors, but config.json declares no "
                                          "gptq/awq quantization_config")
            module.load_parts([slots[i] for i in sorted(slots)])
        expected = {n for n, _ in self.named_parameters()}
        if self.spec.tie_word_embeddings:
            loaded.add("lm_head.weight")
        missing = expected - loaded
        if missing:
            raise WeightMismatchError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
