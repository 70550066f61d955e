"""The model and inputs the GGUF writer is checked on against llama.cpp's own quantizer: weights drawn by numpy
from fixed seeds (not by a library's initialiser, whose order may change between versions), so the blocks
llama.cpp wrote from them once (tests/fixtures/llama_cpp, scripts/llama_cpp_gguf_vectors.py) stay comparable."""

from __future__ import annotations

from pathlib import Path

import numpy as np

K_QUANT_ROWS = {"normal": 8, "heavy_tailed": 8, "sparse": 4, "positive": 2, "zeros": 1, "constant": 1, "tiny": 1}


def k_quant_inputs() -> dict[str, np.ndarray]:
    """[rows, 512] float32 inputs of each kind a quantizer meets: Gaussian, heavy-tailed (Student t, ν = 2),
    mostly zeros, all positive, all zero, constant, and values below float16's range."""
    rng = np.random.default_rng(2026)
    shape = {kind: (rows, 512) for kind, rows in K_QUANT_ROWS.items()}
    return {
        "normal": rng.standard_normal(shape["normal"]).astype(np.float32),
        "heavy_tailed": (rng.standard_t(2, shape["heavy_tailed"]) * 0.02).astype(np.float32),
        "sparse": (rng.standard_normal(shape["sparse"]) * (rng.random(shape["sparse"]) < 0.05)).astype(np.float32),
        "positive": (np.abs(rng.standard_normal(shape["positive"])) + 1).astype(np.float32),
        "zeros": np.zeros(shape["zeros"], np.float32),
        "constant": np.full(shape["constant"], -0.5, np.float32),
        "tiny": (rng.standard_normal(shape["tiny"]) * 1e-20).astype(np.float32),
    }


def export_config(family: str, tokenizer):
    """llama: 8 layers (hidden 256: K-quant super-blocks; intermediate 288: ffn_down falls back to 32-weight
    blocks), tied embeddings. mixtral: 8 experts (llama.cpp's 8-expert rules for attn_k/v/output), 2 layers.
    qwen2_moe: 4 experts and a shared one, 2 layers. The mixtures tie their embeddings too (the vocabulary is the
    default model's 49,152 tokens: one such matrix is most of the quantizing time)."""
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=len(tokenizer), hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if family == "mixtral":
        return MixtralConfig(intermediate_size=256, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
                             tie_word_embeddings=True, architectures=["MixtralForCausalLM"], **common)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(intermediate_size=512, moe_intermediate_size=256, shared_expert_intermediate_size=512,
                              num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                              tie_word_embeddings=True, architectures=["Qwen2MoeForCausalLM"], **common)
    return LlamaConfig(intermediate_size=288, num_hidden_layers=8, tie_word_embeddings=True,
                       architectures=["LlamaForCausalLM"], **common)


def write_export_model(folder: Path, tokenizer, family: str = "llama") -> Path:
    """export_config(family)'s model with the default model's tokenizer, every weight N(0, 0.2) (norms 1 + that)
    drawn in order of name from seed 0, saved by transformers (experts under their per-expert names)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = export_config(family, tokenizer)
    model = AutoModelForCausalLM.from_config(config)
    rng = np.random.default_rng(0)
    state = model.state_dict()
    with torch.no_grad():
        for name in sorted(state):
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            values = rng.standard_normal(tuple(state[name].shape)).astype(np.float32) * np.float32(0.2)
            state[name].copy_(torch.from_numpy(values + 1 if name.endswith("norm.weight") else values))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
