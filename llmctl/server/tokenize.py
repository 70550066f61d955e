"""vLLM's /tokenize (a prompt, or chat messages through the template) and /detokenize."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.server.chat import render_chat
from llmctl.server.models import check_model
from llmctl.server.protocol import DETOKENIZE_FIELDS, TOKENIZE_FIELDS, bad, warn_ignored
from llmctl.server.state import ServerState
from llmctl.server.tools import template_tools
from llmctl.server.transport import read_json


async def tokenize(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    check_model(state, fields)
    warn_ignored(fields, TOKENIZE_FIELDS)
    engine = state.ready_engine
    if fields.raw("messages") is not None:
        _, ids = render_chat(state, fields, fields.bool("add_generation_prompt", True), tools=template_tools(fields))
    else:
        prompt = fields.str("prompt")
        if prompt is None:
            raise bad("prompt (a string) or messages is required", "prompt")
        ids = engine.tokenizer.encode(prompt, add_special_tokens=fields.bool("add_special_tokens", True))
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})


async def detokenize(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    check_model(state, fields)
    warn_ignored(fields, DETOKENIZE_FIELDS)
    tokens = fields.raw("tokens")
    vocab = state.ready_engine.spec.vocab_size
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad("tokens must be a list of integers", "tokens")
    if any(not 0 <= t < vocab for t in tokens):
        raise bad(f"token ids must be in [0, {vocab})", "tokens")
    return JSONResponse({"prompt": state.ready_engine.tokenizer.decode(tokens)})
