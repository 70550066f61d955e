"""Encoder models (BERT-style: all-MiniLM-L6-v2, and cross-encoders through encoder_classifier) for the
pooling endpoints.

Encoders need no KV cache or scheduler, so they run through transformers' own modules;
pooling and normalization follow the model's sentence-transformers configuration
(1_Pooling/config.json, modules.json), mean pooling and L2 normalization by default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmctl.checkpoint.pooling import ENCODER_TYPES, GENERATIVE_SUFFIXES, pooling_spec
from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.front.encoder_classifier import EncoderClassifier
from llmctl.engine.front.encoder_loading import load_encoder
from llmctl.engine.pooling.config import dimensions_problem as pooled_dimensions_problem
from llmctl.errors import LlmctlError

ENCODER_POOLING = {"CLS": "cls", "MEAN": "mean", "MAX": "max"}  # what this path pools


def is_embedding_model(spec: ModelSpec) -> bool:
    generative = any(a.endswith(GENERATIVE_SUFFIXES) for a in spec.architectures)
    return not generative and spec.model_type in ENCODER_TYPES


@dataclass
class Pooling:
    mode: str  # "mean" | "cls" | "max"
    normalize: bool
    matryoshka: bool = False  # trained so that its embeddings may be cut short (vLLM's is_matryoshka)
    dimensions: tuple[int, ...] = ()  # the sizes it may be cut to ((): any)


def read_pooling(folder: Path) -> Pooling:
    """The encoder's pooling as llmctl.checkpoint.pooling reads it (mean and normalized without a layout)."""
    spec = pooling_spec(folder, {"model_type": "bert", **json.loads((folder / "config.json").read_text())})
    if spec is None or spec.pooling not in ENCODER_POOLING:
        raise LlmctlError(f"{spec.pooling if spec else 'this'} pooling is not implemented for encoders: llmctl "
                          "pools CLS, MEAN or MAX")
    return Pooling(ENCODER_POOLING[spec.pooling], spec.normalize, spec.matryoshka, spec.dimensions)


def dimensions_problem(pooling: Pooling, size: int, dimensions: object) -> str | None:
    """Why a request's `dimensions` cannot be served by this encoder; None when it can."""
    return pooled_dimensions_problem(pooling.matryoshka, pooling.dimensions, size, dimensions)


class EmbeddingModel:
    def __init__(self, source: ModelSource, spec: ModelSpec, max_model_len: int | None = None,
                 device: str = "cpu", allow_pickle_weights: bool = False) -> None:
        from transformers import AutoModel

        self.source, self.spec = source, spec
        self.tokenizer, self.model = load_encoder(source, AutoModel, device, allow_pickle_weights)
        self.device = torch.device(device)
        self.pooling = read_pooling(source.path)
        self.max_model_len = min(max_model_len or spec.max_context, spec.max_context)

    def token_ids(self, item: str | list[int]) -> list[int]:
        if isinstance(item, str):
            return self.tokenizer.encode(item, add_special_tokens=True)
        return list(item)

    @torch.inference_mode()
    def embed(self, inputs: list[str | list[int]], dimensions: int | None = None) -> tuple[torch.Tensor, int]:
        """[N, hidden] embeddings (the first `dimensions`, normalized after the cut as vLLM does) and the
        number of input tokens."""
        ids = [self.token_ids(item) for item in inputs]
        for index, row in enumerate(ids):
            if len(row) > self.max_model_len:
                raise LlmctlError(f"input {index} has {len(row)} tokens; this model's maximum is {self.max_model_len}")
        longest = max(len(row) for row in ids)
        pad = self.tokenizer.pad_token_id or 0
        batch = torch.full((len(ids), longest), pad, dtype=torch.long)
        mask = torch.zeros(len(ids), longest, dtype=torch.long)
        for row, tokens in enumerate(ids):
            batch[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        hidden = self.model(input_ids=batch.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        vectors = self._pool(hidden.float(), mask.to(self.device))
        if dimensions is not None:
            vectors = vectors[:, :dimensions]
        if self.pooling.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors.cpu(), int(mask.sum())

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling.mode == "cls":
            return hidden[:, 0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling.mode == "max":
            return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def encoder_model_for(config: Any) -> EmbeddingModel | EncoderClassifier | None:
    """The encoder an EngineConfig names, loaded for embeddings or classification (cross-encoders); None for a
    model the engine runs."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    try:
        spec = load_spec(resolve_model(config.model, config.revision, show_progress=False))  # metadata only
    except (LlmctlError, OSError, ValueError):
        return None  # the engine's load says what is wrong, as it would without this look
    if not is_embedding_model(spec):
        return None
    source = resolve_model(config.model, config.revision, weights=True, show_progress=False)
    if any(a.endswith("ForSequenceClassification") for a in spec.architectures):
        return EncoderClassifier(source, spec, config.max_model_len, allow_pickle_weights=config.allow_pickle_weights)
    return EmbeddingModel(source, spec, config.max_model_len, allow_pickle_weights=config.allow_pickle_weights)
