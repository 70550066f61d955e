"""`jamba`: AI21 Jamba 1.5's <tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>; the
content is the text before it (whitespace included, whole and streamed alike)."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import calls_in_array
from llmctl.server.tool_parsers.json_scan import skip_whitespace

START = "<tool_calls>"


@ToolParserManager.register_module("jamba")
class JambaToolParser(ToolParser):
    keep_special_tokens = True  # <tool_calls> is a special token of Jamba's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, START, final)
        if rest is None:
            return ParsedText(content)
        start = skip_whitespace(rest, 0)
        if start >= len(rest):
            return ParsedText(text if final else content)
        if rest[start] != "[":
            return ParsedText(text)  # not a list of calls: the answer is text
        return ParsedText(content, calls_in_array(rest, start)[0])
