"""/v1/models and vLLM's runtime LoRA endpoints (/v1/load_lora_adapter, /v1/unload_lora_adapter);
`check_model` resolves the `model` field of every request to the base model or an adapter."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from llmctl.server.protocol import APIError, Fields, bad, model_permission
from llmctl.server.state import ServerState
from llmctl.server.transport import read_json


def check_model(state: ServerState, fields: Fields) -> str:
    """The base model's name or an adapter's; anything else is 404, as for OpenAI's unknown models."""
    name = fields.str("model")
    if name is None:
        return state.model_name
    if name not in state.settings.served_model_names and state.adapters.get(name) is None:
        served = state.settings.served_model_names + list(state.adapters.by_name)
        raise APIError(f"the model '{name}' does not exist; this server serves {', '.join(served)}", 404,
                       param="model", code="model_not_found")
    return name


async def models(state: ServerState, request: Request) -> Response:
    """vLLM's list: one card per served name (root: the model as given to serve, as vLLM's model_path), then
    the LoRA adapters; each card with vLLM's default `permission`."""
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID

    max_len = (state.encoder or state.ready_engine).max_model_len
    root = state.settings.engine_config.model or DEFAULT_MODEL_ID
    data = [{"id": name, "object": "model", "created": state.created, "owned_by": "llmctl", "root": root,
             "parent": None, "max_model_len": max_len, "permission": [model_permission(state.created)]}
            for name in state.settings.served_model_names]
    return JSONResponse({"object": "list", "data": data + state.adapters.cards(state.created)})


async def load_lora_adapter(state: ServerState, request: Request) -> Response:
    """vLLM's runtime load: {"lora_name", "lora_path"}; answers plain text, as vLLM does."""
    fields = await read_json(request)
    name, path = fields.str("lora_name"), fields.str("lora_path")
    if not name or not path:
        raise bad("Both 'lora_name' and 'lora_path' must be provided.")
    await asyncio.to_thread(state.adapters.load, state.ready_engine, name, path)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    name = fields.str("lora_name")
    if not name:
        raise bad("'lora_name' must be provided.")
    state.adapters.unload(state.ready_engine, name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
