"""Reading config.json: every family names its facts differently (``n_layer``,
``num_hidden_layers``, ``n_embed``...); this module is the one place that knows those names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmctl.checkpoint.architecture import AttentionSpec, LayerLayout, MoESpec, PositionalEncoding, RopeSpec


class ConfigReader:
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


def _core(reader: ConfigReader, *, layers: tuple[str, ...] = ("num_hidden_layers", "n_layer", "num_layers"),
          hidden: tuple[str, ...] = ("hidden_size", "n_embd", "n_embed", "d_model"),
          heads: tuple[str, ...] = ("num_attention_heads", "n_head", "num_heads")) -> dict[str, Any]:
    num_layers = int(reader.get("num_layers", layers, 0))
    hidden_size = int(reader.get("hidden_size", hidden, 0))
    num_heads = int(reader.get("num_attention_heads", heads, 0))
    return {"num_layers": num_layers, "hidden": hidden_size, "heads": num_heads}


def _head_dim(reader: ConfigReader, facts: dict[str, Any]) -> int:
    explicit = reader.config.get("head_dim")
    if explicit:
        return int(explicit)
    return facts["hidden"] // facts["heads"] if facts["heads"] else 0


def read_llama_like(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts["kv_heads"] = int(cfg.get("num_key_value_heads") or facts["heads"])
    facts["head_dim"] = _head_dim(reader, facts)
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size", "ffn_hidden_size", "n_inner"), 0))
    bias = bool(cfg.get("attention_bias", False))
    layout: dict[str, Any] = dict(qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False)))
    facts["tied_default"] = model_type.startswith("gemma")
    if model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"):
        layout.update(qkv_bias=True, o_bias=False)
    if model_type == "gemma2":
        layout["norms_per_layer"] = 4
    if model_type in ("gemma3", "gemma3_text"):
        layout["norms_per_layer"] = 4
    if model_type == "phi3":
        layout.update(qkv_bias=False, o_bias=False)
    if model_type == "llama4_text":  # the dense layers' MLP; intermediate_size is each expert's
        facts["intermediate"] = int(cfg.get("intermediate_size_mlp") or facts["intermediate"])
    facts["layout"] = LayerLayout(**layout)
    facts["moe"] = read_moe(reader, model_type, facts["num_layers"])
    if facts["moe"] is not None and model_type == "mixtral":
        facts["intermediate"] = facts["moe"].expert_intermediate_size
    return facts


def _read_qwen1(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts["kv_heads"] = facts["heads"]
    facts["head_dim"] = int(cfg.get("kv_channels") or _head_dim(reader, facts))
    # Qwen1's intermediate_size counts both w1 and w2: each projection is half of it.
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0)) // 2
    facts["layout"] = LayerLayout(qkv_bias=True, o_bias=not cfg.get("no_bias", True))
    return facts


def _read_bloom(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts), intermediate=4 * facts["hidden"])
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=True, o_bias=True,
                                  mlp_bias=True, embedding_norm=True)
    facts["tied_default"] = True
    facts["activation"] = "gelu"
    return facts


def _read_opt(reader: ConfigReader, model_type: str) -> dict[str, Any]:
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


def _read_gpt2(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(cfg.get("n_inner") or 4 * facts["hidden"])
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True)
    facts["tied_default"] = True
    facts["activation"] = cfg.get("activation_function", "gelu_new")
    return facts


def _read_gpt_neox(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    cfg = reader.config
    facts = _core(reader)
    facts.update(kv_heads=facts["heads"], head_dim=_head_dim(reader, facts))
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0))
    bias = bool(cfg.get("attention_bias", True))
    facts["layout"] = LayerLayout(norm="layernorm", gated_mlp=False, qkv_bias=bias, o_bias=bias, mlp_bias=True,
                                  parallel_residual=bool(cfg.get("use_parallel_residual", True)))
    return facts


def _read_falcon(reader: ConfigReader, model_type: str) -> dict[str, Any]:
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


def _read_phi(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    facts = _core(reader)
    facts["kv_heads"] = int(reader.config.get("num_key_value_heads") or facts["heads"])
    facts["head_dim"] = _head_dim(reader, facts)
    facts["intermediate"] = int(reader.get("intermediate_size", ("intermediate_size",), 0))
    facts["layout"] = LayerLayout(norm="layernorm", norms_per_layer=1, gated_mlp=False, qkv_bias=True,
                                  o_bias=True, mlp_bias=True, lm_head_bias=True, parallel_residual=True)
    return facts


def _read_deepseek(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    facts = read_llama_like(reader, model_type)
    facts["layout"] = LayerLayout(qkv_bias=False, o_bias=False)
    return facts


def _read_glm4_moe(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """GLM-4.5: attention_bias biases q, k and v only (o_proj has none)."""
    facts = read_llama_like(reader, model_type)
    facts["layout"] = LayerLayout(qkv_bias=bool(reader.config.get("attention_bias", False)), o_bias=False)
    return facts


def _read_mamba2(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Mamba2: one norm and one mixer per layer (llmctl.checkpoint.mamba), no MLP, no attention."""
    facts = read_llama_like(reader, model_type)
    facts.update(intermediate=0, moe=None, layout=LayerLayout(norms_per_layer=1))
    return facts


