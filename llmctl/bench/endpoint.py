"""Which API `bench serve` calls: vLLM's `--backend` and `--endpoint` (a URL path), or llmctl's
short names `completions` / `chat` / `embeddings`, resolved to one kind of request body and one URL path."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import LlmctlError

SHORT_NAMES = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}
BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat",
            "openai-embeddings": "embeddings"}  # the OpenAI-compatible ones


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "completions", "chat" or "embeddings": the request body
    path: str  # appended to the server's base URL

    @property
    def is_chat(self) -> bool:
        return self.kind == "chat"

    @property
    def is_embeddings(self) -> bool:
        return self.kind == "embeddings"


def resolve_endpoint(endpoint: str | None, backend: str | None) -> Endpoint:
    """vLLM: --backend openai-chat with --endpoint /v1/chat/completions; llmctl: --endpoint chat."""
    if backend is not None and backend not in BACKENDS:
        raise LlmctlError(f"--backend {backend}: llmctl benchmarks OpenAI-compatible APIs; use one of "
                          f"{', '.join(BACKENDS)}")
    wanted = BACKENDS.get(backend or "")
    if endpoint is None:
        kind = wanted or "completions"
        return Endpoint(kind, SHORT_NAMES[kind])
    if endpoint in SHORT_NAMES:
        found = Endpoint(endpoint, SHORT_NAMES[endpoint])
    elif endpoint.startswith("/"):
        found = Endpoint(_kind_of_path(endpoint), endpoint)
    else:
        raise LlmctlError(f"--endpoint {endpoint}: give a URL path such as /v1/completions, /v1/chat/completions "
                          "or /v1/embeddings (or the short names completions / chat / embeddings)")
    if wanted is not None and wanted != found.kind:
        raise LlmctlError(f"--backend {backend} calls the {wanted} API but --endpoint {endpoint} is the "
                          f"{found.kind} one: use --backend {BACKEND_OF[found.kind]}")
    return found


BACKEND_OF = {"completions": "vllm", "chat": "openai-chat", "embeddings": "openai-embeddings"}


def _kind_of_path(path: str) -> str:
    for suffix, kind in (("/chat/completions", "chat"), ("/completions", "completions"), ("/embeddings", "embeddings")):
        if path.rstrip("/").endswith(suffix):
            return kind
    raise LlmctlError(f"--endpoint {path}: llmctl benchmarks the completions, chat completions and embeddings APIs; "
                      "the path must end in /completions, /chat/completions or /embeddings")
