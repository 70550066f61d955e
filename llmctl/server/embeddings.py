"""/v1/embeddings, for an embedding model served instead of a generator (e.g. all-MiniLM-L6-v2)."""

from __future__ import annotations

import asyncio
import base64
import logging

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.engine.front.embedding import dimensions_problem, embedding_model_for
from llmctl.errors import LlmctlError
from llmctl.server.models import check_model
from llmctl.server.protocol import bad, prompt_list
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json

logger = logging.getLogger("llmctl.server")


def load_embedder(state: ServerState) -> bool:
    """Serve an encoder through /v1/embeddings; False for generation models."""
    state.embedder = embedder = embedding_model_for(state.settings.engine_config)
    if embedder is None:
        return False
    logger.info("embedding model %s (%s pooling%s), %d dimensions", embedder.source.name, embedder.pooling.mode,
                ", normalized" if embedder.pooling.normalize else "", embedder.spec.hidden_size)
    return True


async def embeddings(state: ServerState, request: Request) -> Response:
    if state.embedder is None:
        raise bad(f"{state.model_name} is a text-generation model and serves no embeddings: start llmctl serve with "
                  "an embedding model (e.g. all-MiniLM-L6-v2) for /v1/embeddings", "model")
    fields = await read_json(request)
    model = check_model(state, fields)
    encoding = fields.str("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad(f"encoding_format must be float or base64, got {encoding!r}", "encoding_format")
    dimensions = fields.raw("dimensions")
    if dimensions is not None and (problem := dimensions_problem(state.embedder.pooling, state.embedder.spec.hidden_size,
                                                                 dimensions)):
        raise bad(problem, "dimensions")
    inputs = prompt_list(fields.raw("input"), "input")
    if any(item == "" for item in inputs):
        raise bad("input must not contain empty strings", "input")
    try:
        vectors, tokens = await asyncio.to_thread(state.embedder.embed, inputs, dimensions)
    except LlmctlError as exc:
        raise bad(str(exc), "input") from None
    data = [{"object": "embedding", "index": i, "embedding": _encode_vector(v, encoding)} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _encode_vector(vector: torch.Tensor, encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector.tolist()
    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
