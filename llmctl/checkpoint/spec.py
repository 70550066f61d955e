"""ModelSpec: normalized architecture facts read from config.json.

Every architecture names its facts differently (``n_layer``, ``num_hidden_layers``,
``n_embed``...). This module is the one place that knows those names; plan, inspect and
the engine read ModelSpec only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Where each family deviates from the Llama naming, see _FAMILY_READERS below.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
DEFAULT_CONTEXT = 2048  # what vLLM assumes when a config names no context length

DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "float16": 2, "half": 2, "fp16": 2,
    "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1,
}


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    scaling_type: str | None = None  # linear, dynamic, llama3, yarn, longrope, ...
    scaling_factor: float | None = None
    original_max_position: int | None = None
    partial_rotary_factor: float = 1.0
    scaling: dict[str, Any] | None = None  # the raw scaling parameters


@dataclass(frozen=True)
class PositionalEncoding:
    kind: str  # "rope" | "alibi" | "learned" | "none"
    rope: RopeSpec | None = None
    learned_positions: int = 0  # rows of a learned position table (OPT adds an offset of 2)

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
            return text
        if self.kind == "alibi":
            return "ALiBi"
        if self.kind == "learned":
            return f"learned absolute ({self.learned_positions} positions)"
        return self.kind


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


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    architectures: tuple[str, ...]
    structure: str  # "decoder-only" | "encoder-decoder" | "encoder-only"
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    context_source: str  # the config key it came from, or "default"
    attention: AttentionSpec
    positional: PositionalEncoding
    layout: LayerLayout
    activation: str | None
    tie_word_embeddings: bool
    torch_dtype: str | None
    moe: MoESpec | None = None
    quantization: QuantizationSpec | None = None
    auto_map: dict[str, Any] | None = None
    requires_remote_code: bool = False
    mtp_layers: int = 0  # DeepSeek's multi-token-prediction layers, shipped beside the model
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache bytes for one token across all layers, before any parallelism."""
        return self.num_layers * self.kv_bytes_per_token_layer(dtype_bytes)

    def kv_bytes_per_token_layer(self, dtype_bytes: int, kv_heads: int | None = None) -> int:
        """One token, one layer: 2 · kv_heads · head_dim · dtype bytes (kv_heads: per TP rank when given);
        MLA stores one latent of kv_lora_rank + qk_rope_head_dim, the same on every rank."""
        att = self.attention
        if att.kind == "MLA":
            return ((att.kv_lora_rank or 0) + (att.qk_rope_head_dim or 0)) * dtype_bytes
        return 2 * (att.num_kv_heads if kv_heads is None else kv_heads) * att.head_dim * dtype_bytes

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get((self.torch_dtype or "bfloat16").lower(), 2)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelSpec:
        return build_spec(config)


class _ConfigReader:
    """Reads facts by trying each family's key names, remembering which facts were missing."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.missing: list[str] = []

    def get(self, fact: str, keys: tuple[str, ...], default: Any = None, *, required: bool = True) -> Any:
        for key in keys:
            if self.config.get(key) is not None:
                return self.config[key]
        if required:
            self.missing.append(f"{fact} ({' / '.join(keys)})")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        return default if value is None else bool(value)


KNOWN_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "bloom", "opt", "gpt2", "gpt_neox", "falcon", "phi", "phi3", "gemma", "gemma2",
    "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "granite", "olmo2",
)


def build_spec(raw_config: dict[str, Any]) -> ModelSpec:
    config, notes = _language_config(raw_config)
    model_type = str(raw_config.get("model_type") or config.get("model_type") or "unknown")
    text_type = str(config.get("model_type") or model_type)
    reader = _ConfigReader(config)
    warnings: list[str] = []
    if text_type not in KNOWN_MODEL_TYPES:
        warnings.append(
            f"model_type '{model_type}' is not one llmctl knows: facts were read from common "
            "config keys and may be incomplete"
        )
    family = _FAMILY_READERS.get(text_type, _read_llama_like)
    facts = family(reader, text_type)
    num_layers = facts["num_layers"]
    attention = _attention(reader, text_type, facts, num_layers)
    positional = _positional(reader, text_type, facts)
    context, context_source = _context(config, raw_config)
    if text_type == "qwen" and isinstance(config.get("seq_length"), int) and config["seq_length"] < context:
        # Past its trained context Qwen (1) switches on logn attention and dynamic NTK, which llmctl
        # does not implement: serve only what it computes exactly.
        context, context_source = config["seq_length"], "seq_length"
        notes.append(f"Qwen (1): context capped at seq_length {context}; longer contexts need its logn attention "
                     "and dynamic NTK scaling, which llmctl does not implement")
    if context_source == "default":
        notes.append(f"config names no context length; {DEFAULT_CONTEXT} assumed (vLLM's default)")
    if reader.missing:
        warnings.append("could not find: " + "; ".join(reader.missing))
    auto_map = raw_config.get("auto_map")
    return ModelSpec(
        model_type=model_type,
        architectures=tuple(raw_config.get("architectures") or ()),
        structure=_structure(raw_config),
        num_layers=num_layers,
        hidden_size=facts["hidden"],
        intermediate_size=facts["intermediate"],
        vocab_size=int(reader.get("vocab_size", ("vocab_size", "padded_vocab_size"), 0)),
        max_context=context,
        context_source=context_source,
        attention=attention,
        positional=positional,
        layout=facts["layout"],
        activation=facts.get("activation") or config.get("hidden_act") or config.get("activation_function"),
        tie_word_embeddings=reader.flag("tie_word_embeddings", facts.get("tied_default", False)),
        torch_dtype=_dtype(raw_config, config),
        moe=facts.get("moe"),
        quantization=_quantization(raw_config),
        auto_map=auto_map,
        requires_remote_code=bool(auto_map) and not _transformers_knows(model_type),
        mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
        notes=tuple(notes),
        warnings=tuple(warnings),
    )


def _language_config(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Multimodal configs nest the language model under text_config."""
    text = raw.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in raw:
        merged = {**raw, **text}
        return merged, ["multimodal checkpoint: facts are the language model's (text_config)"]
    return dict(raw), []


