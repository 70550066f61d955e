"""Embeddings of many short texts: `llmctl serve` against sentence-transformers' `encode` (its default batch
size, 32) on the same decoder embedding model, in one run. The model is Qwen3-Embedding-0.6B-shaped (random
weights, last-token pooling, Normalize; --layers cuts its depth for a quicker run), saved in
sentence-transformers' layout with its weights in --checkpoint-dtype (bfloat16, as Qwen3-Embedding ships); the
texts are sentences of 6 to 24 words, new ones each round (none in the server's prefix cache).

    python benchmarks/embedding_throughput.py [--texts 1000] [--layers 28] [--request-size 32] [--rounds 2]
        [--checkpoint-dtype bfloat16|float32] [--reference-dtype auto|float32|bfloat16] [--dtypes auto,float32]

sentence-transformers loads the model as it does by default (--reference-dtype auto: transformers' default, the
checkpoint's dtype), or in the dtype asked. One server per --dtypes entry, each llmctl's --dtype (auto: its
default; bfloat16 runs llmctl's bfloat16 GEMM, on AMX tiles or with AVX512-BF16, where the CPU has them). Each gets the
texts as /v1/embeddings requests of --request-size inputs, all sent at once, the vectors asked in base64 (as
the official openai client asks by default); both sides count the same tokens (the model's tokenizer). Prints
each side's seconds and tokens/s per round, the ratio, and the lowest cosine between the server's vectors and
sentence-transformers'."""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test helpers: server, model writer

WORDS = ("the a model server token batch prefix cache engine fast small clear request answer vector text query "
         "document rank score memory step kernel layer head pool embed search index shard").split()


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24))).capitalize() + "." for _ in range(count)]


def qwen3_embedding(folder: Path, layers: int, dtype: str) -> Path:
    import torch
    from transformers import AutoTokenizer

    from helpers.decoder_embedders import write_decoder_embedder
    from llmctl.checkpoint.source import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    shape = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128)
    return write_decoder_embedder(folder, "qwen3", tokenizer, shape=shape, dtype=getattr(torch, dtype))


def sentence_transformers_run(model, inputs: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = model.encode(inputs)
    return time.perf_counter() - started, vectors


async def _server_run(url: str, inputs: list[str], size: int) -> tuple[float, np.ndarray]:
    import httpx

    async with httpx.AsyncClient(timeout=3600) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(*(client.post(url + "/v1/embeddings", json={
            "input": inputs[i:i + size], "encoding_format": "base64"})  # as the openai client asks by default
            for i in range(0, len(inputs), size)))
        seconds = time.perf_counter() - started
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:1]
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for a in answers for d in a.json()["data"]]
    return seconds, np.stack(vectors)


def _served_dtype(log: str) -> str:
    """The dtype the server's startup line says it runs the model in."""
    found = re.search(r"\), dtype (\w+) on ", log)
    return found.group(1) if found else "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--request-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="auto,float32")
    parser.add_argument("--checkpoint-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--reference-dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    args = parser.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from helpers.server_helpers import start_server

    with tempfile.TemporaryDirectory() as scratch:
        folder = qwen3_embedding(Path(scratch), args.layers, args.checkpoint_dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        kwargs = {} if args.reference_dtype == "auto" else {"model_kwargs": {"dtype": getattr(torch, args.reference_dtype)}}
        reference = SentenceTransformer(str(folder), device="cpu", **kwargs)
        reference.encode(texts(32, seed=-1))  # warm-up
        theirs_dtype = str(next(reference.parameters()).dtype).removeprefix("torch.")
        print(f"model: Qwen3-Embedding-0.6B shape, {args.layers} layers, {args.checkpoint_dtype} weights; "
              f"{args.texts} texts a round; sentence-transformers runs it in {theirs_dtype}")
        for dtype in args.dtypes.split(","):
            server = start_server(str(folder), "--max-model-len", "512", "--dtype", dtype, timeout=600)
            ours_dtype = _served_dtype(server.log) if dtype == "auto" else dtype
            try:
                asyncio.run(_server_run(server.url, texts(64, seed=-1), args.request_size))  # warm-up
                for round_ in range(args.rounds):
                    inputs = texts(args.texts, seed=round_ + 100 * len(dtype))
                    tokens = sum(len(ids) for ids in tokenizer(inputs)["input_ids"])
                    ours, vectors = asyncio.run(_server_run(server.url, inputs, args.request_size))
                    theirs, expected = sentence_transformers_run(reference, inputs)
                    cosine = (vectors * expected).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(expected, axis=1)
                    print(f"--dtype {dtype} ({ours_dtype}) round {round_ + 1} ({tokens:,} tokens): llmctl serve "
                          f"{ours:.2f} s ({tokens / ours:,.0f} tokens/s); sentence-transformers encode "
                          f"({theirs_dtype}) {theirs:.2f} s "
                          f"({tokens / theirs:,.0f} tokens/s); ratio {theirs / ours:.2f}x; lowest cosine "
                          f"{cosine.min():.6f}")
            finally:
                server.stop()


if __name__ == "__main__":
    main()
