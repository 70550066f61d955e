"""The tool fields of a chat request, read as vLLM reads them: `tools` go to the chat template (as
transformers' apply_chat_template(tools=...) takes them); `tool_choice` says how the output is read —
"none": text; "auto" (the default with tools): the server's --tool-call-parser finds calls in the text
(vLLM's --enable-auto-tool-choice); "required" or a named function: structured outputs force JSON
calls of the given tools, so their arguments always parse. `parallel_tool_calls: false` keeps the
first call of an auto answer and allows one call under "required"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmctl.server.chat_message import ToolCalling
from llmctl.server.protocol import JSON, Fields, bad
from llmctl.server.tool_parsers import ToolParser
from llmctl.server.tool_parsers.forced import NamedToolCall, RequiredToolCalls, required_schema

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]] | None  # for the chat template
    calling: ToolCalling | None  # how the output becomes tool calls
    schema: dict[str, Any] | None  # the JSON schema a forced choice puts on the output


def read_tools(fields: Fields, auto_parser: type[ToolParser] | None, tokenizer: Tokenizer | None = None
               ) -> ToolRequest:
    """The request's tools and tool choice; one llmctl cannot honour is a 400 that says what to do."""
    tools = template_tools(fields)
    choice = fields.raw("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("tool_choice needs tools", "tool_choice")
        return ToolRequest(None, None, None)
    single = not fields.bool("parallel_tool_calls", True)
    if choice == "none":
        return ToolRequest(tools, None, None)
    if choice in (None, "auto"):
        if auto_parser is None:
            raise bad('"auto" tool choice (the default when tools are given) requires the server to be started with '
                      "--enable-auto-tool-choice and --tool-call-parser NAME; or pass tool_choice \"required\", a "
                      "named function, or \"none\"", "tool_choice")
        return ToolRequest(tools, ToolCalling(lambda: _parser_for(auto_parser, tokenizer, tools), True, single), None)
    if choice == "required":
        return ToolRequest(tools, ToolCalling(RequiredToolCalls, True, single), required_schema(tools, not single))
    name = _named_function(choice)
    function = next((tool["function"] for tool in tools if tool["function"]["name"] == name), None)
    if function is None:
        raise bad(f"tool_choice names the function {name!r}, which is not among the request's tools", "tool_choice")
    return ToolRequest(tools, ToolCalling(lambda: NamedToolCall(name), False, True),
                       function.get("parameters") or NO_PARAMETERS)


def _parser_for(parser: type[ToolParser], tokenizer: Tokenizer | None, tools: list[dict[str, JSON]]) -> ToolParser:
    """A fresh parser that knows the request's tools (XML formats type their values by the tools' schemas)."""
    made = parser(tokenizer)
    made.tools = tools
    return made


def template_tools(fields: Fields) -> list[dict[str, Any]] | None:
    """The request's function tools as the chat template takes them, or None."""
    tools = fields.raw("tools")
    if tools in (None, []):
        return None
    if not isinstance(tools, list) or not all(_is_function_tool(tool) for tool in tools):
        raise bad("tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": "
                  "{...}}}", "tools")
    return tools


def _named_function(choice: JSON) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
            or choice.get("type", "function") != "function":
        raise bad('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": '
                  '...}}', "tool_choice")
    name: str = function["name"]
    return name


def _is_function_tool(tool: JSON) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(function, dict) \
        and isinstance(function.get("name"), str) and isinstance(function.get("parameters") or {}, dict)
