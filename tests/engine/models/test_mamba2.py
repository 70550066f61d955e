"""Models with Mamba2 layers natively — Mamba2 (no attention at all) and Granite 4.0-H (Mamba2 with NoPE attention, a
shared MLP and experts) — against transformers on the same random weights: greedy tokens identical and
log-probabilities within 1e-3, with prompts chunked at 16 tokens across an 8-token scan chunk (so each sequence's
convolution window and SSM state are carried between steps), preempted and recomputed, as n > 1 sequences, split
over two pipeline stages and over two tensor-parallel ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    PROMPTS,
    assert_backend_matches_transformers,
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)
from llmctl import LLM, SamplingParams

TOKENS = 40
MIXER = dict(n_groups=2, chunk_size=8)  # two B/C groups: heads share them in pairs


def mamba2_config(vocab: int):
    from transformers import Mamba2Config

    return Mamba2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16,
                        state_size=16, expand=2, conv_kernel=4, tie_word_embeddings=False, **MIXER)


def granite_hybrid_config(vocab: int, experts: int):
    from transformers import GraniteMoeHybridConfig

    # Granite 4.0-H's shape: Mamba2 layers around one NoPE attention layer; multipliers far from 1
    return GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=experts, num_experts_per_tok=2,
        layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
        mamba_n_groups=2, mamba_chunk_size=8, mamba_expand=2, position_embedding_type="nope",
        embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.05, logits_scaling=3.0,
        max_position_embeddings=512)


@pytest.fixture(scope="module")
def mamba2(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(mamba2_config(len(tokenizer)), tmp_path_factory.mktemp("mamba2") / "m", tokenizer)


@pytest.fixture(scope="module")
def granite(tmp_path_factory, tokenizer) -> Path:
    config = granite_hybrid_config(len(tokenizer), experts=4)
    return save_routed_moe(config, tmp_path_factory.mktemp("granite_hybrid") / "m", tokenizer)


@pytest.fixture(scope="module")
def mamba2_reference(mamba2, tokenizer):
    return transformers_reference(mamba2, tokenizer, max_tokens=TOKENS)


def test_mamba2_matches_transformers(mamba2, mamba2_reference):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation

    spec = load_spec(resolve_model(str(mamba2), weights=False))
    assert implementation(spec) == ("llmctl", "") and spec.mixer is not None
    ours, _ = engine_outputs(mamba2, tokens=TOKENS)
    assert_close(mamba2_reference, ours)


def test_mamba2_prompts_scanned_together(mamba2, mamba2_reference):
    """All prompts in one step: those of similar lengths scanned as one batch, each padded to the longest of its
    group with dt = 0 (its state passing the padding unchanged)."""
    ours, _ = engine_outputs(mamba2, tokens=TOKENS, max_num_batched_tokens=512)
    assert_close(mamba2_reference, ours)


def test_mamba2_n_sequences_and_two_stages(mamba2, mamba2_reference):
    """n = 3 runs as three sequences with their own states (vLLM's fan-out); two pipeline stages hold their own
    layers' states."""
    llm = LLM(str(mamba2), max_model_len=256, max_num_batched_tokens=16, max_num_seqs=4)
    try:
        outputs = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, n=3))
    finally:
        llm.shutdown()
    for output, (tokens, _, _) in zip(outputs, mamba2_reference):
        assert [list(c.token_ids) for c in output.outputs] == [tokens] * 3
    staged, _ = engine_outputs(mamba2, PROMPTS[:3], tokens=TOKENS, pipeline_parallel_size=2)
    assert [t for t, _, _ in staged] == [t for t, _, _ in mamba2_reference[:3]]