def _read_mamba1(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Mamba, Falcon-Mamba: one norm and one mixer per layer (llmctl.checkpoint.mamba1), no attention heads at all."""
    facts = {"num_layers": int(reader.get("num_layers", ("num_hidden_layers", "n_layer"), 0)),
             "hidden": int(reader.get("hidden_size", ("hidden_size", "d_model"), 0)), "heads": 0, "kv_heads": 0,
             "head_dim": 0, "intermediate": 0, "moe": None, "layout": LayerLayout(norms_per_layer=1),
             "tied_default": True}
    return facts


def _read_jamba(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Jamba: Mamba (1) layers around attention every attn_layer_period-th layer, experts every
    expert_layer_period-th (softmax top-k, unnormalized), a SwiGLU MLP on the others."""
    cfg = reader.config
    facts = read_llama_like(reader, model_type)
    experts = int(cfg.get("num_experts") or 1)
    period, offset = int(cfg.get("expert_layer_period") or 1), int(cfg.get("expert_layer_offset") or 0)
    layers = range(facts["num_layers"])
    moe_layers = tuple(i for i in layers if i % period == offset) if experts > 1 else ()
    facts["moe"] = MoESpec(num_experts=experts, top_k=int(cfg.get("num_experts_per_tok") or 2),
                           expert_intermediate_size=facts["intermediate"], moe_layers=moe_layers,
                           dense_layers=tuple(i for i in layers if i not in moe_layers)) if moe_layers else None
    return facts


def _read_granite_hybrid(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Granite 4.0-H: every layer's MLP is the shared one (shared_intermediate_size); intermediate_size is each
    expert's, in the MoE sizes."""
    cfg = reader.config
    facts = read_llama_like(reader, model_type)
    shared = int(cfg.get("shared_intermediate_size") or 0)
    facts["intermediate"] = shared
    if facts["moe"] is not None:
        facts["moe"] = replace(facts["moe"], num_shared_experts=1, shared_expert_intermediate_size=shared)
    return facts


# Nemotron-H's block kinds: hybrid_override_pattern's letters (published configs), layers_block_type's words
# (as transformers writes them)
NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe", "mamba": "mamba",
                   "linear_attention": "mamba", "attention": "attention", "full_attention": "attention",
                   "mlp": "mlp", "moe": "moe"}


def nemotron_blocks(cfg: dict[str, Any]) -> tuple[str, ...]:
    """Each layer's block kind (an unknown one kept as written, for the engine to refuse by name)."""
    listed, pattern = cfg.get("layers_block_type"), cfg.get("hybrid_override_pattern")
    kinds = listed if isinstance(listed, list) else list(pattern) if isinstance(pattern, str) else []
    return tuple(NEMOTRON_BLOCKS.get(str(kind), str(kind)) for kind in kinds)


def _read_nemotron_h(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Nemotron-H: one block per layer behind one RMSNorm — Mamba2, NoPE attention, a ReLU² MLP (up, down) or
    DeepSeek-V3-routed ReLU² experts beside a shared one; transformers writes no num_hidden_layers."""
    cfg = reader.config
    blocks = nemotron_blocks(cfg)
    if blocks:
        cfg.setdefault("num_hidden_layers", len(blocks))
    if cfg.get("head_dim") is None and cfg.get("attention_head_dim"):  # the remote-code configs' name
        cfg["head_dim"] = cfg["attention_head_dim"]
    facts = read_llama_like(reader, model_type)
    bias = bool(cfg.get("attention_bias", False))
    facts["layout"] = LayerLayout(norms_per_layer=1, gated_mlp=False, qkv_bias=bias, o_bias=bias,
                                  mlp_bias=bool(cfg.get("mlp_bias", False)), blocks=blocks)
    facts["activation"] = cfg.get("mlp_hidden_act") or "relu2"
    facts["moe"] = _nemotron_moe(cfg, blocks)
    return facts


def _nemotron_moe(cfg: dict[str, Any], blocks: tuple[str, ...]) -> MoESpec | None:
    moe_layers = tuple(i for i, kind in enumerate(blocks) if kind == "moe")
    if not moe_layers:  # the dense sizes' configs still carry transformers' MoE defaults
        return None
    shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0) if cfg.get("n_shared_experts", 1) else 0
    latent = cfg.get("moe_latent_size")
    return MoESpec(num_experts=int(cfg.get("n_routed_experts") or 0), top_k=int(cfg.get("num_experts_per_tok") or 1),
                   expert_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
                   num_shared_experts=1 if shared else 0, shared_expert_intermediate_size=shared,
                   moe_layers=moe_layers, dense_layers=tuple(i for i, kind in enumerate(blocks) if kind == "mlp"),
                   router_bias=True, latent_size=int(latent) if latent else None)


def _read_falcon_h1(reader: ConfigReader, model_type: str) -> dict[str, Any]:
    """Falcon-H1: Llama's attention and SwiGLU MLP, and a Mamba2 mixer beside the attention in every layer."""
    facts = read_llama_like(reader, model_type)
    facts["layout"] = replace(facts["layout"], mixer_beside_attention=True)
    return facts


FAMILY_READERS = {
    "mamba": _read_mamba1,
    "falcon_mamba": _read_mamba1,
    "jamba": _read_jamba,
    "falcon_h1": _read_falcon_h1,
    "mamba2": _read_mamba2,
    "granitemoehybrid": _read_granite_hybrid,
    "nemotron_h": _read_nemotron_h,
    "qwen": _read_qwen1,
    "bloom": _read_bloom,
    "opt": _read_opt,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "falcon": _read_falcon,
    "phi": _read_phi,
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
    "glm4_moe": _read_glm4_moe,
}


def read_moe(reader: ConfigReader, model_type: str, num_layers: int) -> MoESpec | None:
    cfg = reader.config
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts")
    if not experts:
        return None
    experts = int(experts)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or 2)
    expert_size = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    layers = list(range(num_layers))
    if model_type.startswith("deepseek") or model_type == "glm4_moe":  # GLM-4.5: DeepSeek-V3's experts
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        moe_layers = [i for i in layers if i >= first_dense and i % freq == 0]
        shared = int(cfg.get("n_shared_experts") or 0)
        return MoESpec(
            num_experts=experts, top_k=top_k, expert_intermediate_size=expert_size,
            num_shared_experts=shared, shared_expert_intermediate_size=shared * expert_size,
            moe_layers=tuple(moe_layers), dense_layers=tuple(i for i in layers if i not in moe_layers),
            router_bias=cfg.get("topk_method") == "noaux_tc" or model_type in ("deepseek_v3", "glm4_moe"),
        )
    if model_type == "llama4_text":  # interleaved MoE and dense layers; a shared expert as wide as a routed one
        moe_layers = [i for i in layers if i in set(cfg.get("moe_layers") or layers)]
        return MoESpec(num_experts=experts, top_k=top_k, expert_intermediate_size=expert_size, num_shared_experts=1,
                       shared_expert_intermediate_size=expert_size, moe_layers=tuple(moe_layers),
                       dense_layers=tuple(i for i in layers if i not in moe_layers))
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"):
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
                   moe_layers=tuple(layers), expert_biases=model_type == "gpt_oss")


