"""Jamba natively — Mamba (1) layers with dt, B and C RMS-normed with weights, NoPE attention every second layer,
Mixtral-style experts (softmax top-k, not renormalized) every second layer and a SwiGLU MLP on the others — against
transformers on the same random weights: greedy tokens identical and log-probabilities within 1e-3, prompts chunked
at 16 tokens; the attention through the Triton interpreter too; TP 2 and expert parallelism as TP 1. Parameter
counts as transformers counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    assert_backend_matches_transformers,
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    native_and_counted_as_transformers_counts,
    save_routed_moe,
    transformers_reference,
)

TOKENS = 40


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    from transformers import JambaConfig

    config = JambaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                         expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                         mamba_d_state=16, mamba_expand=2, mamba_dt_rank=8, max_position_embeddings=512)
    return save_routed_moe(config, tmp_path_factory.mktemp("jamba") / "m", tokenizer)


def test_jamba_matches_transformers(folder, tokenizer):
    spec = native_and_counted_as_transformers_counts(folder)
    assert spec.layer_pattern() == "mamba, attention+MoE, mamba, attention+MoE"
    reference = transformers_reference(folder, tokenizer, max_tokens=TOKENS)
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(reference, ours)


def test_jamba_attention_through_triton(folder, tokenizer):
    assert_backend_matches_transformers(folder, tokenizer, "triton")


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "ep2"])
def test_tp2_equals_tp1(folder, expert_parallel):
    assert_tp2_equals_tp1(folder, expert_parallel=expert_parallel)
