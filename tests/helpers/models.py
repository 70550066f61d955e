"""Random-weight test models built from transformers' own config classes."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def save_random_model(model_config, folder: Path, tokenizer, max_shard_size: str = "5GB") -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config).to(torch.float32).eval()
    with torch.no_grad():  # random weights large enough that outputs depend on every part
        for param in model.parameters():
            param.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(folder)
    return folder




def small_config(family: str, tokenizer):
    from transformers import BloomConfig, LlamaConfig, MistralConfig

    return {
        "llama-gqa": LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256),
        "bloom-alibi": BloomConfig(vocab_size=len(tokenizer), hidden_size=72, n_layer=2, n_head=6),
        "mistral-window": MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256, sliding_window=5),
    }[family]


def random_model(config, folder: Path, tokenizer) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def quantized_model(folder: Path, method: str, tokenizer, tmp: Path) -> Path:
    from llmctl.quant.pipeline import quantize_model
    from llmctl.quant.rtn import QuantConfig
    from llmctl.quant.writer import quantization_config, write_checkpoint

    config = QuantConfig(bits=4, group_size=32, symmetric=method == "gptq")
    torch.manual_seed(1)
    result = quantize_model(folder, method, config, torch.randint(0, 400, (4, 32)))
    out = tmp / f"{folder.name}-{method}"
    out.mkdir()
    write_checkpoint(out, result.tensors)
    model_config = json.loads((folder / "config.json").read_text())
    model_config["quantization_config"] = quantization_config(method, config)
    (out / "config.json").write_text(json.dumps(model_config))
    tokenizer.save_pretrained(out)
    return out


