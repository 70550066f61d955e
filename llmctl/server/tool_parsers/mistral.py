"""`mistral`: [TOOL_CALLS] then a JSON array of {"name": ..., "arguments": {...}} (Mistral 7B v0.3,
Mistral Nemo, Small), or [TOOL_CALLS]name[ARGS]{...} per call (tokenizer v11 and later; vLLM also reads
[TOOL_CALLS]name{...}, which v11 models write too). The marker
is a special token, kept in the text for this parser (as vLLM's adjust_request does); call ids are 9
letters and digits, as Mistral's chat template requires."""

from __future__ import annotations

import random
import string

from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager, content_before
from llmctl.server.tool_parsers.drafts import calls_in_array
from llmctl.server.tool_parsers.json_scan import scan_value, skip_whitespace

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"


@ToolParserManager.register_module("mistral")
class MistralToolParser(ToolParser):
    keep_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedText:
        content, rest = content_before(text, MARKER, final)
        if rest is None:
            return ParsedText(content)
        start = skip_whitespace(rest, 0)
        if start < len(rest) and rest[start] == "[" and not rest.startswith(ARGS, start):
            return ParsedText(content, calls_in_array(rest, start)[0])
        return ParsedText(content, [_named_call(part, final) for part in rest.split(MARKER) if part or final])

    def new_call_id(self) -> str:
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))


def _named_call(part: str, final: bool) -> ToolCallDraft:
    """name[ARGS]{...} or name{...}: the name is whole once [ARGS] or the arguments' brace follows it."""
    at, brace = part.find(ARGS), part.find("{")
    if at >= 0 and (brace < 0 or at < brace):
        name, body = part[:at].strip(), part[at + len(ARGS):]
    elif brace > 0 and "[" not in part[:brace]:
        name, body = part[:brace].strip(), part[brace:]
    else:
        return ToolCallDraft(None, "", final)
    start = skip_whitespace(body, 0)
    end, whole = scan_value(body, start)
    return ToolCallDraft(name or None, body[start:end] if body[start:start + 1] == "{" else "", whole or final)
