"""vLLM's PoolingParams and the outputs of pooling requests (`LLM.embed`, `LLM.classify`, `LLM.score`,
`LLM.encode`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PoolingParams:
    dimensions: int | None = None  # Matryoshka models: the first N dimensions, normalized after the cut
    normalize: bool | None = None  # embeddings: L2-normalize (None: as the model's layout says)
    use_activation: bool | None = None  # classifiers: softmax (or sigmoid for one label); None: on


@dataclass
class PoolingOutput:
    data: Any  # torch.Tensor: the pooled vector, or [tokens, hidden] for ALL pooling


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: PoolingOutput
    finished: bool = True


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
