"""`xlam`: Salesforce xLAM's JSON array of {"name": ..., "arguments": {...}} calls, written bare (the whole
answer), after a </think>, or inside a ```json fence, [TOOL_CALLS] or <tool_call>…</tool_call> (vLLM's
xlam reads all four). The content is the text before the calls, without surrounding whitespace — the
thinking included, </think> and all (vLLM's answer) — so whitespace is held back while the text grows."""

from __future__ import annotations

from llmctl.engine.reasoning.parsers import held_back
from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager
from llmctl.server.tool_parsers.drafts import calls_in_array
from llmctl.server.tool_parsers.json_scan import WHITESPACE, skip_whitespace

THINK_END = "</think>"
FENCE, FENCE_LANGUAGE = "```", "json"
OPENINGS = (FENCE, "[TOOL_CALLS]", "<tool_call>")


@ToolParserManager.register_module("xlam")
class XLamToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        think = text.find(THINK_END)
        before_end = think + len(THINK_END) if think >= 0 else 0
        at, opening = _first_opening(text, before_end)
        if at < 0:
            at, opening = (before_end, "") if think >= 0 or text.lstrip().startswith("[") else (-1, "")
        if at < 0:
            return ParsedText(text if final else _growing(text, OPENINGS + (THINK_END,)))
        start = at + len(opening)
        if opening == FENCE and text.startswith(FENCE_LANGUAGE, start):
            start += len(FENCE_LANGUAGE)
        start = skip_whitespace(text, start)
        content = text[:at].rstrip(WHITESPACE)
        if start == len(text) or (not final and opening == FENCE and FENCE_LANGUAGE.startswith(text[start:])):
            return ParsedText(text if final else content)
        if text[start] != "[":
            return ParsedText(text if final or think < 0 else _growing(text, OPENINGS))
        calls, _ = calls_in_array(text, start)
        return ParsedText(content, calls)


def _first_opening(text: str, start: int) -> tuple[int, str]:
    found = [(at, opening) for opening in OPENINGS if (at := text.find(opening, start)) >= 0]
    return min(found) if found else (-1, "")


def _growing(text: str, markers: tuple[str, ...]) -> str:
    """Content of text still growing: trailing whitespace and a possible marker's start held back."""
    kept = text[:len(text) - max(held_back(text, marker) for marker in markers)]
    return kept.rstrip(WHITESPACE)
