"""Llama 4 text natively: chunked attention (chunks of 8 here) on three layers in four with interleaved-pair
rotary and a weightless QK L2-norm, NoPE full attention with temperature tuning (floor_scale lowered so that it
moves within the test's positions), interleaved MoE and dense layers, sigmoid routing on the experts' inputs and a
shared expert — against transformers on the same random weights: greedy tokens identical and log-probabilities
within 1e-3 with chunked prefill; the torch and Triton-interpreter backends; TP 2 (sliced and expert parallel)
equal to TP 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    assert_backend_matches_transformers,
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)


def llama4_config(vocab: int):
    from transformers import Llama4TextConfig

    return Llama4TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_local_experts=4, num_experts_per_tok=2, attention_chunk_size=8,
                            interleave_moe_layer_step=2, floor_scale=4, attn_scale=0.5, max_position_embeddings=256,
                            architectures=["Llama4ForCausalLM"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(llama4_config(len(tokenizer)), tmp_path_factory.mktemp("llama4") / "llama4", tokenizer)


def test_llama4_matches_transformers_natively(folder, tokenizer):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation
    from llmctl.sizing.kv import kv_groups

    spec = load_spec(resolve_model(str(folder), weights=False))
    assert implementation(spec) == ("llmctl", "")  # the fallback refuses chunked attention
    assert spec.attention.chunked and spec.attention.layer_types == ("sliding",) * 3 + ("full",)
    assert spec.moe.moe_layers == (1, 3) and spec.intermediate_size == 96
    # the chunked layers' KV group keeps one chunk's worth, giving back the blocks before it (test_hybrid_kv.py)
    assert kv_groups(spec).windows == (None, 8, 8, 8)  # vLLM's rule: groups as large as the smaller kind
    single, _ = engine_outputs(folder)
    assert_close(transformers_reference(folder, tokenizer), single)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_chunks_through_the_triton_and_torch_backends(folder, tokenizer, backend):
    assert_backend_matches_transformers(folder, tokenizer, backend)


@pytest.mark.parametrize("expert_parallel", [True, False])
def test_tp2_equals_tp1(folder, expert_parallel):
    assert_tp2_equals_tp1(folder, expert_parallel)


def test_the_published_multimodal_checkpoint_serves_its_language_model(tmp_path, tokenizer, caplog):
    """Scout and Maverick are published as Llama4ForConditionalGeneration: the language model under text_config and
    `language_model.`, beside a vision tower not built yet — served text-only, and said so at load."""
    import torch
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = llama4_config(len(tokenizer)).to_dict()
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=56,
                  patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)
    config = Llama4Config(text_config=text, vision_config=vision, architectures=["Llama4ForConditionalGeneration"])
    folder = save_routed_moe(config, tmp_path / "llama4_multimodal", tokenizer, Llama4ForConditionalGeneration)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    ours, _ = engine_outputs(folder, prompts, tokens=12)
    assert "served text-only" in caplog.text
    # transformers' generate crashes on the multimodal class without images: its own language model, taken out
    text_only = tmp_path / "language_model"
    whole = Llama4ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    language = whole.language_model  # a Llama4ForCausalLM inside it
    language.config.architectures = ["Llama4ForCausalLM"]
    language.save_pretrained(text_only)
    tokenizer.save_pretrained(text_only)
    assert_close(transformers_reference(text_only, tokenizer, prompts=prompts, max_tokens=12), ours, prompts)
