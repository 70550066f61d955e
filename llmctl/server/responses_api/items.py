"""Response objects of /v1/responses: the output items one chat message becomes (reasoning, an
assistant message with output_text, function calls), the response around them, and its usage."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from llmctl.engine.front.outputs import RequestOutput
from llmctl.server.protocol import JSON, Fields


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str) -> dict[str, JSON]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed"}


def text_part(text: str) -> dict[str, JSON]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, JSON]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [text_part(text)] if text is not None else []}


def function_call_item(item_id: str, call: dict[str, JSON], status: str = "completed") -> dict[str, JSON]:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def item_status(finish_reason: str | None) -> str:
    """An output item's status when its message ends: cut by max_output_tokens, the item being written is
    `incomplete` (as the response is), else `completed`."""
    return "incomplete" if finish_reason == "length" else "completed"


def output_items(message: dict[str, JSON], finish_reason: str | None = None) -> list[dict[str, JSON]]:
    """The items of one finished chat message, in the order the model wrote them; the last is the one a
    max_output_tokens cut interrupted."""
    items = _items(message)
    if items:
        items[-1]["status"] = item_status(finish_reason)
    return items


def _items(message: dict[str, JSON]) -> list[dict[str, JSON]]:
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    items += [function_call_item(new_id("fc"), call) for call in message.get("tool_calls", [])]
    return items


def usage(output: RequestOutput) -> dict[str, JSON]:
    prompt, generated = len(output.prompt_token_ids), sum(len(c.token_ids) for c in output.outputs)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": output.num_cached_tokens},
            "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated}


@dataclass
class ResponseShell:
    """What every Response object of one request repeats: its id and the request's settings."""

    response_id: str
    model: str
    request: Fields
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict[str, JSON]], usage: dict[str, JSON] | None = None,
             finish_reason: str | None = None) -> dict[str, JSON]:
        raw = self.request.raw
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": "incomplete" if incomplete else status, "model": self.model, "output": output,
                "instructions": raw("instructions"), "max_output_tokens": raw("max_output_tokens"),
                "parallel_tool_calls": raw("parallel_tool_calls", True), "temperature": raw("temperature"),
                "top_p": raw("top_p"), "tool_choice": raw("tool_choice", "auto"), "tools": raw("tools", []),
                "text": raw("text") or {"format": {"type": "text"}}, "metadata": raw("metadata") or {},
                "store": False, "previous_response_id": None, "error": None, "incomplete_details": incomplete,
                "usage": usage}
