"""`hermes`: <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks, as Hermes 2 Pro,
Qwen2.5 and Qwen3 write them; the content is the text before the first block."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import call_from_object
from llmctl.server.tool_parsers.json_scan import skip_whitespace

START, END = "<tool_call>", "</tool_call>"


@ToolParserManager.register_module("hermes")
class HermesToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, START, final)
        if rest is None:
            return ParsedText(content)
        calls = [_block_call(block.split(END)[0], final) for block in rest.split(START)]
        return ParsedText(content, [call for call in calls if call is not None])


def _block_call(body: str, final: bool) -> ToolCallDraft | None:
    start = skip_whitespace(body, 0)
    if start >= len(body):
        return ToolCallDraft(None, "", True) if final else None  # an empty block ends the answer as text
    if body[start] != "{":
        return ToolCallDraft(None, "", True)
    call, _ = call_from_object(body, start)
    return call
