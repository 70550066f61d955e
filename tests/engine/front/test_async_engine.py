"""The async engine: concurrent streams, early exit aborts and frees blocks, bad requests raise."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmctl import LLM, SamplingParams
from llmctl.engine.errors import InvalidRequestError, WorkerLostError
from llmctl.engine.front.async_engine import AsyncLLMEngine


@pytest.fixture(scope="module")
def llm(default_source):
    return LLM(str(default_source.path), max_model_len=512)


def test_concurrent_streams_match_offline_generation(llm):
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time", "Water is made of"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    engine = AsyncLLMEngine(llm.engine)

    async def one(prompt: str) -> tuple[list[int], int]:
        chunks, last = 0, None
        async for output in engine.generate(prompt, params):
            chunks += 1
            last = output
        return last.outputs[0].token_ids, chunks

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    assert [tokens for tokens, _ in results] == expected
    assert all(chunks == 12 for _, chunks in results)  # one output per generated token


def test_leaving_a_stream_aborts_and_frees_blocks(llm):
    engine = AsyncLLMEngine(llm.engine)
    manager = llm.engine.block_manager

    async def main():
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        async for output in engine.generate("Tell me a very long story.", params, request_id="leaver"):
            if len(output.outputs[0].token_ids) == 3:
                break
        deadline = asyncio.get_running_loop().time() + 60  # a bound for a hang, not a speed test
        while llm.engine.has_unfinished_requests:
            assert asyncio.get_running_loop().time() < deadline, "the abandoned stream was never aborted"
            await asyncio.sleep(0.02)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert not llm.engine.has_unfinished_requests
    assert manager.num_free_blocks == manager.num_blocks


def test_invalid_request_raises_in_the_caller(llm):
    engine = AsyncLLMEngine(llm.engine)

    async def main():
        async for _ in engine.generate([1] * 600, SamplingParams(max_tokens=1)):
            pass

    try:
        with pytest.raises(InvalidRequestError, match="maximum context length is 512"):
            asyncio.run(main())
    finally:
        engine.shutdown()


def test_a_request_queued_as_the_loop_dies_gets_the_loops_error(llm):
    """A Ray replica's node goes while a request waits in its engine's queue: the request gets WorkerLostError
    (which the data-parallel front retries on another replica) instead of waiting for a loop that is gone."""
    release = threading.Event()

    class LosingEngine:  # the engine, whose next look for work finds its worker gone once `release` is set
        def __init__(self, engine) -> None:
            self._engine = engine

        def __getattr__(self, name: str):
            return getattr(self._engine, name)

        @property
        def has_unfinished_requests(self) -> bool:
            release.wait(60)
            raise WorkerLostError("the Ray replica's actor was lost")

    engine = AsyncLLMEngine(LosingEngine(llm.engine))

    async def main():
        async def consume():
            async for _ in engine.generate("Hello", SamplingParams(max_tokens=2)):
                pass

        task = asyncio.ensure_future(consume())
        deadline = asyncio.get_running_loop().time() + 60  # a bound for a hang, not a speed test
        while engine._commands.empty():  # queued while the loop is held
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.wait_for(task, 60)

    with pytest.raises(WorkerLostError, match="actor was lost"):
        asyncio.run(main())
    assert not engine.is_running