def read_attention(reader: ConfigReader, model_type: str, facts: dict[str, Any], num_layers: int) -> AttentionSpec:
    cfg = reader.config
    heads, kv_heads = facts["heads"], facts["kv_heads"]
    window = _sliding_window(cfg, model_type)
    layer_types = _layer_types(cfg, model_type, num_layers, window)
    qk_norm = model_type in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text", "gemma3", "gemma3_text",
                             "olmo2") \
        or (model_type == "glm4_moe" and bool(cfg.get("use_qk_norm")))
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
                         sliding_window=window, layer_types=layer_types, qk_norm=qk_norm,
                         qk_norm_whole=model_type == "olmo2", logit_softcap=cfg.get("attn_logit_softcapping"),
                         chunked=model_type == "llama4_text" and "sliding" in layer_types,
                         sinks=model_type == "gpt_oss",
                         output_gate=model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"))


def _sliding_window(cfg: dict[str, Any], model_type: str) -> int | None:
    window = cfg.get("attention_chunk_size") if model_type == "llama4_text" else cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_text") \
            and not cfg.get("use_sliding_window", False):
        return None
    return int(window) if isinstance(window, int) and window > 0 else None


def _layer_types(cfg: dict[str, Any], model_type: str, num_layers: int, window: int | None) -> tuple[str, ...]:
    explicit = cfg.get("layer_types")
    if isinstance(explicit, list) and len(explicit) == num_layers:
        return tuple("sliding" if "sliding" in str(kind) or "chunked" in str(kind) else "full" for kind in explicit)
    if window is None:
        return ("full",) * num_layers
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    if model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"):  # layers below max_window_layers use full attention
        full_below = int(cfg.get("max_window_layers") or 0)
        return tuple("full" if i < full_below else "sliding" for i in range(num_layers))
    return ("sliding",) * num_layers


