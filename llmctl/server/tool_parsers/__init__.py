"""Tool-call parsers (`--tool-call-parser`) and the readers of forced tool choices. Importing the
package registers the built-in parsers."""

from llmctl.server.tool_parsers import (  # registers them
    deepseek,
    glm45,
    hermes,
    internlm,
    jamba,
    kimi_k2,
    llama3_json,
    mistral,
    pythonic,
    qwen3_coder,
)
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager

__all__ = ["ParsedText", "ToolCallDraft", "ToolParser", "ToolParserManager", "deepseek", "glm45", "hermes", "internlm", "jamba", "kimi_k2",
           "llama3_json", "mistral", "pythonic", "qwen3_coder"]
