"""`kimi_k2`: Kimi K2's calls between <|tool_calls_section_begin|> and <|tool_calls_section_end|>, each
<|tool_call_begin|>functions.NAME:N <|tool_call_argument_begin|>{…}<|tool_call_end|>. The model's id
(functions.NAME:N) is the call's id, as vLLM returns it; an id that is not NAME:N is skipped; a bare
counter ("0") names the request's only tool, or the one tool whose properties hold every argument."""

from __future__ import annotations

import json
import re

from llmctl.engine.reasoning.parsers import held_back
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.typed_values import function_properties

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
CALL_ID = re.compile(r"^(?:functions\.)?(?P<name>[^\s:]+):\d+$")


@ToolParserManager.register_module("kimi_k2")
class KimiK2ToolParser(ToolParser):
    keep_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, SECTION, final)
        if rest is None:
            return ParsedText(content)
        calls = [self._call(block, final) for block in rest.split(SECTION_END)[0].split(CALL)[1:]]
        return ParsedText(content, [call for call in calls if call is not None])

    def _call(self, block: str, final: bool) -> ToolCallDraft | None:
        call_id, found, body = block.partition(ARGUMENTS)
        if not found:
            return None if final else ToolCallDraft(None, "", False)
        complete = CALL_END in body
        arguments = body.split(CALL_END)[0].lstrip()  # as streamed: trailing spaces stay (JSON ignores them)
        if not complete:  # what may be the start of the end marker waits for the next token
            arguments = arguments[:len(arguments) - held_back(arguments, CALL_END)]
        call_id = call_id.strip()
        named = CALL_ID.match(call_id)
        if named is not None:
            return ToolCallDraft(named.group("name"), arguments, complete or final, call_id)
        if not call_id.isdigit():
            return None  # a malformed id: vLLM skips the call
        name = self._tool_for(arguments) if complete else None
        if complete and name is None:
            return None
        return ToolCallDraft(name, arguments, complete or final, call_id)

    def _tool_for(self, arguments: str) -> str | None:
        """A bare counter's tool: the only one, or the one whose properties hold every argument."""
        names: list[str] = [str(tool["function"]["name"]) for tool in self.tools]
        if len(names) == 1:
            return names[0]
        try:
            given = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(given, dict):
            return None
        fits = [name for name in names if set(given) <= set(function_properties(self.tools, name))]
        return fits[0] if len(fits) == 1 else None
