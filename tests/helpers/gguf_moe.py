"""Tiny mixture-of-experts GGUF files, written as llama.cpp's convert_hf_to_gguf.py writes them from a random
transformers model (Mixtral as `llama` with `expert_count`, `qwen2moe` with its gated shared expert, `qwen3moe`):
the router `ffn_gate_inp` in float32, each projection's experts stacked in one 3-D tensor (`ffn_gate_exps`
[E, I, H], `ffn_up_exps`, `ffn_down_exps`), quantized by gguf-py. The model returned holds what the file holds:
each quantized weight replaced by gguf-py's own round trip (quantize, then dequantize), the reference a reader of
the file must match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from helpers.gguf_models import VOCAB, _copy_tokenizer, _gguf_name, _metadata
from llmctl.checkpoint.gguf_architectures import interleave_rotary

MOE_ARCHS = {"mixtral": "llama", "qwen2moe": "qwen2moe", "qwen3moe": "qwen3moe"}  # ours -> the file's
MOE_NAMES = {"mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
             "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
             "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def moe_config(arch: str) -> Any:
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    if arch == "mixtral":
        return transformers.MixtralConfig(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **common)
    experts = dict(intermediate_size=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2)
    if arch == "qwen2moe":
        return transformers.Qwen2MoeConfig(shared_expert_intermediate_size=128, **experts, **common)
    return transformers.Qwen3MoeConfig(head_dim=32, norm_topk_prob=True, **experts, **common)


def write_moe_gguf(arch: str, path: Path, default_gguf: Path, qtype: str = "Q8_0") -> torch.nn.Module:
    """Write a random `arch` mixture of experts to `path`; returns the transformers model with the file's weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = moe_config(arch)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    writer = GGUFWriter(str(path), MOE_ARCHS[arch])
    _metadata(writer, MOE_ARCHS[arch], config)
    _expert_metadata(writer, arch, config)
    _copy_tokenizer(writer, default_gguf)
    state = model.state_dict()
    for name, tensor in state.items():
        for gguf_name, values in _gguf_tensors(arch, name, tensor.float().numpy(), config):
            if gguf_name.split(".")[-2] in ("ffn_gate_inp", "ffn_gate_inp_shexp") or values.ndim < 2 \
                    or values.shape[-1] % 32:
                writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
                continue
            kind = GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name, quantize(np.ascontiguousarray(values), kind), raw_dtype=kind)
        if tensor.shape[-1] % 32 == 0 and ("proj" in name or name.endswith(("embed_tokens.weight", "lm_head.weight"))):
            round_trip = dequantize(quantize(np.ascontiguousarray(tensor.float().numpy()), GGMLQuantizationType[qtype]),
                                    GGMLQuantizationType[qtype])
            state[name].copy_(torch.from_numpy(np.asarray(round_trip, dtype=np.float32).reshape(tensor.shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _expert_metadata(writer: GGUFWriter, arch: str, config: Any) -> None:
    writer.add_expert_count(config.num_local_experts if arch == "mixtral" else config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    if arch != "mixtral":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)


def _gguf_tensors(arch: str, name: str, values: np.ndarray, config: Any) -> list[tuple[str, np.ndarray]]:
    """The file's tensors for one of the model's: experts' fused gate/up split in two, Mixtral's Q/K interleaved."""
    parts = name.split(".")
    layer = parts[2] if parts[:2] == ["model", "layers"] else None
    if layer is not None and name.endswith("mlp.experts.gate_up_proj"):
        gate, up = np.split(values, 2, axis=1)
        return [(f"blk.{layer}.ffn_gate_exps.weight", gate), (f"blk.{layer}.ffn_up_exps.weight", up)]
    if layer is not None and name.endswith("mlp.experts.down_proj"):
        return [(f"blk.{layer}.ffn_down_exps.weight", values)]
    module = ".".join(parts[3:-1])
    if layer is not None and module in MOE_NAMES:
        return [(f"blk.{layer}.{MOE_NAMES[module]}.{parts[-1]}", values)]
    gguf_name = _gguf_name(MOE_ARCHS[arch], name)
    if gguf_name is None:
        return []
    if arch == "mixtral" and name.endswith(("q_proj.weight", "k_proj.weight")):
        values = interleave_rotary(values, config.num_attention_heads if "q_proj" in name else
                                    config.num_key_value_heads)
    return [(gguf_name, values)]
