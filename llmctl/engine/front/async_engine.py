"""AsyncLLMEngine: the engine loop on its own thread, per-request async streams.

The server's event loop never runs model code: requests and aborts are handed to the
engine thread through a queue, and every step's outputs come back to each request's
asyncio.Queue with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.errors import EngineDeadError, StepFailedError, WorkerLostError
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams, PoolingRequestOutput
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.structured.params import StructuredOutputsParams

logger = logging.getLogger("llmctl.engine")


@dataclass
class _Add:
    request_id: str
    prompt: EnginePrompt
    params: SamplingParams
    stream: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    lora_request: LoRARequest | None = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:  # run on the engine thread between steps (sleep mode: no step may run meanwhile)
    function: Callable[[], Any]
    done: concurrent.futures.Future


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        engine.load_unknown_adapters = False  # a server serves the adapters it registered, no others
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.Queue, asyncio.AbstractEventLoop]] = {}
        self._wake = threading.Event()
        self._stopping = False
        self.dead_error: BaseException | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="llmctl-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.dead_error is None and self.engine.executor.healthy()

    # -- EngineClient ----------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def source(self) -> ModelSource:
        return self.engine.loaded.source

    @property
    def spec(self) -> ModelSpec:
        return self.engine.loaded.spec

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return self.engine.tokenize(prompt)

    def stats(self) -> list[EngineStats]:
        return [self.engine.stats()]

    def add_lora(self, lora_request: LoRARequest) -> None:
        self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        self.engine.remove_lora(lora_int_id)

    def lost_workers(self) -> str | None:
        if self.engine.executor.healthy() and not isinstance(self.dead_error, WorkerLostError):
            return None
        return str(self.dead_error or "a worker rank exited")

    @property
    def pooler(self) -> PoolerConfig | None:
        return self.engine.pooler

    async def encode(self, prompt: str | list[int], params: PoolingParams,
                     request_id: str | None = None) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling request: its one output, when its prompt is computed."""
        async for output in self.generate(prompt, params, request_id):  # type: ignore[arg-type]
            yield output  # type: ignore[misc]

    async def generate(self, prompt: EnginePrompt, params: SamplingParams, request_id: str | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request; leaving the loop early (or being cancelled) aborts it."""
        if self.dead_error is not None:
            raise self._death()
        request_id = request_id or f"req-{next(self._ids)}"
        stream: asyncio.Queue = asyncio.Queue()
        self._commands.put(_Add(request_id, prompt, params, stream, asyncio.get_running_loop(), lora_request))
        self._wake.set()
        if self.dead_error is not None:  # the loop died while this was queued: nobody else will answer it
            self._fail_queued()
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def check_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Compile the grammar now (InvalidRequestError if it cannot be); the request's own compile is then
        a cache hit. Runs on the caller's thread: xgrammar's compiler is thread-safe."""
        self.engine.structured.matcher(params)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))
        self._wake.set()

    # -- sleep mode: on the engine thread, between steps (llmctl.engine.worker.sleep) -------------------------
    async def sleep(self, level: int = 1) -> None:
        await self._on_engine_thread(lambda: self.engine.sleep(level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._on_engine_thread(lambda: self.engine.wake_up(tags))

    @property
    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping

    async def _on_engine_thread(self, function: Callable[[], Any]) -> Any:
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Call(function, done))
        self._wake.set()
        return await asyncio.wrap_future(done)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        self.engine.executor.shutdown()  # worker ranks exit with the engine

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_commands()
                if not self.engine.has_unfinished_requests:
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                try:
                    outputs = self.engine.step()
                except StepFailedError as exc:
                    for request_id in exc.request_ids:
                        self._deliver(request_id, exc, done=True)
                    continue
                for output in outputs:
                    self._deliver(output.request_id, output, done=output.finished)
        except BaseException as exc:  # the loop must never die silently: every waiter hears about it
            logger.exception("engine loop failed")
            self.dead_error = exc
            for request_id in list(self._streams):
                self._deliver(request_id, self._death(), done=True)
            self._fail_queued()

    def _death(self) -> BaseException:
        """The error a request of a dead engine gets: a lost worker as itself (a data-parallel front retries
        those on another replica), anything else as EngineDeadError."""
        if isinstance(self.dead_error, WorkerLostError):
            return WorkerLostError(str(self.dead_error))
        return EngineDeadError(f"the engine stopped: {self.dead_error}")

    def _fail_queued(self) -> None:
        """Requests still queued for a loop that is gone get its error (called by the dying loop, and by a
        request queued just after it died)."""
        for command in self._queued():
            if isinstance(command, _Call):
                command.done.set_exception(self._death())
            elif isinstance(command, _Add):
                try:
                    command.loop.call_soon_threadsafe(command.stream.put_nowait, self._death())
                except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                    pass

    def _queued(self) -> Iterator[_Add | _Abort | _Call]:
        """The commands waiting now, taken off the queue one by one."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _drain_commands(self) -> None:
        for command in self._queued():
            if isinstance(command, _Add):
                self._streams[command.request_id] = (command.stream, command.loop)
                try:
                    self.engine.add_request(command.request_id, command.prompt, command.params,
                                            command.lora_request)
                except Exception as exc:  # invalid request: the caller gets the error
                    self._deliver(command.request_id, exc, done=True)
            elif isinstance(command, _Call):
                try:
                    command.done.set_result(command.function())
                except Exception as exc:  # the caller gets it (a 400/409 naming what to do)
                    command.done.set_exception(exc)
            else:
                self.engine.abort(command.request_id)
                self._streams.pop(command.request_id, None)

    def _deliver(self, request_id: str, item: object, done: bool) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        stream, loop = target
        if done:
            del self._streams[request_id]
        try:
            loop.call_soon_threadsafe(stream.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self.engine.abort(request_id)
