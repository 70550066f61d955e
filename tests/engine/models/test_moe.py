"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers on the same random
weights: greedy tokens identical and log-probabilities within 1e-3, with chunked prefill; TP 2 as TP 1."""

from __future__ import annotations

import pytest
import torch

from helpers.families import (
    assert_close,
    assert_ranks_hold_what_plan_says,
    engine_outputs,
    moe_config,
    transformers_reference,
)
from helpers.models import save_random_model
from llmctl.engine.layers.cpu_gemm import pack_weight
from llmctl.engine.layers.moe import Routing, dense_expert, grouped_experts, route


@pytest.mark.parametrize("family", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_moe_families_match_transformers_and_tp2(tmp_path, tokenizer, family):
    """8 prompts × 64 greedy tokens as transformers (chunked prefill; prompt log-probabilities too); TP 2
    gives TP 1's tokens, each rank holding plan's weight and KV bytes."""
    folder = save_random_model(moe_config(family, len(tokenizer)), tmp_path / family, tokenizer)
    single, _ = engine_outputs(folder)
    assert_close(transformers_reference(folder, tokenizer), single)
    sharded, memory = engine_outputs(folder, tensor_parallel_size=2)
    assert [tokens for tokens, _, _ in sharded] == [tokens for tokens, _, _ in single]
    assert_close(single, sharded)
    assert_ranks_hold_what_plan_says(folder, memory)


def test_expert_parallel_tp2_equals_tp1(tmp_path, tokenizer):
    """--enable-expert-parallel at TP 2: each rank holds 8 of the 16 experts whole (and half the shared
    expert and attention); the tokens are TP 1's and each rank holds what `plan --enable-expert-parallel` says."""
    folder = save_random_model(moe_config("qwen2-moe", len(tokenizer)), tmp_path / "qwen2-moe", tokenizer)
    prompts = ["The capital of France is", "Hello, my name is", "def fibonacci(n):"]
    single, _ = engine_outputs(folder, prompts, tokens=24)
    spread, memory = engine_outputs(folder, prompts, tokens=24, tensor_parallel_size=2, enable_expert_parallel=True)
    assert_close(single, spread, prompts)
    assert_ranks_hold_what_plan_says(folder, memory, expert_ranks=2)
    staged, _ = engine_outputs(folder, prompts, tokens=24, pipeline_parallel_size=2)  # dense layer 0, sparse 1–2
    assert_close(single, staged, prompts)


def test_served_with_expert_parallelism_through_the_openai_client(tmp_path, tokenizer):
    import openai

    from helpers.server_helpers import start_server

    folder = save_random_model(moe_config("mixtral", len(tokenizer)), tmp_path / "mixtral", tokenizer)
    prompt = "The capital of France is"
    [(reference, _, _)] = transformers_reference(folder, tokenizer, prompts=[prompt], max_tokens=16)
    server = start_server(str(folder), "--served-model-name", "mixtral", "--tensor-parallel-size", "2",
                          "--enable-expert-parallel", "--max-model-len", "256")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        served = client.completions.create(model="mixtral", prompt=prompt, max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
        assert served.choices[0].text == tokenizer.decode(reference, skip_special_tokens=True)
    finally:
        server.stop()


def test_experts_that_do_not_spread_evenly_are_refused_before_any_rank_starts(tmp_path, tokenizer):
    from llmctl import LLM
    from llmctl.engine.errors import EngineConfigError

    config = moe_config("mixtral", len(tokenizer))
    config.num_local_experts = 6
    folder = save_random_model(config, tmp_path / "mixtral6", tokenizer)
    with pytest.raises(EngineConfigError, match=r"6 experts cannot be spread evenly over 4 expert-parallel ranks.*"
                                                r"TP sizes that work: 1, 2;"):
        LLM(str(folder), tensor_parallel_size=4, enable_expert_parallel=True)


def test_grouped_experts_equal_every_token_through_its_own_experts():
    """The sort-and-group computation against the plain definition, token by token."""
    gen = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts = 37, 24, 16, 6
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / 5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / 5
    weights, ids = route(torch.randn(tokens, experts, generator=gen), Routing(top_k=3, renormalize=True))
    assert torch.allclose(weights.sum(-1), torch.ones(tokens))
    expected = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for k in range(3):
            gate, up = (w13[ids[t, k]] @ x[t]).split(inter)
            expected[t] += weights[t, k] * (w2[ids[t, k]] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(grouped_experts(x, weights, ids, experts, dense_expert(w13, w2)), expected,
                               atol=1e-5, rtol=1e-5)
    packed = [(pack_weight(w13[e]), pack_weight(w2[e])) for e in range(experts)]  # the CPU GEMM's layout
    assert all(pair[0] is not None for pair in packed)
    torch.testing.assert_close(grouped_experts(x, weights, ids, experts, dense_expert(w13, w2, packed)), expected,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens,experts,top_k,first", [(1, 8, 2, 0), (37, 6, 3, 0), (40, 4, 2, 4)])
def test_fused_moe_kernel_equals_the_grouped_experts(tokens, experts, top_k, first):
    """The Triton grouped GEMM (interpreted on CPUs, compiled on a GPU and for sm_80/89/90 by the compile check) against
    the torch path; `first` 4: an expert-parallel rank holding experts 4–7 of 8, the others' pairs skipped."""
    from llmctl.kernels.fused_moe import align_pairs, fused_moe

    gen = torch.Generator().manual_seed(tokens)
    hidden, inter, total_experts = 32, 48, experts + first
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / 5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / 5
    weights, ids = route(torch.randn(tokens, total_experts, generator=gen), Routing(top_k, renormalize=False))
    expected = grouped_experts(x, weights, ids, experts, dense_expert(w13, w2), first)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted here
    got = fused_moe(*(t.to(device) for t in (x, weights, ids, w13, w2)), first)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    sorted_ids, block_expert, total = align_pairs(ids - first, experts, 16)
    placed = sorted_ids[:int(total)]
    assert sorted(placed[placed < tokens * top_k].tolist()) == \
        [p for p in range(tokens * top_k) if first <= int(ids.flatten()[p]) < first + experts]


@pytest.mark.parametrize("family", ["gpt_oss", "llama4"])
def test_fused_moe_kernel_runs_stacked_experts_as_their_grouped_path(family):
    """gpt-oss's experts (biases on both projections, the clamped SwiGLU) and Llama 4's (the routing weight on the
    input) through the Triton grouped GEMM (interpreted here) with the options the layer gives it, against the
    layer's own grouped path (which the family tests check against transformers)."""
    from llmctl.engine.distributed.group import TPGroup
    from llmctl.engine.layers.stacked_experts import ClampedSwigluExperts, StackedExperts
    from llmctl.kernels.fused_moe import fused_moe

    gen = torch.Generator().manual_seed(3)
    experts, hidden, inter, tokens = 4, 32, 24, 13
    routing = Routing(2, renormalize=False)
    layer = ClampedSwigluExperts(experts, hidden, inter, routing, TPGroup(), None, alpha=1.702, limit=1.5) \
        if family == "gpt_oss" else StackedExperts(experts, hidden, inter, routing, TPGroup(), None,
                                                   scale_inputs=True)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) / 3)
    x, logits = torch.randn(tokens, hidden, generator=gen), torch.randn(tokens, experts, generator=gen)
    expected = layer._own_experts(x, logits, None)  # CPU tensors: the grouped path
    weights, ids = route(logits, routing)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted here
    layer.to(device)
    got = fused_moe(*(t.to(device) for t in (x, weights, ids)), layer.w13, layer.w2, 0, **layer.fused_options())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
