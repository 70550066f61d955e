"""What differs between the GGUF architectures llmctl converts: tensor names, where the config comes
from, and what llama.cpp's converter (convert_hf_to_gguf.py) changed in the tensors.

- llama (and Mistral-style models, which llama.cpp writes as llama): Q/K rows interleaved for its rotary
  layout, undone here; config from the llama.* metadata (llmctl.checkpoint.gguf_convert);
- qwen2 (q/k/v biases), qwen3 (q/k norms), phi3 (fused qkv and gate/up), gemma2 and gemma3 (norms before
  and after attention and the MLP, stored as 1 + w by llama.cpp): rows as in Hugging Face's layout,
  config from transformers' own GGUF reader (`AutoConfig.from_pretrained(..., gguf_file=...)`), with
  what that reader leaves out of Gemma 3 set as llama.cpp runs it;
- mixtures of experts: Mixtral (llama with `llama.expert_count`), qwen2moe (a gated shared expert) and
  qwen3moe: the router `ffn_gate_inp`, and each projection's experts stacked in one 3-D tensor
  (`ffn_gate_exps` [E, I, H], ...), split here into Hugging Face's per-expert names; the expert sizes
  transformers' reader leaves at its defaults read from `expert_feed_forward_length` and
  `expert_shared_feed_forward_length`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.errors import UnsupportedModelError

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router (Mixtral's block_sparse_moe.gate: the engine reads both)
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
EXPERT_PROJECTIONS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_GEMMA_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True)
class GgufArchitecture:
    name: str
    layer_names: dict[str, str] = field(default_factory=lambda: dict(_LAYER_NAMES))
    interleaved_rotary: bool = False  # llama.cpp permuted Q/K rows (llama only)
    norm_offset: float = 0.0  # GGUF norm weights = Hugging Face's + this (Gemma: 1)

    def hf_name(self, gguf_name: str) -> str | None:
        """`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`; None for tensors the config
        encodes instead (rope_freqs) or that llmctl does not read."""
        if gguf_name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[gguf_name]
        if not gguf_name.startswith("blk."):
            return None
        _, layer, rest = gguf_name.split(".", 2)
        base, _, kind = rest.rpartition(".")
        if base in self.layer_names and kind in ("weight", "bias"):
            return f"model.layers.{layer}.{self.layer_names[base]}.{kind}"
        return None

    def gguf_name(self, hf_name: str) -> str | None:
        """The inverse of hf_name: `model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`."""
        globals_by_hf = {hf: gguf for gguf, hf in _GLOBAL_NAMES.items()}
        if hf_name in globals_by_hf:
            return globals_by_hf[hf_name]
        parts = hf_name.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5:
            return None
        module, kind = ".".join(parts[3:-1]), parts[-1]
        by_hf = {hf: gguf for gguf, hf in self.layer_names.items()}
        return f"blk.{parts[2]}.{by_hf[module]}.{kind}" if module in by_hf else None

    @staticmethod
    def experts_of(gguf_name: str) -> str | None:
        """`blk.3.ffn_gate_exps.weight` → `model.layers.3.mlp.experts.{}.gate_proj.weight` (an expert's name, its
        number left to fill in); None for any other tensor."""
        parts = gguf_name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in EXPERT_PROJECTIONS or parts[3] != "weight":
            return None
        return f"model.layers.{parts[1]}.mlp.experts.{{}}.{EXPERT_PROJECTIONS[parts[2]]}.weight"


def interleave_rotary(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's Q/K rows reordered so the rotary halves interleave."""
    return (weights.reshape(n_heads, 2, weights.shape[0] // n_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def deinterleave_rotary(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo interleave_rotary."""
    return (weights.reshape(n_heads, weights.shape[0] // n_heads // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


ARCHITECTURES = {
    "llama": GgufArchitecture("llama", interleaved_rotary=True),
    "qwen2": GgufArchitecture("qwen2"),
    "qwen3": GgufArchitecture("qwen3"),
    "phi3": GgufArchitecture("phi3", dict(_PHI3_NAMES)),
    "gemma2": GgufArchitecture("gemma2", dict(_GEMMA_NAMES), norm_offset=1.0),
    "gemma3": GgufArchitecture("gemma3", dict(_GEMMA_NAMES), norm_offset=1.0),
    "qwen2moe": GgufArchitecture("qwen2moe"),
    "qwen3moe": GgufArchitecture("qwen3moe"),
}


def gguf_architecture(name: str | None) -> GgufArchitecture:
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture '{name}' cannot be converted yet (supported: {', '.join(ARCHITECTURES)}): "
            "pass the original Hugging Face checkpoint")
    return ARCHITECTURES[name]


def transformers_config(gguf_path: Path, has_output_tensor: bool, arch: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face config transformers reads from the file's metadata, as a config.json dict; the
    head size from `attention.key_length` where the file has one (transformers reads it for Gemma only)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    data: dict[str, Any] = config.to_dict()
    data["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    data["tie_word_embeddings"] = not has_output_tensor
    data["torch_dtype"] = "float32"
    key_length = meta.get(f"{arch}.attention.key_length")
    if key_length:
        data["head_dim"] = int(key_length)
    for key in ("transformers_version", "_name_or_path", "dtype"):
        data.pop(key, None)
    if arch == "gemma3":
        _gemma3_as_llama_cpp(data, meta)
    if arch in ("qwen2moe", "qwen3moe"):
        _experts_as_llama_cpp(data, meta, arch)
    return data


def _experts_as_llama_cpp(data: dict[str, Any], meta: dict[str, Any], arch: str) -> None:
    """The expert sizes transformers' reader leaves at its defaults, from the file; Qwen3-MoE's top-k weights
    renormalised, as llama.cpp always runs it (Qwen2-MoE's are not)."""
    for key, setting in (("expert_feed_forward_length", "moe_intermediate_size"),
                         ("expert_shared_feed_forward_length", "shared_expert_intermediate_size")):
        if meta.get(f"{arch}.{key}"):
            data[setting] = int(meta[f"{arch}.{key}"])
    data["norm_topk_prob"] = arch == "qwen3moe"


def _gemma3_as_llama_cpp(data: dict[str, Any], meta: dict[str, Any]) -> None:
    """What transformers' GGUF reader leaves at Gemma 3's defaults, set as llama.cpp runs the file: the
    linear RoPE scaling that convert_hf_to_gguf.py writes (global layers only; the 4B-27B models' factor
    8), and the query scale, 1/√head_dim but 1/√(hidden/heads) for the 62-layer 27B (llama.cpp's
    llm_build_gemma3; transformers' default is 256 for every size)."""
    factor = meta.get("gemma3.rope.scaling.factor")
    if factor and meta.get("gemma3.rope.scaling.type", "linear") == "linear" and float(factor) != 1.0:
        full = data["rope_parameters"]["full_attention"]
        data["rope_parameters"]["full_attention"] = {**full, "rope_type": "linear", "factor": float(factor)}
    large = data["num_hidden_layers"] == 62
    data["query_pre_attn_scalar"] = data["hidden_size"] // data["num_attention_heads"] if large else data["head_dim"]
