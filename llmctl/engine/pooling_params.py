"""vLLM's PoolingParams and embedding outputs for `LLM.embed`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolingParams:
    dimensions: int | None = None  # Matryoshka models: the first N dimensions, normalized after the cut


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
