"""`phi4_mini_json`: Phi-4-mini's functools[{"name": ..., "arguments": {...}}, ...]; the content is the
text before it. vLLM answers no content beside calls; llmctl keeps the text before them, as its other
parsers do. An empty list is no call."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import calls_in_array

MARKER = "functools["


@ToolParserManager.register_module("phi4_mini_json")
class Phi4MiniJsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, MARKER, final)
        if rest is None:
            return ParsedText(content)
        calls, _ = calls_in_array("[" + rest, 0)
        if final and not calls:
            return ParsedText(text)
        return ParsedText(content, calls)