def test_granite_hybrid_matches_transformers_and_preempts_alike(granite, tokenizer):
    """Against transformers; then 160 tokens each for 8 sequences in a budget of 8 states and 20 KV blocks (the
    states may take half of it: fewer slots than sequences, and the rest of the pool too small for the sequences
    that hold them), so sequences are preempted, their states freed and recomputed from zeros: the same tokens as
    with room."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    spec = load_spec(resolve_model(str(granite), weights=False))
    assert spec.recurrent is not None and spec.recurrent.layers == (0, 2, 3)
    reference = transformers_reference(granite, tokenizer, max_tokens=TOKENS)
    roomy, _ = engine_outputs(granite, tokens=160)
    assert_close(reference, [(t[:TOKENS], s[:TOKENS], p) for t, s, p in roomy])
    block = 16 * 2 * 2 * 16 * 4  # one attention layer: 16 tokens × K and V × 2 heads × 16 dims × float32
    llm = LLM(str(granite), max_model_len=256, max_num_batched_tokens=16, max_num_seqs=8,
              kv_cache_memory=spec.state_bytes_per_sequence(4) * 8 + 20 * block)
    try:
        assert llm.engine.scheduler.max_num_seqs < 8
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=160, ignore_eos=True))
        assert llm.engine.scheduler.num_preemptions > 0
    finally:
        llm.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outputs] == [t for t, _, _ in roomy]


@pytest.mark.parametrize("model", ["mamba2", "granite"])
def test_tp2_equals_tp1(model, request):
    """Heads, B/C groups and their rows of in_proj, the convolution and the norm split over two ranks; each rank
    holds the weights and states plan says."""
    assert_tp2_equals_tp1(request.getfixturevalue(model), expert_parallel=False)


def test_granite_hybrid_attention_through_triton(granite, tokenizer):
    assert_backend_matches_transformers(granite, tokenizer, "triton")


@pytest.mark.parametrize("flag", [{"enable_lora": True}, {"async_scheduling": True}])
def test_what_recurrent_layers_refuse_is_named(mamba2, flag):
    from llmctl.engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match="Mamba2 layers"):
        LLM(str(mamba2), max_model_len=256, **flag)


def test_mamba2_decodes_through_the_gpu_kernel(mamba2, mamba2_reference, monkeypatch):
    """The decode path GPUs take — kernels/recurrent_decode.py's in-place state update — under Triton's interpreter:
    transformers' tokens."""
    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    monkeypatch.setenv(KERNELS_ON_CPU, "1")
    ours, _ = engine_outputs(mamba2, PROMPTS[:3], tokens=8)
    assert_close([(t[:8], s[:8], p) for t, s, p in mamba2_reference[:3]], ours, PROMPTS[:3])


@pytest.mark.parametrize("kernels", ["cpu", "triton"])
def test_mamba2_decodes_through_the_cuda_graph_buffers(mamba2, mamba2_reference, monkeypatch, kernels):
    """Decode steps through the CUDA graphs' static buffers (captured and replayed on a GPU; run eagerly here): three
    sequences in the size-4 buffers, their state slots read on the device by the in-place kernels (C++, or GPUs'
    Triton ones interpreted) and the padding row's slot -1 storing nothing: transformers' tokens."""
    import torch

    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    capture = torch.cuda.is_available()  # scripts/gpu-check.sh runs it there
    tokens = TOKENS if kernels == "cpu" or capture else 8
    if kernels == "triton":
        monkeypatch.setenv(KERNELS_ON_CPU, "1")
    llm = LLM(str(mamba2), max_model_len=256, max_num_seqs=4, attention_backend="triton", dtype="float32",
              device="cuda" if capture else "auto", graph_buffers_on_cpu=not capture)
    graphs = llm.engine.executor.runner.graphs
    assert graphs is not None and graphs.state_slots is not None and bool(graphs.graphs) == capture
    replays: list[int] = []
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: replays.append(shape[0]) or run(batch, shape, *rest)
    try:
        outputs = llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    finally:
        llm.shutdown()
    assert replays and set(replays) == {4}  # every decode step: three rows and a padding row
    assert [list(o.outputs[0].token_ids) for o in outputs] == [t[:tokens] for t, _, _ in mamba2_reference[:3]]


def test_granite_hybrid_decodes_through_the_cuda_graph_buffers(granite, tokenizer):
    """Attention (the Triton backend, interpreted), Mamba2 state slots and experts in one graph step's buffers:
    three sequences in the size-4 buffers, transformers' tokens."""
    llm = LLM(str(granite), max_model_len=128, max_num_seqs=4, attention_backend="triton", dtype="float32",
              graph_buffers_on_cpu=True)
    graphs = llm.engine.executor.runner.graphs
    assert graphs is not None and graphs.state_slots is not None and graphs.kv_caches
    replays: list[int] = []
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: replays.append(shape[0]) or run(batch, shape, *rest)
    try:
        outputs = llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    finally:
        llm.shutdown()
    assert replays and set(replays) == {4}
    reference = transformers_reference(granite, tokenizer, prompts=PROMPTS[:3], max_tokens=6)
    assert [list(o.outputs[0].token_ids) for o in outputs] == [t for t, _, _ in reference]


def test_mamba2_sleeps_and_wakes_to_the_same_tokens(mamba2, mamba2_reference):
    """Sleep mode gives the state cache back with the KV pool (level 1) and the weights too (level 2)."""
    llm = LLM(str(mamba2), max_model_len=256, enable_sleep_mode=True)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    try:
        for level in (1, 2):
            llm.sleep(level)
            llm.wake_up()
            outputs = llm.generate(PROMPTS[:2], params)
            assert [list(o.outputs[0].token_ids) for o in outputs] == [t[:8] for t, _, _ in mamba2_reference[:2]]
    finally:
        llm.shutdown()
