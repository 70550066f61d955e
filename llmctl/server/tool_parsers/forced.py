"""tool_choice "required" and a named function, as vLLM enforces them: structured outputs make the
model write JSON that parses — for "required" an array of {"name", "parameters"} (vLLM's schema), for
a named function that function's arguments alone."""

from __future__ import annotations

from typing import Any

from llmctl.server.protocol import JSON
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser
from llmctl.server.tool_parsers.drafts import calls_in_array
from llmctl.server.tool_parsers.json_scan import skip_whitespace


def required_schema(tools: list[dict[str, JSON]], parallel_tool_calls: bool) -> dict[str, Any]:
    """vLLM's _get_json_schema_from_tool for "required": one or more calls of the given functions."""
    def one(tool: dict[str, JSON]) -> dict[str, Any]:
        function = tool["function"]
        return {"properties": {"name": {"type": "string", "enum": [function["name"]]},
                               "parameters": function.get("parameters") or {"type": "object", "properties": {}}},
                "required": ["name", "parameters"]}

    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": [one(tool) for tool in tools]}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    definitions = {}
    for tool in tools:  # $defs of every function's schema, where its $refs point
        definitions.update((tool["function"].get("parameters") or {}).get("$defs", {}))
    if definitions:
        schema["$defs"] = definitions
    return schema


class RequiredToolCalls(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        start = skip_whitespace(text, 0)
        if start < len(text) and text[start] == "[":
            return ParsedText("", calls_in_array(text, start)[0])
        return ParsedText(text if final else "")


class NamedToolCall(ToolParser):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedText:
        return ParsedText("", [ToolCallDraft(self.name, text.strip(), final)])
