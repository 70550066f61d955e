"""A /v1/messages request (Anthropic's Messages API) read into the chat completions body it means, as
vLLM reads it: `system` (text or text blocks) as the system message; each message's blocks as chat
content — text, images (base64 or URL sources), an assistant's `tool_use` blocks as its tool_calls, a
user's `tool_result` blocks as tool messages before the rest of that turn; `tools` with their
`input_schema` as function tools; `tool_choice` auto / any / tool / none as auto / required / a named
function / none; `stop_sequences` as stop; `thinking` as the template's enable_thinking;
`output_config.format` as a JSON-schema response_format (`thinking.display` "omitted" sends
thinking blocks empty). Earlier thinking blocks are not shown to the
model again (chat templates drop earlier reasoning); a tool_result with `is_error` reaches the model
prefixed "Error: "."""

from __future__ import annotations

import json
import logging

from llmctl.server.protocol import CHAT_FIELDS, JSON, Fields, FieldSpec, bad

logger = logging.getLogger("llmctl.server")

PASSED_ON = ("model", "max_tokens", "temperature", "top_p", "top_k", "stream",
             # vLLM's extensions of the chat request, taken here as on /v1/chat/completions
             "chat_template_kwargs", "structured_outputs", "seed", "min_tokens", "repetition_penalty", "priority")
REFUSED = {"mcp_servers": "MCP servers are not connected by llmctl: call the tools yourself and send tool_result "
                          "blocks",
           "container": "llmctl runs no code containers",
           "context_management": "llmctl does not edit the context: send the messages you want the model to see"}
# cache_control asks for the prefix caching llmctl does for every request
ACCEPTED = {"messages", "system", "stop_sequences", "tools", "tool_choice", "thinking", "output_config",
            "metadata", "service_tier", "cache_control", *PASSED_ON, *REFUSED}
COUNT_ACCEPTED = {"model", "messages", "system", "tools", "tool_choice", "thinking", "chat_template_kwargs"}

ARRAY, OBJECT = {"type": "array"}, {"type": "object"}
# What /openapi.json publishes (Anthropic's fields; vLLM's sampling extensions as in chat)
COUNT_FIELDS: dict[str, FieldSpec] = {
    "model": CHAT_FIELDS["model"],
    "messages": FieldSpec("custom", "user/assistant turns: text, or blocks (text, image, tool_use, tool_result, "
                                    "thinking)", schema=ARRAY),
    "system": FieldSpec("custom", "the system prompt: text or text blocks",
                        schema={"anyOf": [{"type": "string"}, ARRAY]}),
    "tools": FieldSpec("custom", "client tools: {name, description, input_schema}", schema=ARRAY),
    "tool_choice": FieldSpec("custom", "{type: auto | any | tool (with name) | none, disable_parallel_tool_use}",
                             schema=OBJECT),
    "thinking": FieldSpec("custom", "{type: enabled | adaptive | between_tools | disabled}: the template's "
                                    "enable_thinking", schema=OBJECT),
}
MESSAGES_FIELDS: dict[str, FieldSpec] = {
    **COUNT_FIELDS,
    "max_tokens": FieldSpec("integer", "most tokens to generate (required)"),
    "stop_sequences": FieldSpec("custom", "strings that end the turn (stop_reason stop_sequence)", schema=ARRAY),
    "stream": FieldSpec("boolean", "Anthropic's streaming events", False),
    "output_config": FieldSpec("custom", "format: {type: json_schema, schema}", schema=OBJECT),
    **{name: CHAT_FIELDS[name] for name in PASSED_ON if name in CHAT_FIELDS and name not in ("model", "max_tokens",
                                                                                             "stream")},
}
BILLING_HEADER = "x-anthropic-billing-header"
SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier reasoning: not shown again


def chat_body(fields: Fields, counting: bool = False) -> dict[str, JSON]:
    """The equivalent /v1/chat/completions body; what cannot be answered is a 400 naming the field."""
    for name, why in REFUSED.items():
        if fields.raw(name) not in (None, [], {}):
            raise bad(f"{name}: {why}", name)
    if not counting:
        _check_max_tokens(fields)
    body: dict[str, JSON] = {name: fields.raw(name) for name in PASSED_ON if fields.raw(name) is not None}
    body["messages"] = _system(fields.raw("system")) + _messages(fields.raw("messages"))
    if fields.raw("stop_sequences") is not None:
        body["stop"] = _strings(fields.raw("stop_sequences"), "stop_sequences")
    if fields.raw("tools") not in (None, []):
        body["tools"] = [_chat_tool(tool) for tool in _list(fields.raw("tools"), "tools")]
    if fields.raw("tool_choice") is not None:
        body.update(_tool_choice(fields.raw("tool_choice")))
    thinking = _thinking(fields.raw("thinking"), fields.int("max_tokens"), counting)
    if thinking is not None:
        kwargs = fields.raw("chat_template_kwargs") or {}
        body["chat_template_kwargs"] = {"enable_thinking": thinking, **(kwargs if isinstance(kwargs, dict) else {})}
    output_format = _output_format(fields.raw("output_config"))
    if output_format is not None:
        body["response_format"] = output_format
    return body


def _check_max_tokens(fields: Fields) -> None:
    max_tokens = fields.int("max_tokens")
    if max_tokens is None or max_tokens < 1:
        raise bad("max_tokens is required and must be at least 1 (the Messages API has no default)", "max_tokens")


