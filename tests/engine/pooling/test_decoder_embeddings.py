"""Decoder embedding models on the paged engine (LLM.embed) against sentence-transformers' own encode: a tiny
Qwen3 with last-token pooling and Normalize (Qwen3-Embedding's layout, Matryoshka sizes in its config) and a
tiny Llama with mean pooling."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = ["The quick brown fox", "jumps over the lazy dog, twice or more", "a", "Hello world!"]


@pytest.fixture(scope="module")
def embedders(tmp_path_factory, tokenizer):
    from helpers.decoder_embedders import write_decoder_embedder

    base = tmp_path_factory.mktemp("embedders")
    return {"qwen3": write_decoder_embedder(base, "qwen3", tokenizer, matryoshka=(16, 32)),
            "llama": write_decoder_embedder(base, "llama", tokenizer, normalize=False)}


def _reference(folder, texts, **kwargs):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    if model.tokenizer.pad_token is None:
        model.tokenizer.pad_token = model.tokenizer.eos_token
    return model.encode(texts, **kwargs)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_llm_embed_equals_sentence_transformers(embedders, family):
    from llmctl import LLM

    llm = LLM(str(embedders[family]), max_model_len=128, max_num_batched_tokens=64)
    ours = np.array([o.outputs.embedding for o in llm.embed(TEXTS)])
    expected = _reference(embedders[family], TEXTS)
    assert ours.shape == expected.shape == (len(TEXTS), 64)
    cosine = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert np.abs(ours - expected).max() < 1e-4 and cosine.min() > 0.9999
    if family == "qwen3":
        cut = np.array([o.outputs.embedding for o in llm.embed(TEXTS, _dims(16))])
        expected = _reference(embedders[family], TEXTS, truncate_dim=16, normalize_embeddings=True)  # cut, then normalized (vLLM)
        assert cut.shape == (len(TEXTS), 16) and np.abs(cut - expected).max() < 1e-4
        with pytest.raises(Exception, match="takes dimensions 16, 32"):
            llm.embed(TEXTS, _dims(8))
    with pytest.raises(Exception, match="serves no text generation"):
        llm.generate("a")


def _dims(size):
    from llmctl import PoolingParams

    return PoolingParams(dimensions=size)
