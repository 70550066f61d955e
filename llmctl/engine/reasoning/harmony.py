"""`openai_gptoss` (vLLM's name): gpt-oss's harmony output read by openai-harmony (llmctl.harmony.reader).

The analysis channel (and messages to built-in tools) is reasoning, several messages joined by newlines. The
answer is the final channel and commentary without a recipient (preambles), in order; a call — commentary to
functions.NAME — stays in the answer as one marked span, `<|channel|>commentary to=functions.NAME<|message|>
ARGUMENTS<|call|>`, for the `openai` tool-call parser to read, or as text when tool calling is off.
Structured outputs constrain the final channel: the reasoning ends at <|channel|>final<|message|>."""

from __future__ import annotations

from typing import Any

from llmctl.engine.reasoning.parsers import ReasoningParser, ReasoningParserManager, ReasoningSplit
from llmctl.harmony.reader import HarmonyMessage, HarmonyReader

CALL_OPEN, CALL_ARGUMENTS, CALL_CLOSE = "<|channel|>commentary to=functions.", "<|message|>", "<|call|>"


@ReasoningParserManager.register_module("openai_gptoss")
class GptOssReasoningParser(ReasoningParser):
    start_token = "<|start|>assistant"  # a prompt's last one opens the answer, reasoning first
    end_token = "<|channel|>final<|message|>"
    keep_special_tokens = True

    def __init__(self, thinking: bool = True, template_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(thinking, template_kwargs)
        self.reader = HarmonyReader()

    def split(self, text: str, final: bool) -> ReasoningSplit:
        messages = self.reader.read(text, final)
        reasoning = [message.text for message in messages if _is_reasoning(message)]
        answer = "".join(_answer_part(message) for message in messages if not _is_reasoning(message))
        return ReasoningSplit("\n".join(reasoning) if reasoning else None, answer)


def _is_reasoning(message: HarmonyMessage) -> bool:
    if message.recipient is not None:
        return not message.recipient.startswith("functions.")
    return message.channel == "analysis"


def _answer_part(message: HarmonyMessage) -> str:
    if message.recipient is None:
        return message.text
    name = message.recipient.removeprefix("functions.")
    return f"{CALL_OPEN}{name}{CALL_ARGUMENTS}{message.text}{CALL_CLOSE if message.complete else ''}"
