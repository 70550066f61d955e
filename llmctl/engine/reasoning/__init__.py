"""Reasoning parsers (`--reasoning-parser`): where a reasoning model's thinking ends and its answer
begins. The server splits the text into reasoning and content with them; the engine holds a request's
structured output back until the reasoning has ended (vLLM: the grammar constrains the answer only)."""

from llmctl.engine.reasoning import harmony  # noqa: F401  (registers openai_gptoss)
from llmctl.engine.reasoning.parsers import ReasoningFactory, ReasoningParser, ReasoningParserManager, ReasoningSplit

__all__ = ["ReasoningFactory", "ReasoningParser", "ReasoningParserManager", "ReasoningSplit"]
