"""Pooling requests through the engine (a decoder embedding model or classifier on the paged engine): every
input one request, all queued at once so the scheduler batches them, under the server's queue limit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request

from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams, PoolingRequestOutput
from llmctl.server.operability import request_id_of
from llmctl.server.protocol import bad
from llmctl.server.state import ServerState

T = TypeVar("T")


async def on_encoder(state: ServerState, count: int, call: Callable[[], T]) -> T:
    """An encoder's call (transformers' modules, on a thread) under the same queue limit as engine requests."""
    admission = state.in_flight.admit(count)
    try:
        return await asyncio.to_thread(call)
    finally:
        admission.release()


def engine_pooler(state: ServerState, task: str, endpoint: str) -> PoolerConfig:
    """The engine's pooler, when it is a pooling model for `task`; else a 400 that says what serves `endpoint`."""
    pooler = state.ready_engine.pooler
    if pooler is None or pooler.task != task:
        what = f"runs as a {pooler.task} model" if pooler is not None else "generates text"
        model = {"embed": "an embedding model", "classify": "a classifier or cross-encoder"}.get(task, task)
        raise bad(f"{state.model_name} {what}: {endpoint} needs {model}", "model")
    return pooler


async def pool_inputs(state: ServerState, request: Request, inputs: list[str | list[int]],
                      params: PoolingParams) -> list[PoolingRequestOutput]:
    """Each input's output, in order; a refused input fails the whole request (the others are aborted)."""
    engine = state.ready_engine
    admission = state.in_flight.admit(len(inputs))
    prefix = f"pool-{request_id_of(request.scope)}-{next(state.engine_ids)}"

    async def one(index: int, item: str | list[int]) -> PoolingRequestOutput:
        async for output in engine.encode(item, params, f"{prefix}-{index}"):
            if output.finished:
                return output
        raise RuntimeError("a pooling request ended without its output")

    tasks = [asyncio.ensure_future(one(i, item)) for i, item in enumerate(inputs)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:  # the first failure is the answer: the other inputs are aborted, none left running
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        admission.release()
