"""DeepSeek-V2 / V2-Lite / V3 (multi-head latent attention, routed and shared experts) against transformers
on the same random weights: greedy tokens identical and log-probabilities within 1e-3 with chunked prefill;
TP 2 (V2), TP 2 with expert parallelism and PP 2 (V3) as TP 1; the latent cache's bytes per token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.families import (
    assert_close,
    assert_ranks_hold_what_plan_says,
    assert_served_like_transformers,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)
from llmctl.engine.layers.moe import Routing, route

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
    return save_routed_moe(deepseek_config(family, len(tokenizer)), folder, tokenizer)


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("deepseek")
    return {family: save_deepseek(family, tmp / family, tokenizer)
            for family in ("deepseek-v2", "deepseek-v2-lite", "deepseek-v3")}


@pytest.mark.parametrize("family", ["deepseek-v2", "deepseek-v2-lite", "deepseek-v3"])
def test_deepseek_matches_transformers(models, tokenizer, family):
    """8 prompts × 64 greedy tokens as transformers, log-probabilities within 1e-3, chunked prefill."""
    single, _ = engine_outputs(models[family])
    assert_close(transformers_reference(models[family], tokenizer), single)
    if family == "deepseek-v2":  # TP 2 splits the heads of q_b, kv_b and o: TP 1's tokens, plan's bytes per rank
        sharded, memory = engine_outputs(models[family], tensor_parallel_size=2)
        assert_close(single, sharded)
        assert_ranks_hold_what_plan_says(models[family], memory)


@pytest.mark.parametrize("family", ["deepseek-v2", "deepseek-v3"])
def test_routing_equals_transformers_routers(family, tokenizer):
    """Group-limited softmax (V2) and sigmoid with the correction bias (V3): the same experts and weights as
    transformers' own router modules, for 64 tokens."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from llmctl.checkpoint.spec import ModelSpec
    from llmctl.engine.models.deepseek import DeepseekForCausalLM

    config = deepseek_config(family, len(tokenizer))
    router = (DeepseekV3TopkRouter if family == "deepseek-v3" else DeepseekV2TopkRouter)(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        bias = getattr(router, "e_score_correction_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=gen))
    hidden = torch.randn(64, config.hidden_size, generator=gen)
    logits, expected_weights, expected_ids = router(hidden)
    routing = DeepseekForCausalLM.routing_for(ModelSpec.from_config(config.to_dict()), config)
    weights, ids = route(logits, routing, bias)
    order, expected_order = ids.argsort(dim=-1), expected_ids.argsort(dim=-1)
    assert torch.equal(ids.gather(1, order), expected_ids.gather(1, expected_order))
    assert torch.allclose(weights.gather(1, order), expected_weights.gather(1, expected_order), atol=1e-6)
    assert isinstance(routing, Routing) and routing.num_groups == 4  # the groups limited the choice


def test_expert_parallel_and_pipeline_stages_equal_tp1(models):
    """V3 at TP 2 with --enable-expert-parallel (8 of 16 experts whole per rank) and at PP 2 (dense layer 0
    and sparse layer 1 on the first stage): TP 1's tokens, and plan's bytes on each expert-parallel rank."""
    prompts = ["The capital of France is", "Hello, my name is", "def fibonacci(n):"]
    folder = models["deepseek-v3"]
    single, _ = engine_outputs(folder, prompts, tokens=24)
    spread, memory = engine_outputs(folder, prompts, tokens=24, tensor_parallel_size=2, enable_expert_parallel=True)
    assert_close(single, spread, prompts)
    assert_ranks_hold_what_plan_says(folder, memory, expert_ranks=2)
    staged, _ = engine_outputs(folder, prompts, tokens=24, pipeline_parallel_size=2)
    assert_close(single, staged, prompts)


def test_the_cache_holds_latents_not_keys_and_values(models):
    """Per token and layer the pool holds kv_lora_rank + qk_rope_head_dim values (32 + 8 = 40 float32s), not
    2 × heads × head_dim (2 × 4 × 24 = 192) — counted from the engine's own cache tensors."""
    from llmctl import LLM

    llm = LLM(str(models["deepseek-v2"]), max_model_len=256, kv_cache_memory=8 * 1024**2)
    try:
        loaded = llm.engine.loaded
        caches = loaded.kv_caches
        pool = {cache.kv.data_ptr(): cache.kv for cache in caches.values()}
        slots = loaded.kv_pool.num_blocks * 16
        assert len(caches) == 3 and sum(t.numel() for t in pool.values()) == 3 * slots * (32 + 8)
        assert loaded.backend.name == "mla"
    finally:
        llm.shutdown()


def test_served_through_the_openai_client(models, tokenizer):
    assert_served_like_transformers(models["deepseek-v2"], tokenizer)


@pytest.mark.parametrize("flag, value, message", [
    ("attention_backend", "torch", "multi-head latent attention.*leave --attention-backend at auto"),
    ("kv_cache_dtype", "fp8", "latent cache of MLA models is kept in the model's dtype"),
])
def test_what_the_latent_cache_cannot_do_is_refused(models, flag, value, message):
    from llmctl import LLM
    from llmctl.engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match=message):
        LLM(str(models["deepseek-v2-lite"]), max_model_len=256, **{flag: value})
