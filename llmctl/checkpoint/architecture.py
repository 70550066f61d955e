"""The parts of a ModelSpec: positions (RoPE and its scaling, ALiBi, learned), attention (heads,
KV heads, MLA, sliding windows), mixture of experts, quantization and the layer layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    scaling_type: str | None = None  # linear, dynamic, llama3, yarn, longrope, ...
    scaling_factor: float | None = None
    original_max_position: int | None = None
    partial_rotary_factor: float = 1.0
    scaling: dict[str, Any] | None = None  # the raw scaling parameters
    sliding_theta: float | None = None  # Gemma 3: its sliding layers' own base (θ above is the full layers')


@dataclass(frozen=True)
class PositionalEncoding:
    kind: str  # "rope" | "alibi" | "learned" | "none"
    rope: RopeSpec | None = None
    learned_positions: int = 0  # rows of a learned position table (OPT adds an offset of 2)

    @property
    def long_rope_switch(self) -> int | None:
        """LongRoPE's pretraining length: a sequence longer than it runs on the long factors."""
        rope = self.rope
        return rope.original_max_position if rope and rope.scaling_type == "longrope" else None

    def describe(self) -> str:
        if self.kind == "rope" and self.rope:
            text = f"RoPE θ={self.rope.theta:g}"
            if self.rope.partial_rotary_factor != 1.0:
                text += f", rotary on {self.rope.partial_rotary_factor:g} of head_dim"
            if self.rope.scaling_type and self.rope.scaling_type != "default":
                text += f", {self.rope.scaling_type} scaling"
                if self.rope.scaling_factor:
                    text += f" ×{self.rope.scaling_factor:g}"
                if self.rope.original_max_position:
                    text += f" (from {self.rope.original_max_position})"
            if self.rope.sliding_theta is not None:
                text += f"; sliding layers θ={self.rope.sliding_theta:g}"
            return text
        if self.kind == "alibi":
            return "ALiBi"
        if self.kind == "learned":
            return f"learned absolute ({self.learned_positions} positions)"
        return "none (no positional encoding)" if self.kind == "none" else self.kind


@dataclass(frozen=True)
class AttentionSpec:
    kind: str  # "MHA" | "GQA" | "MQA" | "MLA"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # "full" or "sliding", one per layer
    qk_norm: bool = False
    qk_norm_whole: bool = False  # OLMo 2: over the whole q and k projections, not one head's
    logit_softcap: float | None = None  # Gemma 2: scores = cap · tanh(scores / cap)
    # Llama 4: the "sliding" layers attend within aligned chunks of sliding_window tokens (never more than that
    # many back, so their KV group keeps what a window would)
    chunked: bool = False
    sinks: bool = False  # gpt-oss: one learned logit per head in each softmax's denominator
    output_gate: bool = False  # Qwen3-Next: q_proj also gives a gate per head, sigmoid(gate) · attention output

    @property
    def qk_norm_params(self) -> int:
        """Weights of the q and k norms in one layer."""
        if not self.qk_norm:
            return 0
        return (self.num_heads + self.num_kv_heads) * self.head_dim if self.qk_norm_whole else 2 * self.head_dim

    @property
    def sliding_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "sliding")


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()
    dense_layers: tuple[int, ...] = ()
    shared_expert_gate: bool = False  # Qwen-MoE gates its shared expert with a 1-wide linear
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias
    expert_biases: bool = False  # gpt-oss: biases on the router's linear and on both projections of every expert
    latent_size: int | None = None  # Nemotron-H: experts work in a narrower latent, projected in and out around them


@dataclass(frozen=True)
class QuantizationSpec:
    method: str
    bits: int | None = None
    group_size: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [self.method]
        if self.bits:
            parts.append(f"{self.bits}-bit")
        if self.group_size:
            parts.append(f"group {self.group_size}" if self.group_size > 0 else "per-channel")
        for key in ("fmt", "weight_block_size", "desc_act", "sym", "version", "zero_point"):
            if key in self.details:
                parts.append(f"{key}={self.details[key]}")
        return ", ".join(str(p) for p in parts)


@dataclass(frozen=True)
class LayerLayout:
    """Shape facts beyond the headline numbers, needed to count parameters exactly."""

    norm: str = "rmsnorm"  # "rmsnorm" (weight) | "layernorm" (weight + bias)
    norms_per_layer: int = 2
    gated_mlp: bool = True  # gate/up/down (SwiGLU, GeGLU) vs. fc1/fc2
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    embedding_norm: bool = False  # BLOOM's word_embeddings_layernorm
    final_norm: bool = True
    word_embed_proj_dim: int | None = None  # OPT-350m projects embeddings in/out
    parallel_residual: bool = False
    # Nemotron-H: every layer is one block — "mamba", "attention", "mlp" or "moe" — behind one norm (None: each
    # layer has its token mixer and an MLP)
    blocks: tuple[str, ...] | None = None
    mixer_beside_attention: bool = False  # Falcon-H1: each layer's Mamba2 mixer and attention read the same input
