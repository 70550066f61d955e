"""Which routed models run: a request's model is loaded on first use (requests for a model being loaded wait for
it, up to the load timeout); when --max-loaded-models are running, the least recently used one without requests
in flight is stopped first, or put to sleep with --model-sleep-level (one that is busy is waited for, within the
same bound). A sleeping model counts against no budget and is woken on its next use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import httpx

from llmctl.server.protocol import APIError
from llmctl.server.router.catalog import RoutedModel
from llmctl.server.router.model_process import ModelProcess

logger = logging.getLogger("llmctl.server")


class ModelPool:
    def __init__(self, models: list[RoutedModel], shared_flags: tuple[str, ...], max_loaded: int,
                 load_timeout: float, sleep_level: int = 0) -> None:
        self.processes = {model.name: ModelProcess(model, shared_flags, sleep_level) for model in models}
        self.routes = {name: model.name for model in models for name in (model.name, *model.adapters)}
        self.max_loaded, self.load_timeout = max_loaded, load_timeout
        self._lock = asyncio.Lock()  # one decision at a time about what runs

    def process_for(self, name: str) -> ModelProcess:
        """The process serving a model or adapter name; unknown names are 404s naming what is served."""
        base = self.routes.get(name)
        if base is None:
            raise APIError(f"the model '{name}' does not exist; this server serves {', '.join(self.routes)}", 404,
                           param="model", code="model_not_found")
        return self.processes[base]

    @contextlib.asynccontextmanager
    async def using(self, name: str) -> AsyncIterator[ModelProcess]:
        """The model's process, loaded, held against unloading while the caller answers with it."""
        process = self.process_for(name)
        deadline = time.monotonic() + self.load_timeout
        while True:
            async with self._lock:
                if process.state == "loaded":
                    break
                if process.state != "loading" and await self._make_room(process):
                    process.start_loading(self.load_timeout)
            if process.state == "loading":
                await _wait(process.loaded, deadline)
                if process.state == "failed":
                    raise APIError(f"the model '{process.model.name}' failed to load: {process.error}", 503)
            elif time.monotonic() > deadline:
                raise APIError(f"every loaded model is busy (--max-loaded-models {self.max_loaded}); try again",
                               503, headers={"Retry-After": "5"})
            else:
                await asyncio.sleep(0.1)  # waiting for a loaded model to become idle
        process.in_flight += 1
        process.last_used = time.monotonic()
        try:
            yield process
        finally:
            process.in_flight -= 1
            process.last_used = time.monotonic()

    async def _make_room(self, wanted: ModelProcess) -> bool:
        """Put away least recently used idle models until `wanted` fits; False when every running one is busy."""
        while True:
            running = [p for p in self.processes.values() if p.state in ("loaded", "loading") and p is not wanted]
            if len(running) < self.max_loaded:
                return True
            idle = [p for p in running if p.state == "loaded" and p.in_flight == 0]
            if not idle:
                return False
            await _put_away(min(idle, key=lambda p: p.last_used))

    async def unload(self, name: str) -> None:
        process = self.process_for(name)
        async with self._lock:
            if process.in_flight or process.state == "loading":
                raise APIError(f"the model '{process.model.name}' is answering requests or loading; unload it "
                               "when it is idle", 409)
            await process.stop()

    async def shutdown(self) -> None:
        await asyncio.gather(*(process.stop() for process in self.processes.values()))


async def _put_away(process: ModelProcess) -> None:
    """Asleep with a sleep level (stopped if its server will not sleep), else stopped."""
    if process.sleep_level:
        try:
            await process.sleep()
            return
        except (httpx.HTTPError, RuntimeError) as exc:
            logger.warning("%s did not go to sleep (%s): stopping it instead", process.model.name, exc)
    await process.stop()


async def _wait(event: asyncio.Event, deadline: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise APIError("the model is still loading; try again", 503, headers={"Retry-After": "5"}) from None
