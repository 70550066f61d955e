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


def write_export_model(folder: Path, tokenizer) -> Path:
    """An 8-layer Llama (hidden 256: K-quant super-blocks; intermediate 288: ffn_down falls back to 32-weight
    blocks) with the default model's tokenizer and tied embeddings, its weights N(0, 0.2) from seed 0."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=288, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         architectures=["LlamaForCausalLM"])
    shapes = {name: tuple(t.shape) for name, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    rng = np.random.default_rng(0)
    tensors = {}
    for name in sorted(shapes):
        if name == "lm_head.weight":
            continue
        values = rng.standard_normal(shapes[name]).astype(np.float32) * np.float32(0.2)
        tensors[name] = torch.from_numpy(values + 1 if name.endswith("norm.weight") else values)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
