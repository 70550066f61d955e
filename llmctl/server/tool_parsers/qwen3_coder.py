"""`qwen3_coder` (also vLLM's `qwen3_xml`) and `seed_oss`: Qwen3-Coder's XML calls, each
<tool_call><function=NAME><parameter=KEY>value</parameter>…</function></tool_call> (vLLM also reads a
<function=…> block without the <tool_call> around it). Values are typed by the request's tool schema
(typed_values); a parameter the schema does not name stays text. The content is the text before the
first call."""

from __future__ import annotations

from llmctl.engine.reasoning.parsers import held_back
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager
from llmctl.server.tool_parsers.typed_values import arguments_text, function_properties, typed_value

CALL, FUNCTION, FUNCTION_END = "<tool_call>", "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


@ToolParserManager.register_module(["qwen3_coder", "qwen3_xml"])
class Qwen3CoderToolParser(ToolParser):
    call_start = CALL
    thinking: tuple[str, str] | None = None  # (start, end): calls written while thinking are not calls

    def parse(self, text: str, final: bool) -> ParsedText:
        after = self._after_thinking(text)
        if after is None:  # still thinking: everything is content so far
            return ParsedText(text)
        starts = [at for at in (text.find(self.call_start, after), text.find(FUNCTION, after)) if at >= 0]
        if not starts:
            held = 0 if final else max(held_back(text, self.call_start), held_back(text, FUNCTION))
            return ParsedText(text[:len(text) - held])
        content, rest = text[:min(starts)], text[min(starts):]
        calls = [self._call(block, final) for block in rest.split(FUNCTION)[1:]]
        if final and not calls:
            return ParsedText(text)  # a marker with no function after it: the answer is text
        return ParsedText(content, calls)

    def _after_thinking(self, text: str) -> int | None:
        """Where calls may start: after the thinking's end marker (None while the thinking is open)."""
        if self.thinking is None or self.thinking[0] not in text:
            return 0
        end = text.find(self.thinking[1])
        return None if end < 0 else end + len(self.thinking[1])


    def _call(self, block: str, final: bool) -> ToolCallDraft:
        name_end = block.find(">")
        if name_end < 0:
            return ToolCallDraft(None, "", final)
        name = block[:name_end].strip()
        body = block[name_end + 1:]
        complete = FUNCTION_END in body
        body = body.split(FUNCTION_END)[0]
        properties = function_properties(self.tools, name)
        pairs = []
        for part in body.split(PARAMETER)[1:]:
            key_end, value_end = part.find(">"), part.find(PARAMETER_END)
            if key_end < 0 or value_end < 0:
                break  # the parameter is still being written
            key = part[:key_end].strip()
            value = _trimmed(part[key_end + 1:value_end])
            pairs.append((key, typed_value(value, properties.get(key), unknown_as_text=True)))
        return ToolCallDraft(name or None, arguments_text(pairs, complete), complete)


@ToolParserManager.register_module("seed_oss")
class SeedOssToolParser(Qwen3CoderToolParser):
    """Seed-OSS: the same XML inside <seed:tool_call>…</seed:tool_call>; a call written inside
    <seed:think>…</seed:think> is part of the thinking, not a call (vLLM's rule)."""

    call_start = "<seed:tool_call>"
    thinking = ("<seed:think>", "</seed:think>")


def _trimmed(value: str) -> str:
    """The value without the one newline the format puts on each side."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value
