"""`openai` (vLLM's name): gpt-oss's calls, as the `openai_gptoss` reasoning parser leaves them in the answer
— harmony's commentary messages to functions.NAME, their JSON arguments as the model writes them. The
content is the rest of the answer (the final channel, preambles)."""

from __future__ import annotations

from llmctl.engine.reasoning.harmony import CALL_ARGUMENTS, CALL_CLOSE, CALL_OPEN
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before


@ToolParserManager.register_module("openai")
class OpenAIToolParser(ToolParser):
    keep_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, CALL_OPEN, final)
        if rest is None:
            return ParsedText(content)
        calls = []
        for span in rest.split(CALL_OPEN):
            call, after = _call(span, final)
            calls.append(call)
            content += after
        return ParsedText(content, calls)


def _call(span: str, final: bool) -> tuple[ToolCallDraft, str]:
    """The call a span holds, and the answer text the model wrote after it."""
    name, named, body = span.partition(CALL_ARGUMENTS)
    if not named:
        return ToolCallDraft(None, "", final), ""
    arguments, closed, after = body.partition(CALL_CLOSE)
    return ToolCallDraft(name, arguments, bool(closed) or final), after
