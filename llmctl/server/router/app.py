"""The router's HTTP front: GET /v1/models lists every routed model with its state (llama.cpp's router shape:
`status.value` loaded, loading, sleeping, unloaded or failed); POST /models/load and /models/unload (llama.cpp's) load or
stop one by name; every other POST is answered by the model its JSON body's `model` names, proxied to that model's
server with the body, query and headers as they came, its answer (a stream too) passed back as it is made."""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmctl.server.protocol import APIError
from llmctl.server.router.pool import ModelPool

MAX_BODY_BYTES = 64 * 2**20  # each model's own server applies its --max-request-bytes; this bounds the router's copy
PASSED_REQUEST_HEADERS = ("authorization", "content-type", "accept", "x-request-id", "traceparent", "tracestate")
PASSED_RESPONSE_HEADERS = ("content-type", "x-request-id", "retry-after", "cache-control")


def create_router_app(pool: ModelPool, api_key: str | None) -> Starlette:
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10))

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if api_key is not None and not _authorized(request, api_key):
                    raise APIError("a valid API key is required: send 'Authorization: Bearer KEY'", 401)
                return await handler(request)
            except APIError as exc:
                return JSONResponse(exc.body(), exc.status, headers=exc.headers)
        return endpoint

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": _model_cards(pool)})

    async def load(request: Request) -> Response:
        async with pool.using(await _model_name(request)):
            return JSONResponse({"success": True})

    async def unload(request: Request) -> Response:
        await pool.unload(await _model_name(request))
        return JSONResponse({"success": True})

    async def proxied(request: Request) -> Response:
        body = await _body(request)
        name = _model_field(body)
        stack = contextlib.AsyncExitStack()
        process = await stack.enter_async_context(pool.using(name))
        try:
            upstream = await client.send(client.build_request(
                request.method, f"{process.url}{request.url.path}", params=request.query_params, content=body,
                headers={k: v for k, v in request.headers.items() if k in PASSED_REQUEST_HEADERS}), stream=True)
        except httpx.TransportError as exc:
            await stack.aclose()
            raise APIError(f"the model '{name}' did not answer ({type(exc).__name__}); try again", 503) from None
        stack.push_async_callback(upstream.aclose)
        headers = {k: v for k, v in upstream.headers.items() if k in PASSED_RESPONSE_HEADERS}
        return StreamingResponse(_relay(upstream.aiter_raw(), stack), upstream.status_code, headers=headers,
                                 background=BackgroundTask(stack.aclose))  # also when the stream never starts

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": {p.model.name: p.state for p in pool.processes.values()}})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await pool.shutdown()
        await client.aclose()

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/models", guarded(models), methods=["GET"]),
        Route("/models/load", guarded(load), methods=["POST"]),
        Route("/models/unload", guarded(unload), methods=["POST"]),
        Route("/{path:path}", guarded(proxied), methods=["POST"]),
    ], lifespan=lifespan)


async def _relay(chunks: AsyncIterator[bytes], stack: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    """The model's answer as it comes; the model is released when it ends or the client goes away."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await stack.aclose()


def _model_cards(pool: ModelPool) -> list[dict[str, object]]:
    cards: list[dict[str, object]] = []
    for process in pool.processes.values():
        model = process.model
        status = {"value": process.state, **({"failed": process.error} if process.error else {})}
        cards.append({"id": model.name, "object": "model", "owned_by": "llmctl", "root": model.path or None,
                      "parent": None, "status": status})
        cards += [{"id": adapter, "object": "model", "owned_by": "llmctl", "root": None, "parent": model.name,
                   "status": status} for adapter in model.adapters]
    return cards


async def _body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise APIError(f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", 413)
    return body


def _model_field(body: bytes) -> str:
    try:
        fields = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError("the body is not JSON: send a JSON object with a 'model' field", 400) from None
    name = fields.get("model") if isinstance(fields, dict) else None
    if not isinstance(name, str) or not name:
        raise APIError("'model' is required: it picks which of this server's models answers (GET /v1/models "
                       "lists them)", 400, param="model")
    return name


async def _model_name(request: Request) -> str:
    return _model_field(await _body(request))


def _authorized(request: Request, api_key: str) -> bool:
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode())
