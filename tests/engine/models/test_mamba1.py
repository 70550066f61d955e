"""Mamba (1) natively — Mamba (state-spaces/mamba-*) and Falcon-Mamba (dt, B and C normed without weights) —
against transformers on the same random weights: greedy tokens identical and log-probabilities within 1e-3, prompts
chunked at 16 tokens (each sequence's convolution window and scan state carried between steps), a prompt over
several of the scan's spans in one step, all prompts scanned together; TP 2 as TP 1. Parameter counts as
transformers counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    assert_close,
    assert_decodes_through_the_gpu_kernel,
    assert_tp2_equals_tp1,
    engine_outputs,
    native_and_counted_as_transformers_counts,
    save_routed_moe,
    transformers_reference,
)

TOKENS = 40
LONG = ["The history of the city goes back to a small fishing village on the river, where traders from the north "
        "and the south met every spring to exchange furs, salt, grain and stories. Over the centuries the village "
        "grew into a market town, then a walled city with a cathedral, a university and a harbour that sheltered "
        "ships from every corner of the known world, and its people came to be known for their"]


def mamba1_config(family: str, vocab: int):
    from transformers import FalconMambaConfig, MambaConfig

    config_class = {"mamba": MambaConfig, "falcon_mamba": FalconMambaConfig}[family]
    return config_class(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2,
                        conv_kernel=4, time_step_rank=8, use_bias=family == "mamba", tie_word_embeddings=False)


@pytest.fixture(scope="module", params=["mamba", "falcon_mamba"])
def folder(request, tmp_path_factory, tokenizer) -> Path:
    config = mamba1_config(request.param, len(tokenizer))
    return save_routed_moe(config, tmp_path_factory.mktemp(request.param) / "m", tokenizer)


def test_matches_transformers(folder, tokenizer):
    assert native_and_counted_as_transformers_counts(folder).layer_pattern() == "2 mamba"
    reference = transformers_reference(folder, tokenizer, max_tokens=TOKENS)
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(reference, ours)


def test_a_prompt_over_several_scan_spans_in_one_step(folder, tokenizer, monkeypatch):
    """Spans of 32 tokens' states (the scan holds that many at once), the state carried from one to the next."""
    from llmctl.engine.layers import selective_scan

    monkeypatch.setattr(selective_scan, "SPAN_VALUES", 32 * 128 * 16)  # 32 tokens × 128 channels × state 16
    assert len(tokenizer(LONG[0]).input_ids) > 64
    reference = transformers_reference(folder, tokenizer, prompts=LONG, max_tokens=8)
    ours, _ = engine_outputs(folder, LONG, tokens=8, max_num_batched_tokens=256)
    assert_close(reference, ours, LONG)


def test_prompts_scanned_together(folder, tokenizer):
    """All prompts in one step, token by token together, each padded to the longest with dt = 0."""
    reference = transformers_reference(folder, tokenizer, max_tokens=16)
    ours, _ = engine_outputs(folder, tokens=16, max_num_batched_tokens=512)
    assert_close(reference, ours)


def test_tp2_equals_tp1(folder):
    assert_tp2_equals_tp1(folder, expert_parallel=False)


def test_decodes_through_the_gpu_kernel(folder, tokenizer, monkeypatch):
    """Mamba (1)'s decode path on GPUs (kernels/recurrent_decode.py) under Triton's interpreter."""
    assert_decodes_through_the_gpu_kernel(folder, tokenizer, monkeypatch)