def read_positional(reader: ConfigReader, model_type: str, facts: dict[str, Any]) -> PositionalEncoding:
    cfg = reader.config
    if model_type == "bloom" or (model_type == "falcon" and cfg.get("alibi")):
        return PositionalEncoding(kind="alibi")
    if model_type == "opt":
        return PositionalEncoding(kind="learned", learned_positions=int(cfg.get("max_position_embeddings", 2048)) + 2)
    if model_type == "gpt2":
        return PositionalEncoding(kind="learned", learned_positions=int(cfg.get("n_positions", 1024)))
    if model_type in ("mamba", "falcon_mamba", "jamba", "mamba2", "nemotron_h") or (model_type == "granitemoehybrid"
                                                  and cfg.get("position_embedding_type") != "rope"):
        return PositionalEncoding(kind="none")  # Mamba2 has no attention; Granite 4.0-H's and Nemotron-H's attend
        # without positions
    return PositionalEncoding(kind="rope", rope=_rope(cfg))


def _rope(cfg: dict[str, Any]) -> RopeSpec:
    params: dict[str, Any] = cfg["rope_parameters"] if isinstance(cfg.get("rope_parameters"), dict) else {}
    sliding_theta = cfg.get("rope_local_base_freq")  # Gemma 3 as published: its sliding layers' base
    if isinstance(params.get("full_attention"), dict):  # Gemma 3 as transformers 5 writes it: a set per kind
        sliding_theta = (params.get("sliding_attention") or {}).get("rope_theta")
        params = params["full_attention"]
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
                    scaling=dict(scaling) if scaling else None,
                    sliding_theta=float(sliding_theta) if sliding_theta is not None else None)