def _structure(config: dict[str, Any]) -> str:
    if config.get("is_encoder_decoder"):
        return "encoder-decoder"
    archs = " ".join(config.get("architectures") or ())
    if any(s in archs for s in ("ForCausalLM", "LMHeadModel")) or "ForConditionalGeneration" in archs:
        return "decoder-only"
    if any(s in archs for s in ("ForMaskedLM", "ForSequenceClassification", "BertModel", "ForTokenClassification")):
        return "encoder-only"
    if config.get("model_type") in ("bert", "roberta", "xlm-roberta", "distilbert", "deberta-v2"):
        return "encoder-only"
    return "decoder-only"


def _context(config: dict[str, Any], raw: dict[str, Any]) -> tuple[int, str]:
    for key in CONTEXT_KEYS:
        for source in (config, raw):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value, key
    return DEFAULT_CONTEXT, "default"


def _dtype(raw: dict[str, Any], config: dict[str, Any]) -> str | None:
    value = raw.get("torch_dtype") or raw.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if value is None:
        if raw.get("bf16"):
            return "bfloat16"
        if raw.get("fp16"):
            return "float16"
    return str(value) if value is not None else None


def _quantization(config: dict[str, Any]) -> QuantizationSpec | None:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method") or quant.get("quant_type") or "unknown")
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("num_bits")
    group = quant.get("group_size", quant.get("q_group_size"))
    details = {k: v for k, v in quant.items() if k not in ("quant_method", "bits", "w_bit", "group_size", "q_group_size")}
    if method == "fp8" and bits is None:
        bits = 8
    return QuantizationSpec(method=method, bits=int(bits) if bits else None, group_size=group, details=details)


def _transformers_knows(model_type: str) -> bool:
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except Exception:
        return False
    return model_type in CONFIG_MAPPING_NAMES


# ---------------------------------------------------------------- family readers
# Each returns num_layers, hidden, intermediate, heads, kv_heads, head_dim, layout (+ moe).

def _core(reader: _ConfigReader, *, layers=("num_hidden_layers", "n_layer", "num_layers"),
          hidden=("hidden_size", "n_embd", "n_embed", "d_model"),
          heads=("num_attention_heads", "n_head", "num_heads")) -> dict[str, Any]:
    num_layers = int(reader.get("num_layers", layers, 0))
    hidden_size = int(reader.get("hidden_size", hidden, 0))
    num_heads = int(reader.get("num_attention_heads", heads, 0))
    return {"num_layers": num_layers, "hidden": hidden_size, "heads": num_heads}


def _head_dim(reader: _ConfigReader, facts: dict[str, Any]) -> int:
    explicit = reader.config.get("head_dim")
    if explicit:
        return int(explicit)
    return facts["hidden"] // facts["heads"] if facts["heads"] else 0


