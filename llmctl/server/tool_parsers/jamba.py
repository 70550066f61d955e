"""`jamba`: AI21 Jamba 1.5's <tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>; the
content is the text before it (whitespace included, whole and streamed alike). `hunyuan_a13b`: the same
block, which Hunyuan-A13B writes after its thinking; a block inside <think>…</think> is thinking, not a
call (vLLM's rule), and text after the block is dropped (as vLLM drops it)."""

from __future__ import annotations

from llmctl.engine.reasoning.parsers import held_back
from llmctl.server.tool_parsers.base import ParsedText, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import calls_in_array
from llmctl.server.tool_parsers.json_scan import skip_whitespace

START = "<tool_calls>"
THINK_START, THINK_END = "<think>", "</think>"


@ToolParserManager.register_module("jamba")
class JambaToolParser(ToolParser):
    keep_special_tokens = True  # <tool_calls> is a special token of Jamba's tokenizer

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = self._split(text, final)
        if rest is None:
            return ParsedText(content)
        start = skip_whitespace(rest, 0)
        if start >= len(rest):
            return ParsedText(text if final else content)
        if rest[start] != "[":
            return ParsedText(text)  # not a list of calls: the answer is text
        return ParsedText(content, calls_in_array(rest, start)[0])

    def _split(self, text: str, final: bool) -> tuple[str, str | None]:
        return content_before(text, START, final)


@ToolParserManager.register_module("hunyuan_a13b")
class HunyuanA13bToolParser(JambaToolParser):
    keep_special_tokens = False  # its markers are text in Hunyuan's vocabulary

    def _split(self, text: str, final: bool) -> tuple[str, str | None]:
        after = 0
        if THINK_START in text:
            end = text.find(THINK_END)
            if end < 0:  # still thinking: a block in there is not a call
                return (text if final else text[:len(text) - held_back(text, THINK_END)]), None
            after = end + len(THINK_END)
        content, rest = content_before(text[after:], START, final)
        return text[:after] + content, rest
