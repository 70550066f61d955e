"""The chat request's own fields: its messages (roles, content, an assistant's tool calls, a tool
message's call id) as the chat template takes them, and the variables handed to the template
(vLLM's chat_template_kwargs, and reasoning_effort, which vLLM hands to the template too)."""

from __future__ import annotations

import json
from typing import Any

from llmctl.server.content_parts import message_content
from llmctl.server.protocol import JSON, Fields, bad

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's values


RESERVED_TEMPLATE_NAMES = ("conversation", "messages", "chat_template", "tokenize", "add_generation_prompt",
                           "continue_final_message", "return_dict", "return_assistant_tokens_mask", "tools",
                           "documents", "padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs")


def chat_template_kwargs(fields: Fields) -> dict[str, JSON]:
    """vLLM's chat_template_kwargs: variables handed to the template (Qwen3's enable_thinking)."""
    kwargs = fields.raw("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs must be an object of template variables", "chat_template_kwargs")
    reserved = sorted(set(kwargs) & set(RESERVED_TEMPLATE_NAMES))
    if reserved:
        raise bad(f"chat_template_kwargs may not set {', '.join(reserved)}: those are arguments of the "
                  "request itself", "chat_template_kwargs")
    effort = fields.raw("reasoning_effort")
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        raise bad(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    return {"reasoning_effort": effort, **kwargs}  # templates that know it (gpt-oss's) read it


def chat_messages(fields: Fields) -> list[dict[str, Any]]:
    """messages with roles system/user/assistant (also developer/tool); content a string, or transformers' part
    list where it holds images (llmctl.server.content_parts)."""
    messages = fields.raw("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages")
    result = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(f"{where} must be an object with role and content", "messages")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise bad(f"{where}.role must be system, user or assistant, got {role!r}", "messages")
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                 "content": message_content(message.get("content"), where)}
        entry.update(_tool_fields(message, where))
        result.append(entry)
    return result


def _tool_fields(message: dict[str, JSON], where: str) -> dict[str, Any]:
    """An assistant's tool_calls (their JSON arguments parsed, as chat templates and vLLM take them) and a
    tool message's tool_call_id / name, for the chat template."""
    fields: dict[str, Any] = {key: message[key] for key in ("tool_call_id", "name") if isinstance(message.get(key), str)}
    calls = message.get("tool_calls")
    if calls is None:
        return fields
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              for c in calls):
        raise bad(f"{where}.tool_calls must be a list of {{\"function\": {{\"name\", \"arguments\"}}}}", "messages")
    parsed = []
    for call in calls:
        arguments = call["function"].get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise bad(f"{where}.tool_calls: arguments must be a JSON object (as text)", "messages") from None
        parsed.append({**call, "function": {**call["function"], "arguments": arguments}})
    return fields | {"tool_calls": parsed}
