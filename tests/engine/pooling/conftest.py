"""Tiny decoder embedding models, written once for the pooling tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embedders(tmp_path_factory, tokenizer):
    from helpers.decoder_embedders import write_decoder_embedder

    base = tmp_path_factory.mktemp("embedders")
    return {"qwen3": write_decoder_embedder(base, "qwen3", tokenizer, matryoshka=(16, 32)),
            "llama": write_decoder_embedder(base, "llama", tokenizer, normalize=False)}
