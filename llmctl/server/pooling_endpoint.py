"""/pooling (vLLM's): the pooler's output per input — an embedding, class probabilities (raw scores with
`use_activation: false`), or, for a reward model, one row per token (ALL) or per step tag (STEP): its score head's
outputs (a process reward model's probabilities), or, without a head, every token's hidden state."""

from __future__ import annotations

import time

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.engine.pooling.params import PoolingParams
from llmctl.server.embeddings import embed
from llmctl.server.models import check_model
from llmctl.server.operability import request_id_of
from llmctl.server.pooled import pool_inputs
from llmctl.server.pooling_fields import POOLING_FIELDS, pooling_inputs
from llmctl.server.protocol import bad, warn_ignored
from llmctl.server.scorer import classify
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json


async def pooling(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, POOLING_FIELDS)
    inputs = pooling_inputs(fields)
    data, tokens = await _pooled(state, request, inputs, fields.optional_bool("use_activation"))
    return JSONResponse({"id": f"pool-{request_id_of(request.scope)}", "object": "list", "created": int(time.time()),
                         "model": model, "data": [{"index": i, "object": "pooling", "data": d.tolist()}
                                                  for i, d in enumerate(data)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


async def _pooled(state: ServerState, request: Request, inputs: list[str | list[int]],
                  use_activation: bool | None) -> tuple[list[torch.Tensor], int]:
    """use_activation None: the model's default (vLLM's: on for classifiers and process reward models)."""
    if state.encoder is None:
        if state.ready_engine.pooler is None:
            raise bad(f"{state.model_name} generates text: /pooling needs a pooling model", "model")
        outputs = await pool_inputs(state, request, inputs, PoolingParams(use_activation=use_activation))
        return [o.outputs.data for o in outputs], sum(len(o.prompt_token_ids) for o in outputs)
    if hasattr(state.encoder, "labels"):
        return await classify(state, request, list(inputs), use_activation=use_activation is not False)
    return await embed(state, request, inputs, PoolingParams())
