"""What /score, /rerank and /classify share: class probabilities from whichever classifier is served (an
encoder cross-encoder through transformers, or a decoder classifier on the paged engine), and pair scores — a
one-label classifier's probability of the (query, document) pair encoded together, or, for an embedding model,
the cosine similarity of the two embeddings (vLLM scores both kinds)."""

from __future__ import annotations

import torch
from starlette.requests import Request

from llmctl.engine.front.embedding import EmbeddingModel
from llmctl.engine.front.encoder_classifier import EncoderClassifier, Pair
from llmctl.engine.pooling.params import PoolingParams
from llmctl.engine.pooling.scoring import cosine_scores
from llmctl.errors import LlmctlError
from llmctl.server.embeddings import embed
from llmctl.server.pooled import engine_pooler, on_encoder, pool_inputs
from llmctl.server.protocol import bad
from llmctl.server.state import ServerState


def labels_of(state: ServerState) -> list[str]:
    """The served classifier's labels, in output order."""
    if isinstance(state.encoder, EncoderClassifier):
        return state.encoder.labels
    if state.encoder is not None:
        raise bad(f"{state.model_name} is an embedding model: /classify needs a classifier", "model")
    pooler = engine_pooler(state, "classify", "/classify")
    return list(pooler.label_names) or [f"LABEL_{i}" for i in range(pooler.labels)]


async def classify(state: ServerState, request: Request, items: list[str | Pair | list[int]],
                   use_activation: bool = True, scores: bool = False) -> tuple[list[torch.Tensor], int]:
    """Each item's probabilities (raw scores without the activation; with `scores`, the cross-encoder's own
    score activation) and the input tokens."""
    labels_of(state)  # a 400 when no classifier is served
    encoder = state.encoder
    if isinstance(encoder, EncoderClassifier):
        activation = "none" if not use_activation else \
            encoder.score_activation if scores else encoder.classify_activation
        try:
            probs, tokens = await on_encoder(state, len(items), lambda: encoder.classify(items, activation))
        except LlmctlError as exc:
            raise bad(str(exc), "input") from None
        return list(probs), tokens
    tokenizer = state.ready_engine.tokenizer
    prompts = [list(tokenizer(item[0], item[1])["input_ids"]) if isinstance(item, tuple) else item for item in items]
    outputs = await pool_inputs(state, request, prompts, PoolingParams(use_activation=use_activation))
    return [o.outputs.data for o in outputs], sum(len(o.prompt_token_ids) for o in outputs)


async def score_pairs(state: ServerState, request: Request, pairs: list[Pair]) -> tuple[list[float], int]:
    """Each pair's relevance score and the input tokens."""
    if _serves_embeddings(state):
        texts: list[str | list[int]] = [text for pair in pairs for text in pair]
        vectors, tokens = await embed(state, request, texts, PoolingParams(normalize=True) if state.encoder is None
                                      else PoolingParams())
        return cosine_scores(vectors), tokens
    labels = labels_of(state)
    if len(labels) != 1:
        raise bad(f"{state.model_name} is a classifier with {len(labels)} labels: scores need a one-label "
                  "cross-encoder (or an embedding model); use /classify for its probabilities", "model")
    probs, tokens = await classify(state, request, list(pairs), scores=True)
    return [float(p[0]) for p in probs], tokens


def _serves_embeddings(state: ServerState) -> bool:
    if state.encoder is not None:
        return isinstance(state.encoder, EmbeddingModel)
    pooler = state.ready_engine.pooler
    return pooler is not None and pooler.task == "embed"
