"""Message objects of /v1/messages: the content blocks one chat message becomes (thinking, text,
tool_use), the stop reason, and usage in Anthropic's terms (input_tokens counts what was not read
from the prefix cache; cache_read_input_tokens what was)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from llmctl.engine.front.outputs import CompletionOutput, RequestOutput
from llmctl.server.protocol import JSON


def thinking_block(text: str) -> dict[str, JSON]:
    # the signature lets clients send the block back unchanged; llmctl does not check it (vLLM's choice too)
    return {"type": "thinking", "thinking": text, "signature": uuid.uuid4().hex}


def text_block(text: str) -> dict[str, JSON]:
    return {"type": "text", "text": text}


def tool_use_block(call: dict[str, JSON], arguments: str | None = None) -> dict[str, JSON]:
    """A tool call as a tool_use block; `arguments` None: the arguments of a whole call, parsed."""
    given = call["function"]["arguments"] if arguments is None else arguments
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": json.loads(given) if given else {}}


def content_blocks(message: dict[str, JSON], thinking_shown: bool = True) -> list[dict[str, JSON]]:
    blocks = []
    if message.get("reasoning_content"):
        blocks.append(thinking_block(message["reasoning_content"] if thinking_shown else ""))
    if message.get("content"):
        blocks.append(text_block(message["content"]))
    return blocks + [tool_use_block(call) for call in message.get("tool_calls", [])]


def stop_reason(completion: CompletionOutput, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence: tool_use once calls were made, max_tokens, stop_sequence
    (with the one that matched), else end_turn."""
    if called:
        return "tool_use", None
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    return "end_turn", None


def usage(output: RequestOutput, output_tokens: int | None = None) -> dict[str, JSON]:
    cached = output.num_cached_tokens or 0
    generated = sum(len(c.token_ids) for c in output.outputs) if output_tokens is None else output_tokens
    return {"input_tokens": len(output.prompt_token_ids) - cached, "output_tokens": generated,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


@dataclass(frozen=True)
class MessageShell:
    message_id: str
    model: str
    thinking_shown: bool = True  # False: thinking.display "omitted"

    def body(self, content: list[dict[str, JSON]], stop: tuple[str | None, str | None],
             usage: dict[str, JSON]) -> dict[str, JSON]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}
