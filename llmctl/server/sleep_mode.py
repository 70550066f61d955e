"""vLLM's sleep-mode endpoints (with --enable-sleep-mode; llmctl.engine.worker.sleep):

    POST /sleep?level=1|2                         the KV cache given back (1), the weights too (2)
    POST /wake_up[?tags=weights&tags=kv_cache]    what the tags name made again (default: all)
    GET  /is_sleeping                             {"is_sleeping": true|false}

Sleep waits for no request: with requests running it is a 409 naming them. While asleep every request that would
run the model is a 503 saying to wake it up."""

from __future__ import annotations

from typing import Protocol, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.server.protocol import APIError, bad
from llmctl.server.state import ServerState


class SleepingEngine(Protocol):
    """What the in-process engine (AsyncLLMEngine) adds to an EngineClient for sleep mode."""

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> None: ...

    @property
    def is_sleeping(self) -> bool: ...


def _engine(state: ServerState) -> SleepingEngine:
    if not hasattr(state.engine, "wake_up"):  # --enable-sleep-mode refuses replicas at startup
        raise APIError("sleep mode runs with one in-process engine: start with --enable-sleep-mode and no --dp", 400)
    return cast(SleepingEngine, state.engine)


async def sleep(state: ServerState, request: Request) -> Response:
    raw = request.query_params.get("level", "1")
    if not raw.isdigit():
        raise bad(f"level {raw!r}: use 1 (the KV cache given back) or 2 (the weights too)", "level")
    await _engine(state).sleep(int(raw))
    return Response(status_code=200)


async def wake_up(state: ServerState, request: Request) -> Response:
    await _engine(state).wake_up(request.query_params.getlist("tags") or None)
    return Response(status_code=200)


async def is_sleeping(state: ServerState, request: Request) -> Response:
    return JSONResponse({"is_sleeping": _engine(state).is_sleeping})