def _system(system: JSON) -> list[dict[str, JSON]]:
    if system is None or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    blocks = _list(system, "system")
    if not all(isinstance(block, dict) and block.get("type") == "text" for block in blocks):
        raise bad("system must be text or a list of text blocks ({\"type\": \"text\", \"text\": ...})", "system")
    texts = [str(block.get("text", "")) for block in blocks]
    # Claude Code's attribution header changes every request and would defeat prefix caching (vLLM drops it too)
    return [{"role": "system", "content": "\n".join(t for t in texts if not t.startswith(BILLING_HEADER))}]


def _messages(given: JSON) -> list[dict[str, JSON]]:
    messages: list[dict[str, JSON]] = []
    for index, message in enumerate(_list(given, "messages")):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant", "system"):
            raise bad(f"messages[{index}].role must be user or assistant, got {role!r}", "messages")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        messages += _turn(role, _list(content, "messages"), index)
    if not messages:
        raise bad("messages must be a non-empty list", "messages")
    return messages


def _turn(role: str, blocks: list[JSON], index: int) -> list[dict[str, JSON]]:
    """One message's blocks: tool results first (as tool messages), then the turn's own content."""
    results: list[dict[str, JSON]] = []
    parts: list[dict[str, JSON]] = []
    calls: list[dict[str, JSON]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _result_text(block)})
        elif kind not in SKIPPED_BLOCKS:
            raise bad(f"messages[{index}]: content blocks of type {kind!r} are not supported in a {role} message: use "
                      "text, image, tool_use (assistant), tool_result (user) or thinking", "messages")
    own: list[dict[str, JSON]] = []
    if parts or calls:
        content: JSON = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else (parts or None)
        own.append({"role": role, "content": content, **({"tool_calls": calls} if calls else {})})
    return results + own


def _image_url(source: JSON) -> str:
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source['data']}"
    raise bad("an image block's source must be {\"type\": \"base64\", \"media_type\", \"data\"} or {\"type\": \"url\", "
              "\"url\"}", "messages")


def _result_text(block: dict[str, JSON]) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        blocks = _list(content, "messages")
        if not all(isinstance(item, dict) and item.get("type") == "text" for item in blocks):
            raise bad("a tool_result's content must be text or text blocks (no images in tool results)", "messages")
        text = "\n".join(str(item.get("text", "")) for item in blocks)
    return f"Error: {text}" if block.get("is_error") else text


def _chat_tool(tool: JSON) -> dict[str, JSON]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) \
            or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise bad(f"tools: only client tools ({{\"name\", \"description\", \"input_schema\"}}) are supported, not "
                  f"{kind!r} (server tools run on Anthropic's side)", "tools")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise bad(f"tools: {tool['name']} needs an input_schema object", "tools")
    function: dict[str, JSON] = {"name": tool["name"], "parameters": {"type": "object", **schema}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: JSON) -> dict[str, JSON]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    chat: JSON = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad("tool_choice.name is required when type is \"tool\"", "tool_choice")
        chat = {"type": "function", "function": {"name": choice["name"]}}
    if chat is None:
        raise bad("tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice")
    single = isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True
    return {"tool_choice": chat, **({"parallel_tool_calls": False} if single else {})}


def _thinking(thinking: JSON, max_tokens: int | None, counting: bool) -> bool | None:
    """enable_thinking for the template, or None when the request leaves it to the template."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return False
    if kind not in ("enabled", "adaptive", "between_tools"):
        raise bad("thinking must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"adaptive\"}, "
                  "{\"type\": \"between_tools\"} or {\"type\": \"disabled\"}", "thinking")
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise bad("thinking.display must be \"summarized\" or \"omitted\"", "thinking")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and not (isinstance(budget, int) and budget >= 1024
                                  and (counting or max_tokens is None or budget < max_tokens)):
        raise bad("thinking.budget_tokens must be an integer of at least 1024 and below max_tokens", "thinking")
    if budget is not None:
        logger.warning("thinking.budget_tokens %s: llmctl bounds the thinking only by max_tokens", budget)
    return True


def thinking_shown(fields: Fields) -> bool:
    """False for thinking.display "omitted": thinking blocks are sent empty (with their signature)."""
    thinking = fields.raw("thinking")
    return not (isinstance(thinking, dict) and thinking.get("display") == "omitted")


def _output_format(config: JSON) -> dict[str, JSON] | None:
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"format", "effort"}:
        raise bad("output_config takes format ({\"type\": \"json_schema\", \"schema\": {...}})", "output_config")
    if config.get("effort") is not None:
        raise bad("output_config.effort is not supported: llmctl's models have no effort setting; leave it out",
                  "output_config")
    given = config.get("format")
    if given is None:
        return None
    if not isinstance(given, dict) or given.get("type") != "json_schema" or not isinstance(given.get("schema"), dict):
        raise bad("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}", "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": given["schema"]}}


def _strings(value: JSON, name: str) -> list[str]:
    items = _list(value, name)
    if not all(isinstance(item, str) for item in items):
        raise bad(f"{name} must be a list of strings", name)
    return [str(item) for item in items]


def _list(value: JSON, name: str) -> list[JSON]:
    if not isinstance(value, list):
        raise bad(f"{name} must be a list", name)
    return value