def _read_llama_like(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts["kv_heads"] = int(cfg.get("num_key_value_heads") or facts["heads"])
    facts["head_dim"] = _head_dim(reader, facts)
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size", "ffn_hidden_size", "n_inner"), 0))
    bias = bool(cfg.get("attention_bias", False))
    layout = dict(qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False)))
    facts["tied_default"] = model_type.startswith("gemma")
    if model_type in ("qwen2", "qwen2_moe"):
        layout.update(qkv_bias=True, o_bias=False)
    if model_type == "gemma2":
        layout["norms_per_layer"] = 4
    if model_type in ("gemma3", "gemma3_text"):
        layout["norms_per_layer"] = 4
    if model_type == "phi3":
        layout.update(qkv_bias=False, o_bias=False)
    facts["layout"] = LayerLayout(**layout)
    facts["moe"] = _moe(reader, model_type, facts["num_layers"])
    if facts["moe"] is not None and model_type == "mixtral":
        facts["intermediate"] = facts["moe"].expert_intermediate_size
    return facts


def _read_qwen1(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts["kv_heads"] = facts["heads"]
    facts["head_dim"] = int(cfg.get("kv_channels") or _head_dim(reader, facts))
    # Qwen1's intermediate_size counts both w1 and w2: each projection is half of it.
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0)) // 2
    facts["layout"] = LayerLayout(qkv_bias=True, o_bias=not cfg.get("no_bias", True))
    return facts


def _read_bloom(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts), intermediate=4 * facts["hidden"])
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=True, o_bias=True,
                                  mlp_bias=True, embedding_norm=True)
    facts["tied_default"] = True
    facts["activation"] = "gelu"
    return facts


def _read_opt(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(reader.get("intermediate_size", ("ffn_dim",), 0))
    bias = bool(cfg.get("enable_bias", True))
    proj = cfg.get("word_embed_proj_dim")
    final_norm = bool(cfg.get("do_layer_norm_before", True)) and not cfg.get("_remove_final_layer_norm", False)
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
                                  final_norm=final_norm,
                                  word_embed_proj_dim=int(proj) if proj and proj != facts["hidden"] else None)
    facts["tied_default"] = True
    facts["activation"] = cfg.get("activation_function", "relu")
    return facts


def _read_gpt2(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(cfg.get("n_inner") or 4 * facts["hidden"])
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True)
    facts["tied_default"] = True
    facts["activation"] = cfg.get("activation_function", "gelu_new")
    return facts


def _read_gpt_neox(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0))
    bias = bool(cfg.get("attention_bias", True))
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=bias, o_bias=bias, mlp_bias=True,
                                  parallel_residual=bool(cfg.get("use_parallel_residual", True)))
    return facts


