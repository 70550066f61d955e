"""/v1/embeddings: an encoder embedding model through transformers (all-MiniLM-L6-v2), or a decoder embedding
model on the paged engine (Qwen3-Embedding, e5-mistral, gte-Qwen2)."""

from __future__ import annotations

import base64
import logging

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.engine.front.embedding import EmbeddingModel, dimensions_problem, encoder_model_for
from llmctl.engine.pooling.params import PoolingParams
from llmctl.errors import LlmctlError
from llmctl.server.models import check_model
from llmctl.server.pooled import engine_pooler, on_encoder, pool_inputs
from llmctl.server.pooling_fields import pooling_inputs
from llmctl.server.protocol import EMBEDDING_FIELDS, bad, warn_ignored
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json

logger = logging.getLogger("llmctl.server")


def load_encoder(state: ServerState) -> bool:
    """Serve an encoder (an embedding model or a cross-encoder) through transformers; False for engine models."""
    state.encoder = encoder = encoder_model_for(state.settings.engine_config)
    if isinstance(encoder, EmbeddingModel):
        logger.info("embedding model %s (%s pooling%s), %d dimensions", encoder.source.name, encoder.pooling.mode,
                    ", normalized" if encoder.pooling.normalize else "", encoder.spec.hidden_size)
    elif encoder is not None:
        logger.info("encoder classifier %s: %d label%s (%s); scores through %s", encoder.source.name,
                    len(encoder.labels), "" if len(encoder.labels) == 1 else "s", ", ".join(encoder.labels),
                    encoder.score_activation)
    return encoder is not None


async def embeddings(state: ServerState, request: Request) -> Response:
    if state.encoder is not None and not isinstance(state.encoder, EmbeddingModel):
        raise bad(f"{state.model_name} is a classifier (a cross-encoder): it answers /classify, /score and /rerank, "
                  "not /v1/embeddings", "model")
    if state.encoder is None:
        engine_pooler(state, "embed", "/v1/embeddings")
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, EMBEDDING_FIELDS)
    encoding = fields.str("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad(f"encoding_format must be float or base64, got {encoding!r}", "encoding_format")
    inputs = pooling_inputs(fields)
    params = PoolingParams(dimensions=fields.raw("dimensions"), normalize=fields.optional_bool("normalize"))
    vectors, tokens = await embed(state, request, inputs, params)
    data = [{"object": "embedding", "index": i, "embedding": _encode_vector(v, encoding)} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def embed(state: ServerState, request: Request, inputs: list[str | list[int]],
                params: PoolingParams) -> tuple[list[torch.Tensor], int]:
    """Each input's embedding and the input tokens, from whichever model serves embeddings here."""
    encoder = state.encoder
    if not isinstance(encoder, EmbeddingModel):
        outputs = await pool_inputs(state, request, inputs, params)
        return [o.outputs.data for o in outputs], sum(len(o.prompt_token_ids) for o in outputs)
    if params.dimensions is not None and (problem := dimensions_problem(encoder.pooling, encoder.spec.hidden_size,
                                                                        params.dimensions)):
        raise bad(problem, "dimensions")
    if params.normalize is not None and params.normalize != encoder.pooling.normalize:
        raise bad(f"normalize: this encoder's embeddings are {'' if encoder.pooling.normalize else 'not '}"
                  "normalized, as its layout says; leave normalize out", "normalize")
    try:
        vectors, tokens = await on_encoder(state, len(inputs), lambda: encoder.embed(inputs, params.dimensions))
    except LlmctlError as exc:
        raise bad(str(exc), "input") from None
    return list(vectors), tokens


def _encode_vector(vector: torch.Tensor, encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector.tolist()
    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
