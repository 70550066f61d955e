"""Parameter counts: computed from a ModelSpec, or read exactly from safetensors headers."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from llmctl.checkpoint.spec import ModelSpec

# Safetensors dtype names and their sizes in bytes.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
# Buffers that checkpoints store beside the weights: rotary caches (old Llama checkpoints) and
# DeepSeek-V3's router score-correction bias (a buffer in transformers, not a parameter).
BUFFER = re.compile(r"(rotary_emb\.(inv_freq|cos_cached|sin_cached)|e_score_correction_bias)$")
# Tensors that describe quantized weights rather than being weights themselves.
QUANT_METADATA = re.compile(
    r"\.(qzeros|scales|g_idx|weight_scale|weight_scale_inv|input_scale|weight_zero_point|"
    r"input_zero_point|weight_global_scale|output_scale|k_scale|v_scale|weight_shape|weight_g_idx)$"
)


@dataclass(frozen=True)
class ConfigParamCount:
    """Parameters computed from config.json, by component."""

    embedding: int
    attention: int  # attention, and the Mamba2 mixers in their layers
    mlp: int
    norms: int
    lm_head: int
    total: int
    active: int  # per token: total for dense models, routed top-k for MoE
    mtp: int = 0  # DeepSeek multi-token-prediction layers, not part of `total`


@dataclass
class TensorCount:
    """Parameters counted from safetensors headers."""

    total: int = 0
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    params_by_dtype: dict[str, int] = field(default_factory=dict)
    buffers: int = 0  # elements in rotary caches and router bias buffers
    quant_metadata: int = 0  # elements in scales / zeros / g_idx tensors
    packed_int4_tensors: int = 0
    skipped_tied_head: bool = False
    mtp: int = 0  # elements in multi-token-prediction layers (DeepSeek), counted apart
    tensor_count: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())


def count_from_config(spec: ModelSpec) -> ConfigParamCount | None:
    """Exact for the architectures llmctl knows; None when the config lacks core facts."""
    attends = any(map(spec.attends, range(spec.num_layers)))
    if not (spec.num_layers and spec.hidden_size and spec.vocab_size and (spec.attention.num_heads or not attends)):
        return None
    h, lay = spec.hidden_size, spec.layout
    norm_size = 2 * h if lay.norm == "layernorm" else h
    embed_dim = lay.word_embed_proj_dim or h
    embedding = spec.vocab_size * embed_dim + spec.positional.learned_positions * h
    if lay.word_embed_proj_dim:
        embedding += 2 * embed_dim * h  # project_in and project_out
    norms_outside = norm_size * (int(lay.final_norm) + int(lay.embedding_norm))
    lm_head = 0 if spec.tie_word_embeddings else spec.vocab_size * embed_dim
    if lay.lm_head_bias:
        lm_head += spec.vocab_size

    attention_per_layer = _attention_params(spec)
    norms_per_layer = lay.norms_per_layer * norm_size
    mlp_total = mlp_active = 0
    moe = spec.moe
    for layer in filter(spec.has_mlp, range(spec.num_layers)):
        if moe is not None and layer in moe.moe_layers:
            total, active = _moe_params(spec)
        else:
            total = active = _mlp_params(h, spec.intermediate_size, lay.gated_mlp, lay.mlp_bias)
        mlp_total += total
        mlp_active += active
    mixers = len(spec.recurrent.layers) if spec.recurrent is not None and spec.mixer is not None else 0
    mixer_params = spec.mixer.params * mixers if spec.mixer is not None else 0
    attending = sum(map(spec.attends, range(spec.num_layers)))
    attention = attention_per_layer * attending + mixer_params
    qk_norms = spec.attention.qk_norm_params * attending  # attention layers only
    norms = norms_per_layer * spec.num_layers + qk_norms + norms_outside
    vision = spec.vision.in_checkpoint if spec.vision is not None else 0  # the image tower and its projector
    total = embedding + attention + mlp_total + norms + lm_head + vision
    active = embedding + attention + mlp_active + norms + lm_head + vision
    return ConfigParamCount(
        embedding=embedding, attention=attention, mlp=mlp_total, norms=norms, lm_head=lm_head,
        total=total, active=active, mtp=_mtp_params(spec),
    )


def _attention_params(spec: ModelSpec) -> int:
    att, h, lay = spec.attention, spec.hidden_size, spec.layout
    if att.kind == "MLA":
        nope, rope, v = att.qk_nope_head_dim or 0, att.qk_rope_head_dim or 0, att.v_head_dim or 0
        kv_rank, q_rank = att.kv_lora_rank or 0, att.q_lora_rank
        q_out = att.num_heads * (nope + rope)
        q = h * q_rank + q_rank + q_rank * q_out if q_rank else h * q_out
        kv = h * (kv_rank + rope) + kv_rank + kv_rank * att.num_heads * (nope + v)
        return q + kv + att.num_heads * v * h
    q_dim = att.num_heads * att.head_dim
    kv_dim = att.num_kv_heads * att.head_dim
    params = h * (q_dim * (2 if att.output_gate else 1) + 2 * kv_dim) + q_dim * h
    if lay.qkv_bias:
        params += q_dim + 2 * kv_dim
    if lay.o_bias:
        params += h
    return params + (att.num_heads if att.sinks else 0)  # gpt-oss: a sink logit per head


def _mlp_params(hidden: int, intermediate: int, gated: bool, bias: bool) -> int:
    if gated:
        return 3 * hidden * intermediate + (2 * intermediate + hidden if bias else 0)
    return 2 * hidden * intermediate + (intermediate + hidden if bias else 0)


def _moe_params(spec: ModelSpec) -> tuple[int, int]:
    moe, h = spec.moe, spec.hidden_size
    assert moe is not None
    width = moe.latent_size or h  # Nemotron-H's latent experts: projected in and out around them
    expert = _mlp_params(width, moe.expert_intermediate_size, spec.layout.gated_mlp, moe.expert_biases)
    # router_bias (DeepSeek-V3's) is a buffer, reported apart from parameters; gpt-oss's router linear has a bias
    router = (h + 1 if moe.expert_biases else h) * moe.num_experts
    if moe.latent_size:
        router += 2 * h * moe.latent_size + ((h + moe.latent_size) if spec.layout.mlp_bias else 0)
    shared = 0
    if moe.shared_expert_intermediate_size:
        shared = _mlp_params(h, moe.shared_expert_intermediate_size, spec.layout.gated_mlp, False)
        if moe.shared_expert_gate:
            shared += h
    total = moe.num_experts * expert + router + shared
    active = moe.top_k * expert + router + shared
    return total, active


def _mtp_params(spec: ModelSpec) -> int:
    """DeepSeek-V3's MTP module as shipped: one MoE decoder layer, its own embed_tokens and
    shared_head (norm + head), enorm, hnorm and eh_proj (2h -> h)."""
    if not spec.mtp_layers or spec.moe is None:
        return 0
    h = spec.hidden_size
    layer = _attention_params(spec) + _moe_params(spec)[0] + 2 * h
    extra = 2 * spec.vocab_size * h + 3 * h + 2 * h * h
    return spec.mtp_layers * (layer + extra)


def count_from_tensors(tensors: dict[str, tuple[str, tuple[int, ...]]], spec: ModelSpec | None) -> TensorCount:
    """Count parameters from a {name: (dtype, shape)} map of safetensors headers.

    Tied embeddings count once; int32 ``qweight`` tensors hold 32/bits logical weights per
    element; rotary caches and quantization scales/zeros are reported apart.
    """
    bits = (spec.quantization.bits if spec and spec.quantization and spec.quantization.bits else 4)
    mtp_prefixes = _mtp_prefixes(spec)
    result = TensorCount()
    bytes_by_dtype: Counter[str] = Counter()
    params_by_dtype: Counter[str] = Counter()
    names = set(tensors)
    for name, (dtype, shape) in tensors.items():
        elements = 1
        for dim in shape:
            elements *= int(dim)
        bytes_by_dtype[dtype] += elements * SAFETENSORS_DTYPE_BYTES.get(dtype, 0)
        result.tensor_count += 1
        if BUFFER.search(name):
            result.buffers += elements
            continue
        if QUANT_METADATA.search(name):
            result.quant_metadata += elements
            continue
        if name.endswith("lm_head.weight") and spec and spec.tie_word_embeddings and _has_embedding(names):
            result.skipped_tied_head = True
            continue
        if name.endswith((".qweight", ".weight_packed")) and dtype in ("I32", "U32"):  # GPTQ/AWQ, compressed-tensors
            elements *= 32 // bits
            result.packed_int4_tensors += 1
        if mtp_prefixes and name.startswith(mtp_prefixes):
            result.mtp += elements
            continue
        params_by_dtype[dtype] += elements
        result.total += elements
    result.bytes_by_dtype = dict(bytes_by_dtype)
    result.params_by_dtype = dict(params_by_dtype)
    return result


def _has_embedding(names: set[str]) -> bool:
    return any(n.endswith(("embed_tokens.weight", "word_embeddings.weight", "wte.weight", "embed_in.weight"))
               for n in names)


def _mtp_prefixes(spec: ModelSpec | None) -> tuple[str, ...]:
    if not spec or not spec.mtp_layers:
        return ()
    return tuple(f"model.layers.{spec.num_layers + i}." for i in range(spec.mtp_layers))
