"""`llama3_json`: Llama 3.1/3.2's JSON tool calls — the whole answer is {"name": ..., "parameters":
{...}} (vLLM also reads "arguments"), optionally after <|python_tag|>, several separated by ";"."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager
from llmctl.server.tool_parsers.drafts import calls_in_sequence
from llmctl.server.tool_parsers.json_scan import skip_whitespace

PYTHON_TAG = "<|python_tag|>"


@ToolParserManager.register_module(["llama3_json", "llama4_json"])
class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        body = text[len(PYTHON_TAG):] if text.startswith(PYTHON_TAG) else text
        start = skip_whitespace(body, 0)
        if start < len(body) and body[start] == "{":
            return ParsedText("", calls_in_sequence(body, start))
        undecided = not final and (PYTHON_TAG.startswith(text) or start == len(body))
        return ParsedText("" if undecided else text)
