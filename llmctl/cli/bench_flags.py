"""`bench serve`'s flags for where requests go and what they ask, in vLLM's spelling, declared as
groups (llmctl.cli.flags) so the command stays short."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from llmctl.bench.endpoint import Endpoint, resolve_endpoint
from llmctl.cli.flags import Flag, FlagGroup


@dataclass
class TargetFlags:
    base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None
    served_model_name: str | None = None
    tokenizer: str | None = None
    backend: str | None = None
    endpoint: str | None = None


@dataclass(frozen=True)
class Target:
    """The server, the model name sent in requests, the tokenizer that counts tokens, and the API."""

    base_url: str
    model: str | None
    tokenizer: str | None
    endpoint: Endpoint


def build_target(values: dict[str, Any]) -> Target:
    flags = TargetFlags(**values)
    return Target(base_url=flags.base_url or f"http://{flags.host}:{flags.port}",
                  model=flags.served_model_name or flags.model,
                  tokenizer=flags.tokenizer or (flags.model if flags.served_model_name else None),
                  endpoint=resolve_endpoint(flags.endpoint, flags.backend))


TARGET_FLAGS: dict[str, Flag] = {
    "base_url": Flag(("--base-url",), Optional[str], "the server, without /v1 (default: http://HOST:PORT)"),
    "host": Flag(("--host",), str, "the server's host, when no --base-url"),
    "port": Flag(("--port",), int, "the server's port, when no --base-url"),
    "model": Flag(("--model",), Optional[str], "default: the server's first model"),
    "served_model_name": Flag(("--served-model-name",), Optional[str],
                              "the name sent in requests, when it differs from --model (the tokenizer's)"),
    "tokenizer": Flag(("--tokenizer",), Optional[str], "default: the model's"),
    "backend": Flag(("--backend",), Optional[str],
                    "vllm or openai (the completions API), openai-chat (chat completions), openai-embeddings, "
                    "vllm-rerank"),
    "endpoint": Flag(("--endpoint",), Optional[str],
                     "URL path: /v1/completions (default), /v1/chat/completions, /v1/embeddings or /v1/rerank (each "
                     "prompt ranks its own quarters); also completions, chat, embeddings, rerank"),
}
TARGET_GROUP = FlagGroup("target", TARGET_FLAGS, TargetFlags, build_target)


@dataclass
class RequestFlags:
    ignore_eos: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None


REQUEST_FLAGS: dict[str, Flag] = {
    "ignore_eos": Flag(("--ignore-eos",), bool, "generate exactly the requested tokens"),
    "temperature": Flag(("--temperature",), Optional[float], "default: the server's"),
    "top_p": Flag(("--top-p",), Optional[float], "sent as top_p; default: the server's"),
    "top_k": Flag(("--top-k",), Optional[int], "sent as top_k (a vLLM extension)"),
    "min_p": Flag(("--min-p",), Optional[float], "sent as min_p (a vLLM extension)"),
}
REQUEST_GROUP = FlagGroup("request", REQUEST_FLAGS, RequestFlags, lambda values: RequestFlags(**values))


def sampling_fields(request: RequestFlags) -> dict[str, float]:
    """The sampling settings sent with every request, only those given."""
    given = {"top_p": request.top_p, "top_k": request.top_k, "min_p": request.min_p}
    return {name: value for name, value in given.items() if value is not None}
