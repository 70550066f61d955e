"""/openapi.json: every endpoint with its request fields, built from the FieldSpec tables the
validator reads (llmctl.server.protocol) and the ranges SamplingParams checks, so they cannot drift."""

from __future__ import annotations

from typing import Any

from llmctl.server.messages_api.request import COUNT_FIELDS, MESSAGES_FIELDS
from llmctl.server.pooling_fields import CLASSIFY_FIELDS, POOLING_FIELDS, RERANK_FIELDS, SCORE_FIELDS
from llmctl.server.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    DETOKENIZE_FIELDS,
    EMBEDDING_FIELDS,
    JSON,
    REQUIRED_FIELDS,
    TOKENIZE_FIELDS,
    FieldSpec,
)
from llmctl.server.responses_api.request import RESPONSES_FIELDS
from llmctl.version import __version__

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer", "null"]}}}}}
ANTHROPIC_ERROR_SCHEMA = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
ERRORS = {"400": "invalid request", "401": "missing or wrong API key", "404": "unknown model or route",
          "408": "the request body did not arrive in time", "413": "request body too large",
          "409": "sleep mode: requests still running, or asleep already",
          "500": "the model step failed", "503": "loading, queue full, asleep (sleep mode), or the engine stopped"}


def request_schema(fields: dict[str, FieldSpec], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": required,
            "properties": {name: spec.json_schema(name) for name, spec in fields.items()}}


def _post(summary: str, fields: dict[str, FieldSpec], required: list[str], response: str,
          error_schema: dict[str, JSON] = ERROR_SCHEMA) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": response}}
    responses.update({code: {"description": text, "content": {"application/json": {"schema": error_schema}}}
                      for code, text in ERRORS.items()})
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
        "application/json": {"schema": request_schema(fields, required)}}}, "responses": responses}}


def _get(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK"}}}}


def _query_post(summary: str, name: str, values: list[int] | list[str], meaning: str,
                repeated: bool = False) -> dict[str, Any]:
    """A POST whose one setting is a query parameter (sleep mode's, as vLLM's): one of `values` (the first by
    default), or several of them (`repeated`)."""
    one = {"type": "integer" if isinstance(values[0], int) else "string", "enum": values}
    schema = {"type": "array", "items": one} if repeated else {**one, "default": values[0]}
    responses: dict[str, Any] = {"200": {"description": "OK"}}
    responses.update({code: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
                      for code, text in ERRORS.items()})
    return {"post": {"summary": summary, "parameters": [{"name": name, "in": "query", "required": False,
                                                         "schema": schema, "description": meaning}],
                     "responses": responses}}


LOAD_LORA_FIELDS = {"lora_name": FieldSpec("string", "the name requests will give as 'model'"),
                    "lora_path": FieldSpec("string", "a PEFT adapter folder or hub id")}
UNLOAD_LORA_FIELDS = {"lora_name": FieldSpec("string", "the adapter to stop serving")}


def openapi_schema(runtime_lora: bool = False) -> dict[str, Any]:
    """Every route the server has; the LoRA routes only with --allow-runtime-lora-updating."""
    lora = {
        "/v1/load_lora_adapter": _post("Load a LoRA adapter under a name (vLLM)", LOAD_LORA_FIELDS,
                                       ["lora_name", "lora_path"], "plain text: Success: …"),
        "/v1/unload_lora_adapter": _post("Stop serving a LoRA adapter (vLLM)", UNLOAD_LORA_FIELDS, ["lora_name"],
                                         "plain text: Success: …"),
    } if runtime_lora else {}
    paths = {**lora,
        "/v1/models": _get("List served models"),
        "/v1/completions": _post("Create a completion (OpenAI)", COMPLETION_FIELDS, REQUIRED_FIELDS["completions"],
                                 "a text_completion, or server-sent events when stream is true"),
        "/v1/chat/completions": _post("Create a chat completion (OpenAI)", CHAT_FIELDS, REQUIRED_FIELDS["chat"],
                                      "a chat.completion, or server-sent events when stream is true"),
        "/v1/responses": _post("Create a response (OpenAI's Responses API; nothing is stored)", RESPONSES_FIELDS,
                               ["input"], "a response, or its streaming events when stream is true"),
        "/v1/messages": _post("Create a message (Anthropic's Messages API)", MESSAGES_FIELDS,
                              ["model", "messages", "max_tokens"], "a message, or its streaming events when stream is true",
                              ANTHROPIC_ERROR_SCHEMA),
        "/v1/messages/count_tokens": _post("Count a message request's input tokens (Anthropic's)", COUNT_FIELDS,
                                           ["model", "messages"], "input_tokens", ANTHROPIC_ERROR_SCHEMA),
        "/v1/embeddings": _post("Create embeddings (embedding models only)", EMBEDDING_FIELDS,
                                REQUIRED_FIELDS["embeddings"], "a list of embeddings"),
        **{path: _post("Score text pairs (cross-encoders; embedding models: cosine similarity)", SCORE_FIELDS, [],
                       "a list of scores") for path in ("/score", "/v1/score")},
        **{path: _post("Rank documents for a query (Jina's and Cohere's shape)", RERANK_FIELDS,
                       ["query", "documents"], "results, most relevant first") for path in
           ("/rerank", "/v1/rerank", "/v2/rerank")},
        "/classify": _post("Classify texts (classifiers)", CLASSIFY_FIELDS, ["input"], "labels and probabilities"),
        "/pooling": _post("The pooler's raw output per input", POOLING_FIELDS, ["input"], "a list of pooled outputs"),
        "/tokenize": _post("Token ids of a prompt or of chat messages", TOKENIZE_FIELDS, [], "tokens, count"),
        "/detokenize": _post("Text of token ids", DETOKENIZE_FIELDS, REQUIRED_FIELDS["detokenize"], "prompt"),
        "/sleep": _query_post("Give memory back until /wake_up (--enable-sleep-mode)", "level", [1, 2],
                              "1: the KV cache; 2: the weights too (read again on waking)"),
        "/wake_up": _query_post("Make what sleep gave back again (--enable-sleep-mode)", "tags",
                                ["weights", "kv_cache"], "what to make again (default: all)", repeated=True),
        "/is_sleeping": _get("{\"is_sleeping\": true|false} (--enable-sleep-mode)"),
        "/health": _get("200 when the engine is ready, 503 while loading or after it died"),
        "/metrics": _get("Prometheus metrics (llmctl:...)"),
        "/version": _get("llmctl version"),
    }
    return {"openapi": "3.1.0", "info": {"title": "llmctl OpenAI-compatible API", "version": __version__},
            "paths": paths}
