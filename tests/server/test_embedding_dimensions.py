"""/v1/embeddings' `dimensions` (vLLM's Matryoshka cut) against sentence-transformers' truncate_dim, on a tiny
BERT sentence-transformers model whose config names its Matryoshka sizes; sizes it does not name are 400s."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from helpers.server_helpers import start_server

TEXTS = ["a b c", "c b", "a"]


@pytest.fixture(scope="module")
def matryoshka_model(tmp_path_factory):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoModel, BertConfig, BertTokenizerFast

    base = tmp_path_factory.mktemp("matryoshka")
    (base / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]))
    BertTokenizerFast(vocab_file=str(base / "vocab.txt")).save_pretrained(base / "bert")
    torch.manual_seed(0)
    AutoModel.from_config(BertConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, max_position_embeddings=64)).save_pretrained(base / "bert")
    body = Transformer(str(base / "bert"))
    SentenceTransformer(modules=[body, Pooling(32, pooling_mode="mean"), Normalize()], device="cpu").save(
        str(base / "st"))
    config = json.loads((base / "st" / "config.json").read_text())
    (base / "st" / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16, 32]}))
    return base / "st"


def test_dimensions_cut_as_sentence_transformers_truncate_dim(matryoshka_model):
    from sentence_transformers import SentenceTransformer

    server = start_server(str(matryoshka_model), "--served-model-name", "mini")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        reference = SentenceTransformer(str(matryoshka_model), device="cpu")
        for size in (8, 16):
            ours = np.array([d.embedding for d in client.embeddings.create(model="mini", input=TEXTS,
                                                                           dimensions=size).data])
            expected = reference.encode(TEXTS, truncate_dim=size, normalize_embeddings=True)
            assert ours.shape == (3, size) and np.abs(ours - expected).max() < 1e-5
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="mini", input=TEXTS, dimensions=12)
        assert "8, 16, 32" in str(refused.value) and "dimensions" in str(refused.value)
    finally:
        server.stop()
