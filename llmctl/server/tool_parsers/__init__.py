"""Tool-call parsers (`--tool-call-parser`) and the readers of forced tool choices. Importing the
package registers the built-in parsers."""

from llmctl.server.tool_parsers import hermes, llama3_json, mistral, pythonic  # registers them
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager

__all__ = ["ParsedText", "ToolCallDraft", "ToolParser", "ToolParserManager", "hermes", "llama3_json", "mistral", "pythonic"]
