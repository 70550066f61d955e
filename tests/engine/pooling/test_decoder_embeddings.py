"""Decoder embedding models on the paged engine (LLM.embed) against sentence-transformers' own encode: a tiny
Qwen3 with last-token pooling and Normalize (Qwen3-Embedding's layout, Matryoshka sizes in its config) and a
tiny Llama with mean pooling."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.decoder_embedders import reference

TEXTS = ["The quick brown fox", "jumps over the lazy dog, twice or more", "a", "Hello world!"]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_llm_embed_equals_sentence_transformers(embedders, family):
    from llmctl import LLM

    llm = LLM(str(embedders[family]), max_model_len=128, max_num_batched_tokens=64)
    ours = np.array([o.outputs.embedding for o in llm.embed(TEXTS)])
    expected = reference(embedders[family], TEXTS)
    assert ours.shape == expected.shape == (len(TEXTS), 64)
    cosine = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert np.abs(ours - expected).max() < 1e-4 and cosine.min() > 0.9999
    if family == "qwen3":
        cut = np.array([o.outputs.embedding for o in llm.embed(TEXTS, _dims(16))])
        expected = reference(embedders[family], TEXTS, truncate_dim=16, normalize_embeddings=True)  # cut, then normalized (vLLM)
        assert cut.shape == (len(TEXTS), 16) and np.abs(cut - expected).max() < 1e-4
        with pytest.raises(Exception, match="takes dimensions 16, 32"):
            llm.embed(TEXTS, _dims(8))
    with pytest.raises(Exception, match="serves no text generation"):
        llm.generate("a")


def _dims(size):
    from llmctl import PoolingParams

    return PoolingParams(dimensions=size)


@pytest.mark.parametrize("parallel", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_sharded_pooling_equals_sentence_transformers(embedders, parallel):
    """TP ranks pool the all-reduced last hidden states; with PP the last stage pools and sends the outputs back
    with its (absent) sampled tokens."""
    from llmctl import LLM

    llm = LLM(str(embedders["llama"]), max_model_len=128, **parallel)
    try:
        ours = np.array([o.outputs.embedding for o in llm.embed(TEXTS)])
    finally:
        llm.shutdown()
    assert np.abs(ours - reference(embedders["llama"], TEXTS)).max() < 1e-4


def test_reward_conversion_returns_every_tokens_hidden_state(embedders):
    """--convert reward: ALL pooling, each prompt token's final hidden state, as transformers' last_hidden_state."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from llmctl import LLM

    folder = embedders["llama"]
    llm = LLM(str(folder), convert="reward", max_model_len=128)
    output = llm.encode(TEXTS[1])[0]
    ids = AutoTokenizer.from_pretrained(str(folder))(TEXTS[1])["input_ids"]
    with torch.no_grad():
        expected = AutoModel.from_pretrained(str(folder))(input_ids=torch.tensor([ids])).last_hidden_state[0]
    assert output.prompt_token_ids == ids and output.outputs.data.shape == expected.shape
    assert (output.outputs.data - expected).abs().max() < 1e-4


def test_a_bfloat16_embedding_checkpoint_runs_in_bfloat16_where_the_cpu_has_a_bfloat16_gemm(tmp_path, tokenizer):
    """dtype auto: a pooling checkpoint saved in bfloat16 (as Qwen3-Embedding ships) runs in bfloat16 on CPUs with
    llmctl's bfloat16 GEMM (AMX, AVX512-BF16) — as sentence-transformers loads it — else in float32; its vectors
    match sentence-transformers' own (bfloat16 too) as closely as two bfloat16 computations can."""
    import torch

    from helpers.decoder_embedders import write_decoder_embedder
    from llmctl import LLM
    from llmctl.kernels.cpu import bf16_panels_supported

    folder = write_decoder_embedder(tmp_path, "qwen3", tokenizer, dtype=torch.bfloat16)
    llm = LLM(str(folder), max_model_len=128)
    expected_dtype = torch.bfloat16 if bf16_panels_supported() else torch.float32
    print(f"bfloat16 checkpoint, dtype auto: {llm.engine.loaded.dtype} (bfloat16 GEMM here: {bf16_panels_supported()})")
    assert llm.engine.loaded.dtype == expected_dtype
    ours = np.array([o.outputs.embedding for o in llm.embed(TEXTS)])
    expected = reference(folder, TEXTS)
    assert (ours * expected).sum(1).min() > 0.999  # both normalized
