"""`minimax_m2`: MiniMax-M2's <minimax:tool_call> block of <invoke name="NAME"><parameter name="KEY">value
</parameter>…</invoke> calls. With the request's tools the values are typed by their schema (typed_values),
"null" / "none" / "nil" being null; without tools they stay text (vLLM's rules). The content is the text
before the block."""

from __future__ import annotations

from llmctl.server.protocol import JSON
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.typed_values import arguments_text, function_properties, typed_value

START = "<minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
PARAMETER, PARAMETER_END = "<parameter name=", "</parameter>"
NULLS = ("null", "none", "nil")


@ToolParserManager.register_module("minimax_m2")
class MiniMaxM2ToolParser(ToolParser):
    keep_special_tokens = True  # <minimax:tool_call> is a special token of MiniMax-M2's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, START, final)
        if rest is None:
            return ParsedText(content)
        calls = [self._call(block, final) for block in rest.split(INVOKE)[1:]]
        if final and not calls:
            return ParsedText(text)
        return ParsedText(content, calls)

    def _call(self, block: str, final: bool) -> ToolCallDraft:
        name_end = block.find(">")
        if name_end < 0:
            return ToolCallDraft(None, "", final)
        name = _unquoted(block[:name_end])
        complete = INVOKE_END in block
        properties = function_properties(self.tools, name)
        pairs = []
        for part in block.split(INVOKE_END)[0].split(PARAMETER)[1:]:
            key_end, value_end = part.find(">"), part.find(PARAMETER_END)
            if key_end < 0 or value_end < 0:
                break  # the parameter is still being written
            key = _unquoted(part[:key_end])
            pairs.append((key, self._value(part[key_end + 1:value_end].strip(), properties.get(key))))
        return ToolCallDraft(name or None, arguments_text(pairs, complete), complete)

    def _value(self, text: str, prop: JSON) -> JSON:
        if not self.tools:
            return text
        if text.lower() in NULLS:
            return None
        return typed_value(text, prop if prop is not None else {"type": "string"}, unknown_as_text=True)


def _unquoted(name: str) -> str:
    name = name.strip()
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'" else name
