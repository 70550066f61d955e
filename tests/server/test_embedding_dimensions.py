"""/v1/embeddings' `dimensions` (vLLM's Matryoshka cut) against sentence-transformers' truncate_dim, on a tiny
BERT sentence-transformers model whose config names its Matryoshka sizes (sizes it does not name are 400s);
and `bench serve --endpoint /v1/embeddings` against the same server."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from helpers.server_helpers import start_server

TEXTS = ["a b c", "c b", "a"]


@pytest.fixture(scope="module")
def matryoshka_model(tmp_path_factory):
    from helpers.embedding_models import write_matryoshka_model

    return write_matryoshka_model(tmp_path_factory.mktemp("matryoshka"))


@pytest.fixture(scope="module")
def server(matryoshka_model):
    server = start_server(str(matryoshka_model), "--served-model-name", "mini")
    yield server
    server.stop()


def test_dimensions_cut_as_sentence_transformers_truncate_dim(matryoshka_model, server):
    from sentence_transformers import SentenceTransformer

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    reference = SentenceTransformer(str(matryoshka_model), device="cpu")
    for size in (8, 16):
        ours = np.array([d.embedding for d in client.embeddings.create(model="mini", input=TEXTS, dimensions=size).data])
        expected = reference.encode(TEXTS, truncate_dim=size, normalize_embeddings=True)
        assert ours.shape == (3, size) and np.abs(ours - expected).max() < 1e-5
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="mini", input=TEXTS, dimensions=12)
    assert "8, 16, 32" in str(refused.value) and "dimensions" in str(refused.value)


def test_bench_serve_measures_the_embeddings_endpoint(server, tmp_path, default_source):
    """Random prompts built with a BPE tokenizer's words (the WordPiece model's own has none with a leading
    space); the server's usage counts them with the model's."""
    from helpers.cli_process import run_cli

    out = tmp_path / "embeddings.json"
    result = run_cli("bench", "serve", "--base-url", server.url, "--backend", "openai-embeddings", "--endpoint",
                     "/v1/embeddings", "--tokenizer", str(default_source.path), "--dataset-name", "random",
                     "--num-prompts", "6", "--random-input-len", "6", "--result-filename", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and data["failed"] == 0 and data["total_output_tokens"] == 0
    assert all(length > 0 for length in data["input_lens"]) and data["mean_e2el_ms"] > 0
    assert "mean_ttft_ms" not in data  # nothing streams: the whole answer's latency only, as vLLM reports it
    mismatch = run_cli("bench", "serve", "--base-url", server.url, "--backend", "openai-embeddings", "--endpoint",
                       "/v1/completions", "--num-prompts", "1")
    assert mismatch.returncode != 0 and "--backend vllm" in " ".join(mismatch.stderr.split())