def _read_falcon(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        kv_heads = int(cfg.get("num_kv_heads") or facts["heads"])
    elif cfg.get("multi_query", True):
        kv_heads = 1
    else:
        kv_heads = facts["heads"]
    facts.update(kv_heads=kv_heads, head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(cfg.get("ffn_hidden_size") or 4 * facts["hidden"])
    parallel = bool(cfg.get("parallel_attn", True))
    if new_arch:
        norms = int(cfg.get("num_ln_in_parallel_attn") or 2)
    else:
        norms = 1 if parallel else 2
    bias = bool(cfg.get("bias", False))
    facts["layout"] = LayerLayout(norm="layernorm", norms_per_layer=norms, gated_mlp=False, qkv_bias=bias,
                                  o_bias=bias, mlp_bias=bias, parallel_residual=parallel)
    facts["tied_default"] = True
    facts["activation"] = cfg.get("activation", "gelu")
    return facts


def _read_phi(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    facts = _core(reader)
    facts["kv_heads"] = int(reader.config.get("num_key_value_heads") or facts["heads"])
    facts["head_dim"] = _head_dim(reader, facts)
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0))
    facts["layout"] = LayerLayout(norm="layernorm", norms_per_layer=1, gated_mlp=False, qkv_bias=True,
                                  o_bias=True, mlp_bias=True, lm_head_bias=True, parallel_residual=True)
    return facts


def _read_deepseek(reader: _ConfigReader, model_type: str) -> dict[str, Any]:
    facts = _read_llama_like(reader, model_type)
    facts["layout"] = LayerLayout(qkv_bias=False, o_bias=False)
    return facts


_FAMILY_READERS = {
    "qwen": _read_qwen1,
    "bloom": _read_bloom,
    "opt": _read_opt,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "falcon": _read_falcon,
    "phi": _read_phi,
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
}


def _moe(reader: _ConfigReader, model_type: str, num_layers: int) -> MoESpec | None:
    cfg = reader.config
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts")
    if not experts:
        return None
    experts = int(experts)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or 2)
    expert_size = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    layers = list(range(num_layers))
    if model_type.startswith("deepseek"):
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        moe_layers = [i for i in layers if i >= first_dense and i % freq == 0]
        shared = int(cfg.get("n_shared_experts") or 0)
        return MoESpec(
            num_experts=experts, top_k=top_k, expert_intermediate_size=expert_size,
            num_shared_experts=shared, shared_expert_intermediate_size=shared * expert_size,
            moe_layers=tuple(moe_layers), dense_layers=tuple(i for i in layers if i not in moe_layers),
            router_bias=cfg.get("topk_method") == "noaux_tc",
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step = int(cfg.get("decoder_sparse_step") or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = [i for i in layers if i not in mlp_only and (i + 1) % step == 0]
        shared_size = int(cfg.get("shared_expert_intermediate_size") or 0)
        return MoESpec(
            num_experts=experts, top_k=top_k, expert_intermediate_size=expert_size,
            num_shared_experts=1 if shared_size else 0, shared_expert_intermediate_size=shared_size,
            moe_layers=tuple(moe_layers), dense_layers=tuple(i for i in layers if i not in moe_layers),
            shared_expert_gate=bool(shared_size),
        )
    return MoESpec(num_experts=experts, top_k=top_k, expert_intermediate_size=expert_size,
                   moe_layers=tuple(layers))


def _attention(reader: _ConfigReader, model_type: str, facts: dict[str, Any], num_layers: int) -> AttentionSpec:
    cfg = reader.config
    heads, kv_heads = facts["heads"], facts["kv_heads"]
    window = _sliding_window(cfg, model_type)
    layer_types = _layer_types(cfg, model_type, num_layers, window)
    qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2")
    if cfg.get("kv_lora_rank"):
        return AttentionSpec(
            kind="MLA", num_heads=heads, num_kv_heads=heads,
            head_dim=int(cfg.get("qk_nope_head_dim", 0)) + int(cfg.get("qk_rope_head_dim", 0)),
            q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim", 0)), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim", 0)),
            v_head_dim=int(cfg.get("v_head_dim", 0)), sliding_window=window, layer_types=layer_types,
        )
    if kv_heads == heads:
        kind = "MHA"
    elif kv_heads == 1:
        kind = "MQA"
    else:
        kind = "GQA"
    return AttentionSpec(kind=kind, num_heads=heads, num_kv_heads=kv_heads, head_dim=facts["head_dim"],
                         sliding_window=window, layer_types=layer_types, qk_norm=qk_norm)


def _sliding_window(cfg: dict[str, Any], model_type: str) -> int | None:
    window = cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        return None
    return int(window) if isinstance(window, int) and window > 0 else None


def _layer_types(cfg: dict[str, Any], model_type: str, num_layers: int, window: int | None) -> tuple[str, ...]:
    explicit = cfg.get("layer_types")
    if isinstance(explicit, list) and len(explicit) == num_layers:
        return tuple("sliding" if "sliding" in str(kind) else "full" for kind in explicit)
    if window is None:
        return ("full",) * num_layers
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    if model_type in ("qwen2", "qwen2_moe"):  # layers below max_window_layers use full attention
        full_below = int(cfg.get("max_window_layers") or 0)
        return tuple("full" if i < full_below else "sliding" for i in range(num_layers))
    return ("sliding",) * num_layers


def _positional(reader: _ConfigReader, model_type: str, facts: dict[str, Any]) -> PositionalEncoding:
    cfg = reader.config
    if model_type == "bloom" or (model_type == "falcon" and cfg.get("alibi")):
        return PositionalEncoding(kind="alibi")
    if model_type == "opt":
        return PositionalEncoding(kind="learned", learned_positions=int(cfg.get("max_position_embeddings", 2048)) + 2)
    if model_type == "gpt2":
        return PositionalEncoding(kind="learned", learned_positions=int(cfg.get("n_positions", 1024)))
    return PositionalEncoding(kind="rope", rope=_rope(cfg))


def _rope(cfg: dict[str, Any]) -> RopeSpec:
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    if scaling is None and params and params.get("rope_type", "default") != "default":
        scaling = params  # transformers 5 folds scaling into rope_parameters
    theta = (cfg.get("rope_theta") or params.get("rope_theta") or cfg.get("rotary_emb_base")
             or cfg.get("rope_embedding_base") or 10000.0)
    partial = cfg.get("partial_rotary_factor") or cfg.get("rotary_pct") or params.get("partial_rotary_factor") or 1.0
    kind = factor = original = None
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        original = scaling.get("original_max_position_embeddings")
    return RopeSpec(theta=float(theta), scaling_type=kind, scaling_factor=float(factor) if factor else None,
                    original_max_position=original, partial_rotary_factor=float(partial),
                    scaling=dict(scaling) if scaling else None)
