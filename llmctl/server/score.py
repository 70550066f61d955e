"""/score and /v1/score (vLLM's): text_1 against text_2 — one against many, or pairwise — in vLLM's
text_1/text_2 form or its queries/documents form."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.engine.pooling.scoring import pair_texts
from llmctl.server.models import check_model
from llmctl.server.operability import request_id_of
from llmctl.server.pooling_fields import SCORE_FIELDS
from llmctl.server.protocol import Fields, bad, warn_ignored
from llmctl.server.scorer import score_pairs
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json

FORMS = (("text_1", "text_2"), ("queries", "documents"))


async def score(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, SCORE_FIELDS)
    pairs = score_request_pairs(fields)
    scores, tokens = await score_pairs(state, request, pairs)
    data = [{"index": i, "object": "score", "score": value} for i, value in enumerate(scores)]
    return JSONResponse({"id": f"score-{request_id_of(request.scope)}", "object": "list", "created": int(time.time()),
                         "model": model, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


def score_request_pairs(fields: Fields) -> list[tuple[str, str]]:
    """The (first, second) pairs a request asks for: one first text against every second, or pair by pair."""
    first_name, second_name = next(((a, b) for a, b in FORMS if a in fields.body), FORMS[0])
    try:
        return pair_texts(texts(fields, first_name), texts(fields, second_name), (first_name, second_name))
    except ValueError as exc:
        raise bad(str(exc), first_name) from None


def texts(fields: Fields, name: str) -> list[str]:
    """A field holding a non-empty text or a non-empty list of them."""
    value = fields.raw(name)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise bad(f"{name} must be a text or a non-empty list of texts", name)
    if not all(isinstance(item, str) and item for item in items):
        raise bad(f"{name} must hold non-empty strings", name)
    return items
