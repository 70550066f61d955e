"""Parameter counts: config formula vs. transformers' own models vs. safetensors headers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmctl.checkpoint.params import count_from_config, count_from_tensors
from llmctl.checkpoint.safetensors import read_weight_headers
from llmctl.checkpoint.source import resolve_model
from llmctl.checkpoint.spec import ModelSpec

# Small random models built by transformers from real architectures' config classes.
TINY = {
    "llama": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=200, tie_word_embeddings=False),
    "mistral": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=200, sliding_window=32),
    "qwen2": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=200),
    "qwen3": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=200, tie_word_embeddings=True),
    "mixtral": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=200, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=200,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "bloom": dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=200),
    "opt": dict(hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=200,
                max_position_embeddings=64, word_embed_proj_dim=32),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=200, n_positions=64),
    "gpt_neox": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=200, rotary_pct=0.25),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=200,
                   new_decoder_architecture=True, num_kv_heads=2),
    "phi": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=200),
    "gemma": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=200),
    "gemma2": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=200),
    "deepseek_v3": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=200, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=1,
                        topk_group=1),
    "gpt_oss": dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, vocab_size=200, num_local_experts=4, num_experts_per_tok=2),
    "llama4_text": dict(hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=200,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2),
    "mamba2": dict(hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=2,
                   expand=2, vocab_size=200, use_bias=True),
    "granitemoehybrid": dict(hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=200, num_local_experts=4,
                             num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8,
                             mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_expand=2),
    "qwen3_next": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=200, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       mlp_only_layers=[3], full_attention_interval=2),
}


def build_tiny(model_type: str, tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **TINY[model_type])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_config_count_matches_transformers_and_headers(model_type: str, tmp_path: Path) -> None:
    folder, model = build_tiny(model_type, tmp_path)
    source = resolve_model(str(folder))
    from llmctl.checkpoint.config_file import load_spec

    spec = load_spec(source)
    assert spec.model_type == model_type
    from_config = count_from_config(spec)
    from_torch = sum(p.numel() for p in model.parameters())  # tied weights appear once
    assert from_config.total == from_torch
    headers = read_weight_headers(source)
    assert headers.origin == "local headers"
    assert count_from_tensors(headers.tensors, spec).total == from_torch


def test_packed_int4_rotary_and_scales_are_counted_apart(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    spec = ModelSpec.from_config({
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
        "vocab_size": 100, "intermediate_size": 512, "tie_word_embeddings": True,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    })
    tensors = {
        "model.embed_tokens.weight": torch.zeros(100, 256, dtype=torch.float16),
        "lm_head.weight": torch.zeros(100, 256, dtype=torch.float16),  # tied copy: counted once
        "model.layers.0.mlp.down_proj.qweight": torch.zeros(512 // 8, 256, dtype=torch.int32),
        "model.layers.0.mlp.down_proj.qzeros": torch.zeros(4, 256 // 8, dtype=torch.int32),
        "model.layers.0.mlp.down_proj.scales": torch.zeros(4, 256, dtype=torch.float16),
        "model.layers.0.mlp.down_proj.g_idx": torch.zeros(512, dtype=torch.int32),
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(32, dtype=torch.float32),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    from huggingface_hub import parse_local_safetensors_file_metadata

    meta = parse_local_safetensors_file_metadata(path)
    counted = count_from_tensors({n: (i.dtype, tuple(i.shape)) for n, i in meta.tensors.items()}, spec)
    assert counted.total == 100 * 256 + 512 * 256
    assert counted.packed_int4_tensors == 1 and counted.skipped_tied_head
    assert counted.buffers == 32
    assert counted.quant_metadata == 4 * 32 + 4 * 256 + 512
    assert counted.bytes_by_dtype["I32"] == (64 * 256 + 4 * 32 + 512) * 4


def test_fp8_scale_tensors_are_reported_apart() -> None:
    spec = ModelSpec.from_config({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1,
                                  "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 512})
    tensors = {
        "model.layers.0.mlp.up_proj.weight": ("F8_E4M3", (512, 256)),
        "model.layers.0.mlp.up_proj.weight_scale_inv": ("F32", (4, 2)),
    }
    counted = count_from_tensors(tensors, spec)
    assert counted.total == 512 * 256 and counted.quant_metadata == 8
    assert counted.bytes_by_dtype == {"F8_E4M3": 512 * 256, "F32": 32}


def test_gpt_oss_120b_counts_its_published_parameters() -> None:
    """openai/gpt-oss-120b's config.json (its published fields) against its model card's 116.83B total."""
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]
    config = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", attention_bias=True, head_dim=64,
                  hidden_size=2880, intermediate_size=2880, layer_types=layer_types, num_attention_heads=64,
                  num_experts_per_tok=4, num_hidden_layers=36, num_key_value_heads=8, num_local_experts=128,
                  sliding_window=128, tie_word_embeddings=False, vocab_size=201088,
                  quantization_config={"quant_method": "mxfp4"})
    total = count_from_config(ModelSpec.from_config(config)).total
    assert abs(total - 116.83e9) / 116.83e9 < 1e-3, total


def test_granite_4_h_tiny_counts_its_published_parameters() -> None:
    """ibm-granite/granite-4.0-h-tiny's config.json (its published fields): 6.94B parameters on its model page;
    Mamba2 mixers on 36 layers, NoPE attention on 4, 64 experts and a shared MLP on all 40."""
    layer_types = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"]
                   + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)
    config = dict(architectures=["GraniteMoeHybridForCausalLM"], model_type="granitemoehybrid", hidden_size=1536,
                  num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4, intermediate_size=512,
                  shared_intermediate_size=1024, num_local_experts=64, num_experts_per_tok=6, vocab_size=100352,
                  tie_word_embeddings=True, mamba_d_state=128, mamba_n_groups=1, mamba_n_heads=48, mamba_d_head=64,
                  mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=256, position_embedding_type="nope",
                  layer_types=layer_types)
    spec = ModelSpec.from_config(config)
    total = count_from_config(spec).total
    assert abs(total - 6.94e9) / 6.94e9 < 1e-3, total
    assert spec.kv_bytes_per_token(2) == 4 * 2 * 4 * 128 * 2  # the 4 attention layers only
    assert spec.layer_pattern().startswith("5 mamba2+MoE, attention+MoE, 9 mamba2+MoE")


def test_qwen3_next_80b_counts_its_published_parameters() -> None:
    """Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (its published fields; no layer_types: every
    full_attention_interval-th layer attends) against its model card's 80B total; 36 gated DeltaNet layers."""
    config = dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=2048,
                  num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                  intermediate_size=5120, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                  num_experts=512, num_experts_per_tok=10, vocab_size=151936, linear_num_key_heads=16,
                  linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=False,
                  partial_rotary_factor=0.25, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    spec = ModelSpec.from_config(config)
    assert spec.recurrent is not None and len(spec.recurrent.layers) == 36
    total = count_from_config(spec).total
    assert abs(total - 80e9) / 80e9 < 1e-2, total
    # vLLM's gated_delta_net_state_shape per layer: conv (kernel - 1) × (2 · 16 · 128 + 32 · 128), state 32 × 128 × 128
    assert spec.state_bytes_per_sequence(2) == 36 * (3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128) * 2
