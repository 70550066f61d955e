"""GLM-4.5 / 4.6 (glm4_moe) natively: biased q/k/v, QK-norm, a partial rotary, DeepSeek-V3's experts (sigmoid
with the correction bias, groups, shared experts, dense first layers) — against transformers on the same random
weights: greedy tokens identical and log-probabilities within 1e-3 with chunked prefill; TP 2 with expert
parallelism equal to TP 1, with plan's bytes on each rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)


def glm4_moe_config(vocab: int):
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                         n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
                         norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(glm4_moe_config(len(tokenizer)), tmp_path_factory.mktemp("glm4_moe") / "glm4_moe", tokenizer)


def test_glm4_moe_matches_transformers_natively(folder, tokenizer):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation

    spec = load_spec(resolve_model(str(folder), weights=False))
    assert implementation(spec) == ("llmctl", "")  # not the transformers fallback
    assert spec.attention.qk_norm and spec.moe.router_bias and spec.moe.moe_layers == (1, 2)
    single, _ = engine_outputs(folder)
    assert_close(transformers_reference(folder, tokenizer), single)


def test_expert_parallel_tp2_equals_tp1(folder):
    assert_tp2_equals_tp1(folder, expert_parallel=True)
