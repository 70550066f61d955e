"""Nemotron-H natively — one block per layer: Mamba2 mixers, NoPE attention, a squared-ReLU MLP, and squared-ReLU
experts routed as DeepSeek-V3's (sigmoid scores, a correction bias, two expert groups, a scaling factor) beside a
shared expert — against transformers on the same random weights: greedy tokens identical and log-probabilities
within 1e-3, prompts chunked at 16 tokens across an 8-token scan chunk, the attention through the Triton
interpreter too; TP 2 and expert parallelism as TP 1; the
latent experts of `moe_latent_size`. Parameter counts as transformers counts them (here, not in
tests/checkpoint/test_params.py, which the floor's transformers also runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    PROMPTS,
    assert_backend_matches_transformers,
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    native_and_counted_as_transformers_counts,
    save_routed_moe,
    transformers_reference,
)

TOKENS = 40
BLOCKS = ["mamba", "moe", "attention", "mlp", "mamba", "moe"]


def nemotron_h_config(vocab: int, **overrides):
    from transformers import NemotronHConfig

    settings = dict(vocab_size=vocab, hidden_size=64, layers_block_type=BLOCKS, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16,
                    n_groups=2, ssm_state_size=16, chunk_size=8, n_routed_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                    routed_scaling_factor=2.5, max_position_embeddings=512)
    return NemotronHConfig(**(settings | overrides))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(nemotron_h_config(len(tokenizer)), tmp_path_factory.mktemp("nemotron_h") / "m", tokenizer)


def test_nemotron_h_matches_transformers(folder, tokenizer):
    spec = native_and_counted_as_transformers_counts(folder)
    assert spec.layer_pattern() == "mamba2, MoE, attention, MLP, mamba2, MoE"
    assert spec.kv_bytes_per_token(2) == 2 * 2 * 16 * 2  # the one attention block's K and V
    reference = transformers_reference(folder, tokenizer, max_tokens=TOKENS)
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(reference, ours)


def test_nemotron_h_attention_through_triton(folder, tokenizer):
    assert_backend_matches_transformers(folder, tokenizer, "triton")


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "ep2"])
def test_tp2_equals_tp1(folder, expert_parallel):
    assert_tp2_equals_tp1(folder, expert_parallel=expert_parallel)


def test_latent_experts_match_transformers(tmp_path, tokenizer):
    """moe_latent_size: the experts work in a 32-wide latent between fc1_latent_proj and fc2_latent_proj."""
    config = nemotron_h_config(len(tokenizer), layers_block_type=["mamba", "moe", "attention", "moe"],
                               moe_latent_size=32)
    folder = save_routed_moe(config, tmp_path / "latent", tokenizer)
    native_and_counted_as_transformers_counts(folder)
    prompts = PROMPTS[:3]
    reference = transformers_reference(folder, tokenizer, prompts=prompts, max_tokens=16)
    ours, _ = engine_outputs(folder, prompts, tokens=16)
    assert_close(reference, ours, prompts)
