"""The tool fields of a chat request: `tools` (function definitions, handed to the chat template as
transformers' apply_chat_template(tools=...) takes them) and `tool_choice`. So far llmctl answers
`tool_choice: "none"` (the model sees the tools and answers in text); the others are refused by name:
"auto" (also OpenAI's default when tools are given) needs a tool-call parser, as in vLLM."""

from __future__ import annotations

from typing import Any

from llmctl.server.protocol import Fields, bad


def chat_tools(fields: Fields) -> list[dict[str, Any]] | None:
    """The request's function tools for the template, or None; a tool_choice llmctl cannot honour is a 400."""
    tools = fields.raw("tools")
    choice = fields.raw("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none"):
            raise bad("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(_is_function_tool(tool) for tool in tools):
        raise bad("tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": "
                  "{...}}}", "tools")
    if choice in (None, "auto"):
        raise bad('"auto" tool choice (the default when tools are given) requires --enable-auto-tool-choice and '
                  "--tool-call-parser, which llmctl does not implement yet; pass tool_choice \"none\" to let the "
                  "model see the tools and answer in text", "tool_choice")
    if choice != "none":
        raise bad(f"tool_choice {choice!r} is not supported yet: llmctl answers tool_choice \"none\" so far",
                  "tool_choice")
    return tools


def _is_function_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(function, dict) \
        and isinstance(function.get("name"), str) and isinstance(function.get("parameters", {}), dict)
