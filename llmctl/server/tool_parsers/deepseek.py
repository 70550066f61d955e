"""`deepseek_v31` and `deepseek_v3`: DeepSeek's calls between <｜tool▁calls▁begin｜> and
<｜tool▁calls▁end｜>, each <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜> (V3.1), or
<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME, then the arguments in a ```json fence (V3 and R1). The
content is the text before the calls; a begin marker with no whole call after it leaves all the text
as content (vLLM's answer)."""

from __future__ import annotations

from llmctl.engine.reasoning.parsers import held_back
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before

CALLS, CALL, SEP, CALL_END = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
FENCE, FENCE_END = "```json", "```"


@ToolParserManager.register_module("deepseek_v31")
class DeepSeekV31ToolParser(ToolParser):
    keep_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, CALLS, final)
        if rest is None:
            return ParsedText(content)
        calls = [self._call(block) for block in rest.split(CALL)[1:]]
        whole = [call for call in calls if call.complete]
        if final and not whole:
            return ParsedText(text)
        return ParsedText(content, whole if final else calls)

    def _call(self, block: str) -> ToolCallDraft:
        name, found, body = block.partition(SEP)
        if not found:
            return ToolCallDraft(None, "", False)
        complete = CALL_END in body
        arguments = body.split(CALL_END)[0]
        if not complete:  # what may be the start of the end marker waits for the next token
            arguments = arguments[:len(arguments) - held_back(arguments, CALL_END)]
        return ToolCallDraft(name.strip() or None, arguments, complete)


@ToolParserManager.register_module("deepseek_v3")
class DeepSeekV3ToolParser(DeepSeekV31ToolParser):
    def _call(self, block: str) -> ToolCallDraft:
        kind, found, body = block.partition(SEP)
        line_end = body.find("\n")
        if not found or line_end < 0:
            return ToolCallDraft(None, "", False)
        name, after = body[:line_end].strip(), body[line_end + 1:]
        if not after.startswith(FENCE):
            return ToolCallDraft(name or None, "", False) if FENCE.startswith(after) else ToolCallDraft(None, "", True)
        arguments = after[len(FENCE):].lstrip("\n")
        complete = CALL_END in arguments
        arguments = arguments.split(CALL_END)[0]
        closing = arguments.find("\n" + FENCE_END)
        if closing >= 0:
            arguments = arguments[:closing]
        elif not complete:  # what may be the start of the closing fence waits for the next token
            arguments = arguments[:len(arguments) - held_back(arguments, "\n" + FENCE_END)]
        return ToolCallDraft(name or None, arguments, complete)
