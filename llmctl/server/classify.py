"""/classify (vLLM's): each input's label and class probabilities."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.server.models import check_model
from llmctl.server.operability import request_id_of
from llmctl.server.pooling_fields import CLASSIFY_FIELDS, pooling_inputs
from llmctl.server.protocol import warn_ignored
from llmctl.server.scorer import classify, labels_of
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json


async def classify_endpoint(state: ServerState, request: Request) -> Response:
    labels = labels_of(state)
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, CLASSIFY_FIELDS)
    inputs = pooling_inputs(fields)
    probs, tokens = await classify(state, request, list(inputs), fields.bool("use_activation", True))
    data = [{"index": i, "label": labels[int(p.argmax())], "probs": p.tolist(), "num_classes": len(labels)}
            for i, p in enumerate(probs)]
    return JSONResponse({"id": f"classify-{request_id_of(request.scope)}", "object": "list",
                         "created": int(time.time()), "model": model, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})
