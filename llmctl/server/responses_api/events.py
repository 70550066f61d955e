"""The Responses API's streaming events, as OpenAI sends them: response.created and .in_progress; for
each output item .output_item.added, its parts and deltas (reasoning_text, output_text, function-call
arguments) and .done events; then response.completed (or .incomplete) with the whole Response. Every
event carries a sequence_number and its SSE event name."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from llmctl.engine.front.outputs import RequestOutput
from llmctl.server.chat_message import StreamedMessage, each_part
from llmctl.server.protocol import JSON
from llmctl.server.responses import ResponseContext
from llmctl.server.responses_api.items import (
    ResponseShell,
    function_call_item,
    item_status,
    message_item,
    new_id,
    reasoning_item,
    text_part,
    usage,
)
from llmctl.server.sse import OutputMerger, RecordFinished
from llmctl.server.transport import as_api_error


class ItemWriter:
    """The open output item and the events that open, grow and close items."""

    def __init__(self) -> None:
        self.items: list[dict[str, JSON]] = []  # finished and open, in order
        self.open: dict[str, JSON] | None = None
        self.sequence = 0
        self.calls: dict[int, dict[str, JSON]] = {}  # tool-call index -> its item

    def event(self, kind: str, **fields: JSON) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _add(self, item: dict[str, JSON]) -> list[str]:
        self.items.append(item)
        self.open = item
        return [self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)]

    def text(self, kind: str, delta: str) -> list[str]:
        """Reasoning or answer text: into the open item of that kind, else a new one."""
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self.close()
            item = reasoning_item(new_id("rs"), "") if kind == "reasoning" else message_item(new_id("msg"), None,
                                                                                              "in_progress")
            events += self._add(item)
            if kind == "message":  # the message opens empty, then its one output_text part
                item["content"].append(text_part(""))
                events.append(self.event("response.content_part.added", item_id=item["id"],
                                         output_index=len(self.items) - 1, content_index=0, part=text_part("")))
        current = self.open
        assert current is not None, "an item of this kind is open now"
        current["content"][0]["text"] += delta
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        return events + [self.event(name, item_id=current["id"], output_index=len(self.items) - 1,
                                    content_index=0, delta=delta, **extra)]

    def call(self, fragment: dict[str, JSON]) -> list[str]:
        """A tool-call delta: a new function_call item, or arguments for one."""
        events = []
        if fragment["index"] not in self.calls:
            events += self.close()
            item = function_call_item(new_id("fc"), {**fragment, "function": {**fragment["function"],
                                                                                "arguments": ""}}, "in_progress")
            self.calls[fragment["index"]] = item
            events += self._add(item)
        item = self.calls[fragment["index"]]
        delta = fragment["function"].get("arguments") or ""
        if delta:
            item["arguments"] += delta
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self.items.index(item), delta=delta))
        return events

    def close(self, status: str = "completed") -> list[str]:
        """Done events for the open item; `status`: incomplete for the item a max_output_tokens cut ends."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.items.index(item)
        item["status"] = status
        if item["type"] == "function_call":
            done = [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               arguments=item["arguments"])]
        elif item["type"] == "message":
            part = item["content"][0]
            done = [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                               text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)]
        else:
            done = [self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=item["content"][0]["text"])]
        return done + [self.event("response.output_item.done", output_index=index, item=item)]

    def message_delta(self, delta: dict[str, JSON]) -> list[str]:
        return each_part(delta, partial(self.text, "reasoning"), partial(self.text, "message"), self.call)


def response_events(shell: ResponseShell, make_message: Callable[[], StreamedMessage]
                    ) -> Callable[[ResponseContext, list[AsyncIterator[RequestOutput]], RecordFinished],
                                  AsyncIterator[str]]:
    async def stream(ctx: ResponseContext, streams: list[AsyncIterator[RequestOutput]],
                     record: RecordFinished) -> AsyncIterator[str]:
        writer, message = ItemWriter(), make_message()
        merger = OutputMerger(streams, record)
        yield writer.event("response.created", response=shell.body("in_progress", []))
        yield writer.event("response.in_progress", response=shell.body("in_progress", []))
        try:
            while True:
                _, item = await merger.next()
                if item is None:
                    return
                if isinstance(item, Exception):
                    yield writer.event("error", **as_api_error(item, ctx.request_id).body()["error"])
                    continue
                completion = item.outputs[0]
                for event in writer.message_delta(message.delta(completion.text, item.finished)):
                    yield event
                if item.finished:
                    for event in writer.close(item_status(completion.finish_reason)):
                        yield event
                    final = shell.body("completed", writer.items, usage(item), completion.finish_reason)
                    yield writer.event(f"response.{final['status']}", response=final)
        finally:
            merger.cancel()

    return stream
