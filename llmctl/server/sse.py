"""Server-sent events for /v1/completions and /v1/chat/completions: the outputs of a request's
prompts merged as they come, one delta per choice that changed, then usage and [DONE]. What
differs between the two endpoints is a StreamFormat."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from llmctl.engine.front.outputs import CompletionOutput, RequestOutput
from llmctl.server.responses import Delta, ResponseContext, usage
from llmctl.server.transport import as_api_error

RecordFinished = Callable[[RequestOutput | None, list[float]], None]  # final output, token arrival times


class StreamFormat(Protocol):
    object_name: str  # of the usage chunk

    def opening(self, ctx: ResponseContext, num_choices: int) -> list[dict[str, Any]]: ...  # with the first output

    def before_output(self, ctx: ResponseContext, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]: ...

    def chunk(self, ctx: ResponseContext, prompt_index: int, delta: Delta) -> dict[str, Any] | None: ...  # None: nothing new


class DeltaTracker:
    """What each choice has been sent, so every chunk carries only what is new."""

    def __init__(self) -> None:
        self.sent: dict[int, tuple[str, int]] = {}  # choice -> (text sent, tokens sent)
        self.closed: set[int] = set()  # choices whose finish_reason was sent

    def delta(self, choice: int, completion: CompletionOutput) -> Delta | None:
        if choice in self.closed:
            return None
        text_sent, tokens_sent = self.sent.get(choice, ("", 0))
        text = completion.text[len(text_sent):]
        if not text and not completion.finish_reason and len(completion.token_ids) == tokens_sent:
            return None
        logprobs = completion.logprobs[tokens_sent:] if completion.logprobs is not None else None
        self.sent[choice] = (completion.text, len(completion.token_ids))
        if completion.finish_reason:
            self.closed.add(choice)
        return Delta(choice, text, completion, logprobs, len(text_sent))


class OutputMerger:
    """The outputs of several engine streams as they arrive: (prompt index, output), an exception
    that ended a stream, or None when a stream is done. `cancel` stops them all."""

    def __init__(self, streams: list[AsyncIterator[RequestOutput]], record: RecordFinished) -> None:
        self.queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()
        self.record = record
        self.tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]

    async def _pump(self, index: int, stream: AsyncIterator[RequestOutput]) -> None:
        token_times: list[float] = []
        final = None
        try:
            async for output in stream:
                token_times.append(time.perf_counter())
                final = output
                await self.queue.put((index, output))
        except Exception as exc:  # an engine error ends the stream with an error event
            await self.queue.put((index, exc))
        finally:
            self.record(final, token_times)
            await self.queue.put((index, None))

    async def next(self) -> tuple[int, RequestOutput | Exception | None]:
        return await self.queue.get()

    def cancel(self) -> None:
        # A cancelled pump raises inside its engine stream, whose own cleanup aborts the request; nothing
        # here awaits, because a client that went away cancels the response and every await in it.
        for task in self.tasks:
            task.cancel()


async def stream_events(ctx: ResponseContext, streams: list[AsyncIterator[RequestOutput]], record: RecordFinished,
                        fmt: StreamFormat) -> AsyncIterator[str]:
    """SSE: one event per new text of any choice, then usage (when asked) and [DONE]."""
    n = ctx.sampling.params.n
    merger = OutputMerger(streams, record)
    tracker = DeltaTracker()
    finished: dict[int, RequestOutput] = {}
    opened = False
    try:
        remaining = len(streams)
        while remaining:
            index, item = await merger.next()
            if not opened:
                opened = True
                for chunk in fmt.opening(ctx, n * len(streams)):
                    yield sse(chunk)
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                yield sse(as_api_error(item, ctx.request_id).body())
                continue
            for chunk in fmt.before_output(ctx, index, item):
                yield sse(chunk)
            if item.finished:
                finished[index] = item
            for completion in item.outputs:
                delta = tracker.delta(index * n + completion.index, completion)
                text_chunk = fmt.chunk(ctx, index, delta) if delta is not None else None
                if text_chunk is not None:
                    if ctx.sampling.continuous_usage:  # vLLM's: this choice's counts so far
                        text_chunk["usage"] = choice_usage(item, completion)
                    yield sse(text_chunk)
        if ctx.sampling.include_usage and finished:
            yield sse({"id": ctx.request_id, "object": fmt.object_name, "created": ctx.created, "model": ctx.model,
                       "choices": [], "usage": usage(list(finished.values()))})
        yield "data: [DONE]\n\n"
    finally:
        merger.cancel()


def choice_usage(output: RequestOutput, completion: CompletionOutput) -> dict[str, int]:
    prompt, generated = len(output.prompt_token_ids), len(completion.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


# Characters JSON leaves raw but that many line readers (str.splitlines, httpx's iter_lines) take for line
# breaks, which would cut an event in two; escaped they are the same JSON.
_LINE_BREAKS_FOR_SOME = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}  # < 0x20: JSON escapes
_ESCAPE_LINE_BREAKS = str.maketrans(_LINE_BREAKS_FOR_SOME)


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False).translate(_ESCAPE_LINE_BREAKS)}\n\n"
