"""Around every API handler: the request body read under its size and time limits, the API key,
the client going away, and any exception turned into an OpenAI-shaped error response."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse

from llmctl.engine.errors import (
    EngineDeadError,
    InvalidRequestError,
    ModelAsleepError,
    SleepConflictError,
    StepFailedError,
    WorkerLostError,
)
from llmctl.errors import LlmctlError
from llmctl.server.lora import AdapterLoadError
from llmctl.server.protocol import APIError, Fields, bad

logger = logging.getLogger("llmctl.server")
T = TypeVar("T")


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def as_api_error(exc: Exception, where: str) -> APIError:
    """The OpenAI-shaped error for anything a handler or a stream raised, with the right status and type."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return bad(str(exc), exc.param)
    if isinstance(exc, AdapterLoadError):
        return APIError(str(exc), exc.status)
    if isinstance(exc, ModelAsleepError):  # sleep mode: POST /wake_up
        return APIError(str(exc), 503, headers={"Retry-After": "5"})
    if isinstance(exc, SleepConflictError):
        return APIError(str(exc), 409)
    if isinstance(exc, LlmctlError):  # e.g. an adapter that does not fit: what the user must change
        return bad(str(exc))
    # 500 as vLLM answers; the engine logged the traceback
    if isinstance(exc, (EngineDeadError, StepFailedError, WorkerLostError)):
        return APIError(str(exc), 500, error_type="internal_server_error")
    logger.error("internal error on %s", where, exc_info=exc)  # a bug of ours: the log has the traceback
    return APIError(f"internal error: {type(exc).__name__}: {exc}", 500, error_type="internal_server_error")


def check_api_key(api_key: str | None, request: Request, always: bool = False) -> None:
    if not api_key or not (always or request.url.path.startswith("/v1")):
        return
    bearer = request.headers.get("authorization", "")
    anthropic = request.headers.get("x-api-key")  # how Anthropic's clients send the key
    # Constant time: how long the comparison takes says nothing about how much of the key was right.
    given, expected = (anthropic, api_key) if anthropic is not None else (bearer, f"Bearer {api_key}")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise APIError("invalid or missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')", 401,
                       code="invalid_api_key")


async def read_json(request: Request) -> Fields:
    settings = request.app.state.llmctl.settings
    try:
        raw = await asyncio.wait_for(read_body(request, settings.max_request_bytes), settings.body_timeout)
    except asyncio.TimeoutError:
        raise APIError(f"the request body did not arrive within {settings.body_timeout:g} s", 408) from None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}") from None
    return Fields(body)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes (--max-request-bytes)", 413)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work`, or cancel it (aborting its requests) when the client disconnects first."""
    work = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        watcher.cancel()
        return work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):
        pass
    return None
