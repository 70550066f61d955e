"""`glm45` (GLM-4.5 / 4.6; also vLLM's `glm4_moe`): <tool_call>NAME then <arg_key>KEY</arg_key>
<arg_value>value</arg_value> pairs and </tool_call>. Values are typed by the request's tool schema
(typed_values); a key the schema does not name is read as JSON where it parses, else text (vLLM's
rule). The content is the text before the first call."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.typed_values import arguments_text, function_properties, typed_value

START, END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@ToolParserManager.register_module(["glm45", "glm4_moe"])
class Glm45ToolParser(ToolParser):
    keep_special_tokens = True  # GLM's markers are special tokens

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, START, final)
        if rest is None:
            return ParsedText(content)
        calls = [self._call(block, final) for block in rest.split(START)]
        if final and not all(call.complete for call in calls):
            return ParsedText(text)  # a call cut off before </tool_call> is not a call (vLLM's answer)
        return ParsedText(content or "", calls)

    def _call(self, block: str, final: bool) -> ToolCallDraft:
        complete = END in block
        block = block.split(END)[0]
        name_end = min((at for at in (block.find("\n"), block.find(KEY)) if at >= 0), default=-1)
        if name_end < 0 and not complete:
            return ToolCallDraft(None, "", False)
        name = (block[:name_end] if name_end >= 0 else block).strip()
        properties = function_properties(self.tools, name)
        pairs = []
        for part in block.split(KEY)[1:]:
            key, closed, after = part.partition(KEY_END)
            value_start, value_end = after.find(VALUE), after.find(VALUE_END)
            if not closed or value_start < 0 or value_end < 0:
                break  # the pair is still being written
            value = after[value_start + len(VALUE):value_end]
            pairs.append((key.strip(), typed_value(value, properties.get(key.strip()), unknown_as_text=False)))
        return ToolCallDraft(name or None, arguments_text(pairs, complete), complete)
