"""IBM Granite's two formats.

- `granite` (Granite 3.0 / 3.1): the whole answer is a JSON array of calls, after <|tool_call|> (3.0's
  special token) or <tool_call> (3.1's text); an answer that is not one is text, as vLLM reads it.
- `granite-20b-fc` (granite-20b-functioncalling): <function_call> {"name": ..., "arguments": {...}} per
  call, one after another; the content is the text before the first.
"""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import call_from_object, calls_in_array
from llmctl.server.tool_parsers.json_scan import skip_whitespace

MARKERS = ("<|tool_call|>", "<tool_call>")
FUNCTION_CALL = "<function_call>"


@ToolParserManager.register_module("granite")
class GraniteToolParser(ToolParser):
    keep_special_tokens = True  # <|tool_call|> is a special token of Granite 3.0's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        start = skip_whitespace(text, 0)
        opening = text[start:]
        if not final and any(marker.startswith(opening) for marker in MARKERS):
            return ParsedText("")  # blank so far, or the start of a marker
        marker = next((m for m in MARKERS if opening.startswith(m)), "")
        start = skip_whitespace(text, start + len(marker))
        if start >= len(text):
            return ParsedText(text if final else "")
        if text[start] != "[":
            return ParsedText(text)  # not a list of calls: the answer is text
        calls, end = calls_in_array(text, start)
        if end is not None and skip_whitespace(text, end) < len(text):
            return ParsedText(text)  # text after the calls: not a call answer (vLLM's rule)
        return ParsedText("", calls)


@ToolParserManager.register_module("granite-20b-fc")
class Granite20bFcToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, FUNCTION_CALL, final)
        if rest is None:
            return ParsedText(content)
        calls: list[ToolCallDraft] = []
        for part in rest.split(FUNCTION_CALL):
            start = skip_whitespace(part, 0)
            if start == len(part):
                continue  # the call's text has not begun
            if part[start] != "{":
                return ParsedText(text)  # not a JSON call: the answer is text
            calls.append(call_from_object(part, start)[0])
        if final and not calls:
            return ParsedText(text)
        return ParsedText(content, calls)
