"""The OpenAI-compatible API over an EngineClient (starlette; run by uvicorn in `llmctl serve`):
routes, startup and shutdown, and the guard around every handler (auth, readiness, errors).
Each endpoint family lives in a module of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from llmctl.engine.front.client_factory import InProcessEngine
from llmctl.engine.front.embedding import EmbeddingModel
from llmctl.server.chat import chat_completions
from llmctl.server.classify import classify_endpoint
from llmctl.server.completions import completions
from llmctl.server.embeddings import embeddings
from llmctl.server.messages_api.endpoint import count_tokens, create_message
from llmctl.server.messages_api.errors import anthropic_error_response
from llmctl.server.models import load_lora_adapter, models, unload_lora_adapter
from llmctl.server.openapi import openapi_schema
from llmctl.server.operability import RequestLog, StatsLogger, request_id_of
from llmctl.server.pooling_endpoint import pooling
from llmctl.server.protocol import APIError, bad
from llmctl.server.rerank import rerank
from llmctl.server.responses_api.endpoint import create_response
from llmctl.server.score import score
from llmctl.server.sleep_mode import is_sleeping, sleep, wake_up
from llmctl.server.startup import OnFailure, exit_when_ranks_are_lost, load_engine
from llmctl.server.state import ServerSettings, ServerState
from llmctl.server.tokenize import detokenize, tokenize
from llmctl.server.transport import as_api_error, check_api_key, error_response
from llmctl.version import __version__

__all__ = ["ServerSettings", "create_app"]
logger = logging.getLogger("llmctl.server")
Handler = Callable[[ServerState, Request], Awaitable[Response]]


POOLING_ROUTES: dict[str, Handler] = {  # what a pooling model answers (vLLM's paths)
    "/v1/embeddings": embeddings, "/pooling": pooling, "/classify": classify_endpoint,
    "/score": score, "/v1/score": score, "/rerank": rerank, "/v1/rerank": rerank, "/v2/rerank": rerank,
}
POOLING_HANDLERS = {*POOLING_ROUTES.values(), models, sleep, wake_up, is_sleeping}


def create_app(settings: ServerSettings, engine: InProcessEngine | None = None,
               on_load_failure: OnFailure | None = None) -> Starlette:
    """The app; the engine loads on a background thread (or is given), /health says when it is ready."""
    state = ServerState(settings)
    lifespan = _lifespan(state, engine, on_load_failure)
    middleware = [Middleware(RequestLog, enabled=settings.access_log)]
    if settings.allowed_origins:  # CORS only when asked for: browsers elsewhere cannot call the API by default
        middleware.append(Middleware(CORSMiddleware, allow_origins=settings.allowed_origins, allow_methods=["*"],
                                     allow_headers=["*"]))
    app = Starlette(routes=_routes(state), lifespan=lifespan, middleware=middleware, exception_handlers={
        404: lambda r, e: error_response(APIError(f"no route {r.url.path}", 404)),
        405: lambda r, e: error_response(APIError(f"method {r.method} is not allowed on {r.url.path}", 405)),
    })
    app.state.llmctl = state
    return app


def _routes(state: ServerState) -> list[Route]:
    settings = state.settings

    def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await guarded(state, request, handler)
        return endpoint

    def plain(make: Callable[[], Response]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return make()
        return endpoint

    async def metrics_endpoint(request: Request) -> Response:
        if settings.metrics_auth:
            try:
                check_api_key(settings.api_key, request, always=True)
            except APIError as exc:
                return error_response(exc)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    runtime_lora = settings.allow_runtime_lora_updating

    async def openapi_endpoint(request: Request) -> Response:
        root = request.scope.get("root_path", "")  # --root-path: links as the client behind the proxy sees them
        return JSONResponse({**openapi_schema(runtime_lora), **({"servers": [{"url": root}]} if root else {})})

    async def docs_endpoint(request: Request) -> Response:
        return HTMLResponse(DOCS_PAGE.replace("{root}", request.scope.get("root_path", "")))

    return [
        Route("/health", plain(lambda: health(state)), methods=["GET"]),
        Route("/version", plain(lambda: JSONResponse({"version": __version__})), methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/v1/models", api(models), methods=["GET"]),
        Route("/v1/completions", api(completions), methods=["POST"]),
        Route("/v1/chat/completions", api(chat_completions), methods=["POST"]),
        Route("/v1/responses", api(create_response), methods=["POST"]),
        Route("/v1/messages", api(create_message), methods=["POST"]),
        Route("/v1/messages/count_tokens", api(count_tokens), methods=["POST"]),
        Route("/v1/embeddings", api(embeddings), methods=["POST"]),
        *[Route(path, api(handler), methods=["POST"]) for path, handler in POOLING_ROUTES.items()
          if handler is not embeddings],
        Route("/sleep", api(sleep), methods=["POST"]),
        Route("/wake_up", api(wake_up), methods=["POST"]),
        Route("/is_sleeping", api(is_sleeping), methods=["GET"]),
        Route("/tokenize", api(tokenize), methods=["POST"]),
        Route("/detokenize", api(detokenize), methods=["POST"]),
        *([Route("/v1/load_lora_adapter", api(load_lora_adapter), methods=["POST"]),
           Route("/v1/unload_lora_adapter", api(unload_lora_adapter), methods=["POST"])] if runtime_lora else []),
        Route("/openapi.json", openapi_endpoint, methods=["GET"]),
        Route("/docs", docs_endpoint, methods=["GET"]),
    ]


def _lifespan(state: ServerState, engine: InProcessEngine | None, on_load_failure: OnFailure | None
              ) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    settings = state.settings

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=load_engine, args=(state, engine, on_load_failure), name="llmctl-load",
                         daemon=True).start()
        stats = StatsLogger(lambda: next(iter(state.engine_stats()), None), settings.stats_interval) \
            if settings.stats_interval else None
        if stats:
            stats.start()
        watcher = asyncio.create_task(exit_when_ranks_are_lost(state, on_load_failure))
        yield
        watcher.cancel()
        if stats:
            stats.stop()
        if state.engine is not None:
            state.engine.shutdown()
        if state.tracer is not None:
            state.tracer.shutdown()  # the spans still batched are sent

    return lifespan


def health(state: ServerState) -> Response:
    if state.encoder is not None or (state.engine is not None and state.engine.is_running):
        return Response(status_code=200)
    reason = state.load_error or ("the engine stopped" if state.engine else "the model is loading")
    return JSONResponse({"status": reason}, status_code=503)


async def guarded(state: ServerState, request: Request, handler: Handler) -> Response:
    """Auth, readiness, queue limit and error mapping around every API handler."""
    try:
        check_api_key(state.settings.api_key, request, always=request.url.path in POOLING_ROUTES)
        if state.encoder is not None:
            if handler not in POOLING_HANDLERS:
                kind = "an embedding model" if isinstance(state.encoder, EmbeddingModel) else "a cross-encoder"
                raise bad(f"{state.model_name} is {kind} (an encoder): it serves no text generation; its endpoints "
                          f"are {', '.join(POOLING_ROUTES)}")
            return await handler(state, request)
        if state.engine is None or not state.engine.is_running:
            why = state.load_error or ("the engine stopped" if state.engine else "the model is still loading")
            raise APIError(f"not ready: {why}", 503, headers={"Retry-After": "5"})
        if state.engine.pooler is not None and handler not in POOLING_HANDLERS:
            raise bad(f"{state.model_name} is a pooling model ({state.engine.pooler.describe()}): it serves no text "
                      f"generation; its endpoints are {', '.join(POOLING_ROUTES)}")
        return await handler(state, request)
    except Exception as exc:
        error = as_api_error(exc, f"{request.url.path} request_id={request_id_of(request.scope)}")
        anthropic = request.url.path.startswith("/v1/messages")  # Anthropic's clients read their own shape
        return anthropic_error_response(error) if anthropic else error_response(error)


DOCS_PAGE = """<!doctype html><html><head><title>llmctl API</title></head><body>
<h1>llmctl OpenAI-compatible API</h1>
<p>Endpoints: <code>GET /v1/models</code>, <code>POST /v1/completions</code>, <code>POST /v1/chat/completions</code>,
<code>POST /v1/responses</code>, <code>POST /v1/messages</code>, <code>POST /v1/messages/count_tokens</code>,
<code>POST /v1/embeddings</code>, <code>POST /v1/score</code>, <code>POST /v1/rerank</code>, <code>POST /classify</code>,
<code>POST /pooling</code>, <code>POST /tokenize</code>, <code>POST /detokenize</code>, <code>GET /health</code>,
<code>GET /metrics</code>, <code>GET /version</code>; with <code>--enable-sleep-mode</code> <code>POST /sleep</code>,
<code>POST /wake_up</code>, <code>GET /is_sleeping</code>. Schema: <a href="{root}/openapi.json">{root}/openapi.json</a>.</p>
</body></html>"""
