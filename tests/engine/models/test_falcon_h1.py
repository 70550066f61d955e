"""Falcon-H1 natively — a Mamba2 mixer beside Llama's attention in every layer, with µP multipliers far from 1
everywhere transformers applies them — against transformers on the same random weights: greedy tokens identical and
log-probabilities within 1e-3, prompts chunked at 16 tokens across an 8-token scan chunk, the attention through the Triton interpreter too; the
mixer's gated norm
before the gate (norm_before_gate) and no norm at all (mamba_rms_norm false, the published models' setting); TP 2 as
TP 1. Parameter counts as transformers counts them (here: the floor's transformers runs
tests/checkpoint/test_params.py)."""

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

MULTIPLIERS = dict(embedding_multiplier=3.0, lm_head_multiplier=0.4, key_multiplier=0.6, attention_in_multiplier=1.5,
                   attention_out_multiplier=0.7, ssm_in_multiplier=1.3, ssm_out_multiplier=0.8,
                   ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 2.0], mlp_multipliers=[1.6, 0.6])


def falcon_h1_config(vocab: int, rms_norm: bool):
    from transformers import FalconH1Config

    return FalconH1Config(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=128, mamba_n_heads=8,
                          mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=8,
                          mamba_rms_norm=rms_norm, projectors_bias=rms_norm, max_position_embeddings=512,
                          **MULTIPLIERS)


@pytest.fixture(scope="module", params=[False, True], ids=["no-norm", "norm-before-gate"])
def folder(request, tmp_path_factory, tokenizer) -> Path:
    config = falcon_h1_config(len(tokenizer), rms_norm=request.param)
    return save_routed_moe(config, tmp_path_factory.mktemp("falcon_h1") / "m", tokenizer)


def test_falcon_h1_matches_transformers(folder, tokenizer):
    assert native_and_counted_as_transformers_counts(folder).layer_pattern() == "3 mamba2+attention"
    reference = transformers_reference(folder, tokenizer, max_tokens=40)
    ours, _ = engine_outputs(folder, tokens=40)
    assert_close(reference, ours, PROMPTS)


def test_falcon_h1_attention_through_triton(folder, tokenizer):
    """RoPE applied as the keys are stored, the key multiplier in the softmax scale."""
    assert_backend_matches_transformers(folder, tokenizer, "triton")


def test_tp2_equals_tp1(folder):
    assert_tp2_equals_tp1(folder, expert_parallel=False)
