"""The Messages API's streaming events, as Anthropic sends them: message_start (the message with no
content yet), ping, then per content block content_block_start, its deltas (thinking_delta and a
signature_delta, text_delta, input_json_delta for a tool_use block's arguments) and
content_block_stop; then message_delta (stop_reason, stop_sequence, usage) and message_stop. An
error after the stream began is an `error` event in Anthropic's shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from llmctl.engine.front.outputs import RequestOutput
from llmctl.server.chat_message import StreamedMessage, each_part
from llmctl.server.messages_api.errors import anthropic_error_body
from llmctl.server.messages_api.message import MessageShell, stop_reason, thinking_block, usage
from llmctl.server.protocol import JSON
from llmctl.server.responses import ResponseContext
from llmctl.server.sse import OutputMerger, RecordFinished
from llmctl.server.transport import as_api_error


def event(kind: str, **fields: JSON) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


class BlockWriter:
    """The open content block and the events that open, grow and close blocks."""

    def __init__(self, thinking_shown: bool = True) -> None:
        self.thinking_shown = thinking_shown
        self.count = 0  # blocks opened so far; the open one is count - 1
        self.open: str | None = None  # its type
        self.signature = ""
        self.calls: set[int] = set()  # tool-call indices that have a block

    def _start(self, block: dict[str, JSON]) -> list[str]:
        events = self.close()
        self.open = str(block["type"])
        self.count += 1
        return events + [event("content_block_start", index=self.count - 1, content_block=block)]

    def _delta(self, delta: dict[str, JSON]) -> str:
        return event("content_block_delta", index=self.count - 1, delta=delta)

    def thinking(self, text: str) -> list[str]:
        events = []
        if self.open != "thinking":
            block = thinking_block("")
            self.signature, block["signature"] = str(block["signature"]), ""
            events += self._start(block)
        return events + ([self._delta({"type": "thinking_delta", "thinking": text})] if self.thinking_shown else [])

    def text(self, text: str) -> list[str]:
        events = self._start({"type": "text", "text": ""}) if self.open != "text" else []
        return events + [self._delta({"type": "text_delta", "text": text})]

    def call(self, fragment: dict[str, JSON]) -> list[str]:
        events = []
        if fragment["index"] not in self.calls:
            self.calls.add(fragment["index"])
            events += self._start({"type": "tool_use", "id": fragment["id"], "name": fragment["function"]["name"],
                                   "input": {}})
        arguments = fragment["function"].get("arguments") or ""
        return events + ([self._delta({"type": "input_json_delta", "partial_json": arguments})] if arguments else [])

    def close(self) -> list[str]:
        if self.open is None:
            return []
        events = [self._delta({"type": "signature_delta", "signature": self.signature})] \
            if self.open == "thinking" else []
        self.open = None
        return events + [event("content_block_stop", index=self.count - 1)]

    def message_delta(self, delta: dict[str, JSON]) -> list[str]:
        return each_part(delta, self.thinking, self.text, self.call)


def message_events(shell: MessageShell, make_message: Callable[[], StreamedMessage]
                   ) -> Callable[[ResponseContext, list[AsyncIterator[RequestOutput]], RecordFinished],
                                 AsyncIterator[str]]:
    async def stream(ctx: ResponseContext, streams: list[AsyncIterator[RequestOutput]],
                     record: RecordFinished) -> AsyncIterator[str]:
        writer, message = BlockWriter(shell.thinking_shown), make_message()
        merger = OutputMerger(streams, record)
        prompt_tokens = len(ctx.prompts[0][1])
        yield event("message_start", message=shell.body([], (None, None), {
            "input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}))
        yield event("ping")
        try:
            while True:
                _, item = await merger.next()
                if item is None:
                    return
                if isinstance(item, Exception):
                    yield event("error", error=anthropic_error_body(as_api_error(item, ctx.request_id))["error"])
                    return
                completion = item.outputs[0]
                for text in writer.message_delta(message.delta(completion.text, item.finished)):
                    yield text
                if item.finished:
                    for text in writer.close():
                        yield text
                    reason, sequence = stop_reason(completion, message.called)
                    yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                                usage=usage(item))
                    yield event("message_stop")
        finally:
            merger.cancel()

    return stream
