"""The pooling endpoints of `llmctl serve` against sentence-transformers and transformers, through the official
openai client and plain httpx in Jina's and Cohere's shapes: a tiny decoder embedding model on the paged engine
(Qwen3 layout, last-token pooling, Matryoshka sizes) and a tiny BERT cross-encoder behind an API key."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch

from helpers.cross_encoders import same_order
from helpers.server_helpers import start_server

TEXTS = ["The quick brown fox", "jumps over the lazy dog", "Hello world!"]
QUERY = "abc def"
DOCUMENTS = ["abc", "xyz qq", "def abc ab", "m n o p q r"]
KEY = "pooling-key"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tokenizer):
    from helpers.decoder_embedders import write_decoder_embedder

    return write_decoder_embedder(tmp_path_factory.mktemp("embedder"), "qwen3", tokenizer, matryoshka=(16, 32))


@pytest.fixture(scope="module")
def embedding_server(embedder):
    server = start_server(str(embedder), "--served-model-name", "emb", "--max-model-len", "64",
                          "--max-num-batched-tokens", "128")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(embedder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embedder), device="cpu")


def test_openai_embeddings_equal_sentence_transformers(embedding_server, reference, tokenizer):
    client = openai.OpenAI(base_url=embedding_server.url + "/v1", api_key="unused")
    response = client.embeddings.create(model="emb", input=TEXTS)
    ours = np.array([d.embedding for d in response.data])
    assert np.abs(ours - reference.encode(TEXTS)).max() < 1e-4
    assert response.usage.prompt_tokens == sum(len(tokenizer.encode(t)) for t in TEXTS)
    packed = client.embeddings.create(model="emb", input=TEXTS[0], encoding_format="base64").data[0].embedding
    assert np.abs(np.frombuffer(base64.b64decode(packed), "<f4") - ours[0]).max() < 1e-6  # the client decodes it
    by_ids = client.embeddings.create(model="emb", input=[tokenizer.encode(TEXTS[1])]).data[0].embedding
    assert np.abs(np.array(by_ids) - ours[1]).max() < 1e-5
    raw = client.embeddings.create(model="emb", input=TEXTS, extra_body={"normalize": False}).data
    raw_norms = [float(np.linalg.norm(d.embedding)) for d in raw]  # the pooled vectors before the layout's Normalize
    assert all(abs(norm - 1) > 1e-3 for norm in raw_norms) and np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert np.abs(np.array([d.embedding for d in raw]) / np.array(raw_norms)[:, None] - ours).max() < 1e-4
    cut = np.array([d.embedding for d in client.embeddings.create(model="emb", input=TEXTS, dimensions=16).data])
    assert np.abs(cut - reference.encode(TEXTS, truncate_dim=16, normalize_embeddings=True)).max() < 1e-4


def test_embedding_model_scores_and_pools(embedding_server, reference):
    scores = httpx.post(embedding_server.url + "/v1/score", json={"text_1": TEXTS[0], "text_2": TEXTS}).json()
    vectors = reference.encode(TEXTS, normalize_embeddings=True)
    assert np.abs(np.array([d["score"] for d in scores["data"]]) - vectors @ vectors[0]).max() < 1e-4
    pooled = httpx.post(embedding_server.url + "/pooling", json={"input": TEXTS[2]}).json()
    assert np.abs(np.array(pooled["data"][0]["data"]) - vectors[2]).max() < 1e-4


def test_bad_pooling_requests_are_400s_naming_the_field(embedding_server):
    client = openai.OpenAI(base_url=embedding_server.url + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model="emb", input=TEXTS, dimensions=8)
    assert error.value.body["param"] == "dimensions" and "takes dimensions 16, 32" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model="emb", input="word " * 100)
    assert error.value.body["param"] == "input" and "maximum context length is 64" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="pooling model"):
        client.chat.completions.create(model="emb", messages=[{"role": "user", "content": "hi"}])
    answer = httpx.post(embedding_server.url + "/v1/score", json={"text_1": ["a", "b", "c"], "text_2": ["a", "b"]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "text_1"


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    from helpers.cross_encoders import write_cross_encoder

    return write_cross_encoder(tmp_path_factory.mktemp("cross-encoder"), "bert", 1)


@pytest.fixture(scope="module")
def rerank_server(cross_encoder):
    server = start_server(str(cross_encoder), "--served-model-name", "reranker", "--api-key", KEY)
    yield server
    server.stop()


def _post(server, path, body, key=KEY):
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"})


def test_rerank_in_jina_and_cohere_shapes_equals_cross_encoder(rerank_server, cross_encoder):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(cross_encoder), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    jina = _post(rerank_server, "/v1/rerank", {"model": "reranker", "query": QUERY, "documents": DOCUMENTS,
                                               "top_n": 2}).json()
    assert [r["index"] for r in jina["results"]] == list(np.argsort(-expected)[:2])
    assert all(abs(r["relevance_score"] - expected[r["index"]]) < 1e-4 and r["document"]["text"] == DOCUMENTS[r["index"]]
               for r in jina["results"])
    cohere = _post(rerank_server, "/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS],
                                              "return_documents": False}).json()
    scores = np.array([r["relevance_score"] for r in sorted(cohere["results"], key=lambda r: r["index"])])
    assert np.abs(scores - expected).max() < 1e-4 and "document" not in cohere["results"][0]
    ranked = [r["relevance_score"] for r in cohere["results"]]
    assert ranked == sorted(ranked, reverse=True) and same_order(scores, expected)  # most relevant first
    assert cohere["usage"]["total_tokens"] > 0


def test_score_forms_and_classify(rerank_server, cross_encoder):
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    expected = CrossEncoder(str(cross_encoder), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    one_to_many = _post(rerank_server, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert np.abs(np.array([d["score"] for d in one_to_many["data"]]) - expected).max() < 1e-4
    pairwise = _post(rerank_server, "/score", {"queries": [QUERY] * 2, "documents": DOCUMENTS[:2]}).json()
    assert np.abs(np.array([d["score"] for d in pairwise["data"]]) - expected[:2]).max() < 1e-4
    classes = _post(rerank_server, "/classify", {"input": DOCUMENTS}).json()
    tokenizer = AutoTokenizer.from_pretrained(str(cross_encoder))
    model = AutoModelForSequenceClassification.from_pretrained(str(cross_encoder)).eval()
    with torch.no_grad():
        probs = torch.sigmoid(model(**tokenizer(DOCUMENTS, padding=True, return_tensors="pt")).logits).numpy()
    assert np.abs(np.array([d["probs"] for d in classes["data"]]) - probs).max() < 1e-4
    assert classes["data"][0]["label"] == "class_0" and classes["data"][0]["num_classes"] == 1


def test_rerank_refusals(rerank_server):
    assert _post(rerank_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS}, key="wrong").status_code == 401
    empty = _post(rerank_server, "/v1/rerank", {"query": QUERY, "documents": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "documents"
    blank = _post(rerank_server, "/v1/rerank", {"query": "", "documents": DOCUMENTS})
    assert blank.status_code == 400 and blank.json()["error"]["param"] == "query"
    long = _post(rerank_server, "/v1/score", {"text_1": QUERY, "text_2": "a " * 80})
    assert long.status_code == 400 and "maximum is 64" in long.json()["error"]["message"]
    embeddings = _post(rerank_server, "/v1/embeddings", {"input": "a"})
    assert embeddings.status_code == 400 and "cross-encoder" in embeddings.json()["error"]["message"]
    paths = httpx.get(rerank_server.url + "/openapi.json").json()["paths"]
    rerank = paths["/v1/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert rerank["required"] == ["query", "documents"] and {"/score", "/classify", "/pooling"} <= set(paths)


def test_bench_serve_measures_the_rerank_endpoint(rerank_server, tmp_path, default_source):
    import json

    from helpers.cli_process import run_cli

    out = tmp_path / "rerank.json"
    result = run_cli("bench", "serve", "--base-url", rerank_server.url, "--backend", "vllm-rerank", "--endpoint",
                     "/v1/rerank", "--model", "reranker", "--tokenizer", str(default_source.path), "--dataset-name",
                     "random", "--num-prompts", "4", "--random-input-len", "8", "--result-filename", str(out),
                     "--api-key", KEY)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["completed"] == 4 and data["failed"] == 0 and data["total_output_tokens"] == 0
    assert all(length > 0 for length in data["input_lens"]) and data["mean_e2el_ms"] > 0
