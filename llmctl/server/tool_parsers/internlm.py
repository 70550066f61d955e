"""`internlm`: InternLM2/2.5's one call per answer, <|action_start|><|plugin|>{"name": ...,
"parameters": {...}}<|action_end|>; the content is the text before it. A name the request's tools do
not offer is no call (vLLM's whitelist); without tools any name is taken."""

from __future__ import annotations

from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import call_from_object
from llmctl.server.tool_parsers.json_scan import skip_whitespace

START, END = "<|action_start|><|plugin|>", "<|action_end|>"


@ToolParserManager.register_module("internlm")
class InternLMToolParser(ToolParser):
    keep_special_tokens = True  # the action markers are special tokens of InternLM's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, START, final)
        if rest is None:
            return ParsedText(content)
        body = rest.split(END)[0]
        start = skip_whitespace(body, 0)
        if start >= len(body):
            return ParsedText(text if final else content)
        if body[start] != "{":
            return ParsedText(text)  # not a JSON call: the answer is text
        call, _ = call_from_object(body, start)
        if call.name is not None and self.tools and call.name not in self._offered():
            return ParsedText(text)  # a tool the request never offered is not called
        return ParsedText(content, [call])

    def _offered(self) -> set[str]:
        return {str(tool["function"]["name"]) for tool in self.tools}

