"""The Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5 (QKV bias), Qwen3 (RMSNorm on each head of q
and k before RoPE), Granite (four scalar multipliers), SmolLM2 — and Qwen (1), which within its
trained context is the same network under other tensor names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec, QuantizationSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear, VocabParallelEmbedding
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models import coded_decode
from llmctl.engine.models.common import Shard, StepContext, Target, embedding_targets, layer_index, load_checkpoint
from llmctl.kernels import cpu as cpu_kernels

WEIGHT_KINDS = ("weight", "bias", "qweight", "qzeros", "scales", "g_idx", "codes", "offsets")  # GPTQ/AWQ, GGUF
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
QWEN1_NAMES = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_proj": "self_attn.o_proj",
               "mlp.w2": "mlp.gate_proj", "mlp.w1": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}


@dataclass(frozen=True)
class Multipliers:
    """Granite's scalars (1 and the usual 1/√head_dim everywhere else)."""

    embedding: float = 1.0  # embeddings × this
    residual: float = 1.0  # each block's output × this before the residual add
    attention: float | None = None  # the softmax scale; None: 1/√head_dim
    logits: float = 1.0  # logits ÷ this

    @staticmethod
    def from_config(hf_config: Any) -> Multipliers:
        return Multipliers(float(getattr(hf_config, "embedding_multiplier", 1.0)),
                           float(getattr(hf_config, "residual_multiplier", 1.0)),
                           getattr(hf_config, "attention_multiplier", None),
                           float(getattr(hf_config, "logits_scaling", 1.0)))


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup,
                 scale: float | None = None) -> None:
        super().__init__()
        att = spec.attention
        q = Part.split(att.num_heads * att.head_dim, group)
        kv = Part.kv_heads(att.num_kv_heads, att.head_dim, group)
        self.num_heads, self.num_kv_heads, self.head_dim = q.size // att.head_dim, kv.size // att.head_dim, att.head_dim
        self.q_size, self.kv_size = q.size, kv.size
        quant = spec.quantization
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, [q, kv, kv], spec.layout.qkv_bias, quant)
        self.o_proj = RowParallelLinear(q, spec.hidden_size, spec.layout.o_bias, group, quant)
        self.rotary = rotary
        self.scale = self.head_dim**-0.5 if scale is None else float(scale)
        self.window: int | None = None  # this layer's sliding window where layers differ (Gemma)
        self.softcap: float | None = None  # attention logit soft-cap (Gemma 2)
        self.q_norm, self.k_norm = self.qk_norms(q, kv, eps, group) if att.qk_norm else (None, None)

    def qk_norms(self, q: Part, kv: Part, eps: float, group: TPGroup) -> tuple[nn.Module, nn.Module]:
        """Qwen3: one RMSNorm over head_dim, shared by every head (so TP needs no communication)."""
        return RMSNorm(self.head_dim, eps), RMSNorm(self.head_dim, eps)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's row normed; q and k go in as views of the projection ([tokens, heads, head_dim])."""
        return self.q_norm(q.unflatten(-1, (-1, self.head_dim))), self.k_norm(k.unflatten(-1, (-1, self.head_dim)))

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q, k = self.norm_qk(q, k)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if getattr(ctx.backend, "rotates_on_store", False):  # Triton: RoPE inside the KV store's launch
            cos, sin = self.rotary.cos_sin(ctx.positions, q.dtype, ctx.lengths)
            out = ctx.backend.forward_rotated(q, k, v, cos, sin, ctx.kv_caches[layer],  # type: ignore[attr-defined]
                                              scale=self.scale, window=self.window, softcap=self.softcap,
                                              sinks=self.sink_logits())
        else:
            q, k = self.rotary(ctx.positions, q, k, ctx.lengths)
            out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale, window=self.window,
                                      softcap=self.softcap, sinks=self.sink_logits())
        return self.o_proj(out.reshape(-1, self.q_size))

    def sink_logits(self) -> torch.Tensor | None:
        """This rank's heads' attention-sink logits (gpt-oss), or None."""
        return None


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, group: TPGroup,
                 quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        part = Part.split(intermediate, group)
        self.intermediate = part.size
        self.gate_up_proj = ColumnParallelLinear(hidden, [part, part], bias, quant)
        self.down_proj = RowParallelLinear(part, hidden, bias, group, quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.intermediate))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup,
                 multipliers: Multipliers = Multipliers(), mlp: nn.Module | None = None,
                 attention: nn.Module | None = None) -> None:
        """`mlp`, `attention`: other blocks in their places (mixture of experts, latent attention)."""
        super().__init__()
        self.self_attn = attention or LlamaAttention(spec, rotary, eps, group, multipliers.attention)
        self.mlp = mlp or LlamaMLP(spec.hidden_size, spec.intermediate_size, spec.layout.mlp_bias, group,
                                   spec.quantization)
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps)
        self.residual = multipliers.residual

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        attention = self.self_attn(self.input_layernorm(x), ctx, layer)
        if self.residual != 1.0:
            attention = attention * self.residual
        attended, x = self.post_attention_layernorm.add_and_norm(attention, x)
        mlp = self.mlp(attended)
        return x + (mlp * self.residual if self.residual != 1.0 else mlp)


