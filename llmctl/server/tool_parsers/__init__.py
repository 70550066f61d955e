"""Tool-call parsers (`--tool-call-parser`) and the readers of forced tool choices. Importing the
package registers the built-in parsers."""

from llmctl.server.tool_parsers import (  # registers them
    deepseek,
    glm45,
    granite,
    hermes,
    internlm,
    jamba,
    kimi_k2,
    llama3_json,
    minimax_m2,
    mistral,
    openai,
    phi4_mini,
    pythonic,
    qwen3_coder,
    xlam,
)
from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager

__all__ = ["ParsedText", "ToolCallDraft", "ToolParser", "ToolParserManager", "deepseek", "glm45", "granite", "hermes",
           "internlm", "jamba", "kimi_k2", "llama3_json", "minimax_m2", "mistral", "openai", "phi4_mini", "pythonic",
           "qwen3_coder", "xlam"]
