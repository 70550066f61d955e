"""Which API `bench serve` calls: vLLM's `--backend` and `--endpoint` (a URL path), or llmctl's
short names `completions` / `chat` / `embeddings` / `rerank`, resolved to one kind of request body and one URL path."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import LlmctlError

SHORT_NAMES = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings",
               "rerank": "/v1/rerank"}
BACKENDS = {"vllm": "completions", "openai": "completions", "openai-chat": "chat",
            "openai-embeddings": "embeddings", "vllm-rerank": "rerank"}  # the OpenAI-compatible ones and vLLM's rerank


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "completions", "chat", "embeddings" or "rerank": the request body
    path: str  # appended to the server's base URL

    @property
    def is_chat(self) -> bool:
        return self.kind == "chat"

    @property
    def is_pooling(self) -> bool:
        """Embeddings or rerank: one answer, not streamed, no output tokens."""
        return self.kind in ("embeddings", "rerank")


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
        raise LlmctlError(f"--endpoint {endpoint}: give a URL path such as /v1/completions, /v1/chat/completions, "
                          "/v1/embeddings or /v1/rerank (or the short names completions / chat / embeddings / rerank)")
    if wanted is not None and wanted != found.kind:
        raise LlmctlError(f"--backend {backend} calls the {wanted} API but --endpoint {endpoint} is the "
                          f"{found.kind} one: use --backend {BACKEND_OF[found.kind]}")
    return found


BACKEND_OF = {"completions": "vllm", "chat": "openai-chat", "embeddings": "openai-embeddings", "rerank": "vllm-rerank"}


def _kind_of_path(path: str) -> str:
    for suffix, kind in (("/chat/completions", "chat"), ("/completions", "completions"), ("/embeddings", "embeddings"),
                         ("/rerank", "rerank")):
        if path.rstrip("/").endswith(suffix):
            return kind
    raise LlmctlError(f"--endpoint {path}: llmctl benchmarks the completions, chat completions, embeddings and rerank "
                      "APIs; the path must end in /completions, /chat/completions, /embeddings or /rerank")
