"""/rerank, /v1/rerank and /v2/rerank (vLLM's, in Jina's and Cohere's shape): a query's documents, most relevant
first, with their relevance scores."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.server.models import check_model
from llmctl.server.operability import request_id_of
from llmctl.server.pooling_fields import RERANK_FIELDS
from llmctl.server.protocol import Fields, bad, warn_ignored
from llmctl.server.scorer import score_pairs
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json


async def rerank(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, RERANK_FIELDS)
    query = fields.str("query")
    if not query:
        raise bad("query must be a non-empty string", "query")
    documents = _documents(fields)
    top_n = fields.int("top_n", 0) or len(documents)
    if top_n < 0:
        raise bad(f"top_n must be 0 (every document) or more, got {top_n}", "top_n")
    return_documents = fields.bool("return_documents", True)
    scores, tokens = await score_pairs(state, request, [(query, document) for document in documents])
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    results: list[dict[str, Any]] = [{"index": i, "relevance_score": scores[i]} for i in order]
    if return_documents:
        for result in results:
            result["document"] = {"text": documents[result["index"]]}
    return JSONResponse({"id": f"rerank-{request_id_of(request.scope)}", "model": model, "usage": {"total_tokens": tokens},
                         "results": results})


def _documents(fields: Fields) -> list[str]:
    """Texts, or Cohere's {"text": …} objects."""
    value = fields.raw("documents")
    if not isinstance(value, list) or not value:
        raise bad("documents must be a non-empty list of texts", "documents")
    texts = [item.get("text") if isinstance(item, dict) else item for item in value]
    strings = [text for text in texts if isinstance(text, str) and text]
    if len(strings) != len(texts):
        raise bad("documents must hold non-empty strings (or {\"text\": …} objects)", "documents")
    return strings