class LlamaForCausalLM(nn.Module):
    decoder_layer: type[nn.Module] = LlamaDecoderLayer  # a family with other norms around the blocks swaps it
    supports_lora = True

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__()
        shard = shard or Shard()
        self.spec, self.shard = spec, shard
        self.stage_layers = shard.stage_layers(spec.num_layers)
        eps = float(getattr(hf_config, "rms_norm_eps", getattr(hf_config, "layer_norm_epsilon", 1e-6)))
        rotary = self.make_rotary(hf_config, spec.attention.head_dim)
        group = shard.group
        self.multipliers = Multipliers.from_config(hf_config)
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group) \
            if shard.is_first else None
        self.layers = nn.ModuleList(self.make_layer(i, hf_config, rotary, eps)
                                    if i in self.stage_layers else nn.Identity() for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, eps) if shard.is_last else None
        self.lm_head = None
        if shard.is_last:
            tied_here = spec.tie_word_embeddings and self.embed_tokens is not None
            self.lm_head = self.embed_tokens if tied_here else \
                VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group)
        self.coded_layers: dict[int, coded_decode.CodedLayer] | None | bool = False  # False: not decided yet
        self.needs_lengths = rotary.original_max is not None  # LongRoPE switches factors by sequence length
        # EAGLE-3 (llmctl.engine.spec_decode.eagle3): the residual stream entering these layers, kept each step
        self.aux_layers: tuple[int, ...] = ()
        self.aux_hidden: torch.Tensor | None = None  # [T, len(aux_layers) * hidden]
        self.keep_last_hidden = False  # multi-token prediction (llmctl.engine.spec_decode.mtp): the output, kept
        self.last_hidden: torch.Tensor | None = None
        self.qwen1 = spec.model_type == "qwen"
        if self.qwen1:
            self.supports_lora = False  # PEFT names q/k/v/o and gate/up/down; Qwen 1 fuses c_attn

    def make_rotary(self, hf_config: Any, head_dim: int) -> RotaryEmbedding:
        return RotaryEmbedding(hf_config, head_dim)

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        return self.decoder_layer(self.spec, rotary, eps, self.shard.group, self.multipliers)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x * self.multipliers.embedding if self.multipliers.embedding != 1.0 else x

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        if ctx.input_embeds is not None:
            x = ctx.input_embeds
        else:
            x = self.embed(input_ids) if self.embed_tokens is not None else hidden
        attention = self._coded_step(ctx, x)
        aux = {}
        for index in self.stage_layers:
            if index in self.aux_layers:  # copied: the layer adds into its input in place
                aux[index] = x.clone()
            x = coded_decode.run_layer(self.coded_layers[index], x, ctx, attention, index) if attention else \
                self.layers[index](x, ctx, index)
        if self.aux_layers:
            self.aux_hidden = torch.cat([aux[index] for index in self.aux_layers], dim=-1)
        out = self.norm(x) if self.norm is not None else x
        if self.keep_last_hidden:
            self.last_hidden = out
        return out

    def _coded_step(self, ctx: StepContext, x: torch.Tensor) -> list[torch.Tensor] | None:
        """The step's attention arguments where every layer runs as one C++ call (coded_decode), else None."""
        if self.coded_layers is False:  # decided once, at the first step: the weights are loaded by then
            plain = coded_decode.PlainLlama(LlamaDecoderLayer, LlamaAttention, LlamaMLP)
            self.coded_layers = coded_decode.coded_layers(self.layers, self.stage_layers, plain) \
                if x.dtype == torch.float32 and cpu_kernels.fused_layers_for(x) else None
        if not self.coded_layers or not x.is_contiguous() or x.dim() != 2:
            return None
        first = self.stage_layers[0]
        if ctx.kv_caches[first].kv.dtype not in (torch.float32, torch.bfloat16, torch.float16):  # fp8: not the C++ kernel
            return None
        return coded_decode.step_attention(ctx, self.layers[first].self_attn.rotary, x.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.logits(hidden)
        return logits / self.multipliers.logits if self.multipliers.logits != 1.0 else logits

    def load_weights(self, tensors: list[CheckpointTensor] | Any) -> None:
        load_checkpoint(self, tensors, self.targets)

    def targets(self, name: str) -> list[Target]:
        """transformers' names (and Qwen 1's) → our parameters; q/k/v and gate/up are fused."""
        name = self._qwen1_name(name) if self.qwen1 else name.removeprefix("model.")
        if "rotary_emb." in name:
            return []
        layer = layer_index(name, "layers.")
        if layer is not None:
            if layer not in self.stage_layers:
                return []
            if name.endswith("self_attn.c_attn.weight") or name.endswith("self_attn.c_attn.bias"):
                kind = name.rsplit(".", 1)[1]  # Qwen 1: q, k and v stacked in one tensor
                return self.stacked_targets(f"layers.{layer}.self_attn.qkv_proj.{kind}")
            parts = name.split(".")
            owner = parts[-2] if parts[-1] in WEIGHT_KINDS else None
            if owner in FUSED:
                fused, slot = FUSED[owner]
                return [Target(".".join(parts[:-2] + [fused, parts[-1]]), slot)]
            return [Target(name)]
        if name.startswith("embed_tokens."):
            return embedding_targets(name, self.embed_tokens, self.lm_head, self.spec.tie_word_embeddings)
        return [Target(name)]

    def stacked_targets(self, path: str) -> list[Target]:
        """A checkpoint tensor holding q, k and v (or gate and up) stacked by rows: each part from its first row."""
        att = self.spec.attention
        if path.split(".")[-2] == "gate_up_proj":
            starts = [0, self.spec.intermediate_size]
        else:
            q, kv = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
            starts = [0, q, q + kv]
        return [Target(path, part, start) for part, start in enumerate(starts)]

    @staticmethod
    def _qwen1_name(name: str) -> str:
        name = name.removeprefix("transformer.").replace("wte.", "embed_tokens.").replace("ln_f.", "norm.")
        name = name.replace("h.", "layers.", 1) if name.startswith("h.") else name
        name = name.replace(".attn.c_attn.", ".self_attn.c_attn.")
        for old, new in QWEN1_NAMES.items():
            name = name.replace(f".{old}.", f".{new}.")
        return name
