"""A /v1/responses request read into the chat completions body it means: `instructions` as the system
message, `input` (text, or items: messages, function calls and their outputs) as the messages, function
`tools` in chat's shape, `text.format` as response_format, `max_output_tokens` as max_tokens."""

from __future__ import annotations

from typing import Any

from llmctl.server.protocol import CHAT_FIELDS, JSON, Fields, FieldSpec, bad

PASSED_ON = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "top_k", "min_p", "seed",
             "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
             "structured_outputs", "priority", "chat_template_kwargs", "min_tokens", "ignore_eos")
REFUSED = {"previous_response_id": "llmctl keeps no responses (nothing is stored): send the whole conversation "
                                   "in input",
           "conversation": "llmctl keeps no conversations: send the whole conversation in input",
           "background": "background responses are not supported: leave background false",
           "prompt": "stored prompt templates are not supported: send input and instructions"}
# Identifiers with no effect on the answer (user, safety_identifier: for the caller's own records), and
# prompt_cache_key, a hint for the prefix caching llmctl does for every request
ACCEPTED = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "store", "metadata",
            "user", "include", "truncation", "reasoning", "service_tier", "safety_identifier", "prompt_cache_key",
            *PASSED_ON, *REFUSED}


# What /openapi.json publishes (the sampling fields as in chat; the rest as OpenAI's Responses API has them)
RESPONSES_FIELDS: dict[str, FieldSpec] = {
    "model": CHAT_FIELDS["model"],
    "input": FieldSpec("custom", "text, or items: messages (input_text and input_image parts), function_call, function_call_output",
                       schema={"anyOf": [{"type": "string"}, {"type": "array"}]}),
    "instructions": FieldSpec("string", "the system message"),
    "max_output_tokens": FieldSpec("integer", "most tokens to generate (then status incomplete)"),
    "tools": FieldSpec("custom", "function tools: {type: function, name, description, parameters}",
                       schema={"type": "array"}),
    "tool_choice": CHAT_FIELDS["tool_choice"],
    "text": FieldSpec("custom", "format: text, json_object or json_schema (name, schema, strict)",
                      schema={"type": "object"}),
    "store": FieldSpec("boolean", "accepted; nothing is stored (answered false)", False),
    **{name: CHAT_FIELDS[name] for name in PASSED_ON if name in CHAT_FIELDS and name != "model"},
}


def chat_body(fields: Fields) -> dict[str, JSON]:
    """The equivalent /v1/chat/completions body; what cannot be answered is a 400 naming the field."""
    for name, why in REFUSED.items():
        if fields.raw(name) not in (None, False):
            raise bad(f"{name}: {why}", name)
    if fields.raw("store") not in (None, False, True):
        raise bad("store must be a boolean", "store")
    _refuse_what_is_not_made(fields)
    body: dict[str, JSON] = {name: fields.raw(name) for name in PASSED_ON if fields.raw(name) is not None}
    body["messages"] = _instructions(fields) + _messages(fields.raw("input"))
    if fields.raw("max_output_tokens") is not None:
        body["max_tokens"] = fields.raw("max_output_tokens")
    if fields.raw("tools") is not None:
        body["tools"] = [_chat_tool(tool) for tool in _list(fields.raw("tools"), "tools")]
    if fields.raw("tool_choice") is not None:
        body["tool_choice"] = _chat_tool_choice(fields.raw("tool_choice"))
    text_format = fields.raw("text")
    if text_format is not None:
        body["response_format"] = _response_format(text_format)
    effort = _reasoning_effort(fields.raw("reasoning"))
    if effort is not None:
        body["reasoning_effort"] = effort
    return body


def _refuse_what_is_not_made(fields: Fields) -> None:
    """include (extra output llmctl does not produce) and automatic truncation: 400s, not silent no-ops."""
    include = fields.raw("include")
    if include not in (None, []):
        raise bad(f"include: llmctl adds no extra output ({include!r}): leave include out (reasoning comes as "
                  "reasoning items with --reasoning-parser)", "include")
    if fields.raw("truncation") not in (None, "disabled"):
        raise bad("truncation: llmctl does not drop earlier input (a prompt longer than the context is a 400): "
                  "leave truncation out or \"disabled\"", "truncation")


def _reasoning_effort(reasoning: JSON) -> JSON:
    """reasoning.effort, as chat's reasoning_effort (handed to the template); summaries are not made."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
        raise bad("reasoning takes effort (and summary)", "reasoning")
    if reasoning.get("summary") is not None or reasoning.get("generate_summary") is not None:
        raise bad("reasoning.summary: llmctl does not summarise reasoning (reasoning items carry the whole "
                  "reasoning text): leave summary out", "reasoning")
    return reasoning.get("effort")


def _instructions(fields: Fields) -> list[dict[str, JSON]]:
    instructions = fields.raw("instructions")
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise bad("instructions must be a string", "instructions")
    return [{"role": "system", "content": instructions}]


def _messages(given: JSON) -> list[dict[str, JSON]]:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages: list[dict[str, JSON]] = []
    for item in _list(given, "input"):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
        elif kind != "reasoning":  # earlier reasoning is not shown to the model again (as chat templates drop it)
            raise bad(f"input items of type {kind!r} are not supported: use message, function_call, "
                      "function_call_output (or reasoning)", "input")
    if not messages:
        raise bad("input must be text or a non-empty list of items", "input")
    return messages


def _text(content: JSON) -> JSON:
    """A message's content: text, or its input_text / output_text parts joined; with input_image parts, the parts
    as chat takes them (llmctl.server.content_parts)."""
    if isinstance(content, str) or content is None:
        return content
    parts = _list(content, "input")
    texts = ("input_text", "output_text", "text")
    if not all(isinstance(p, dict) and p.get("type") in (*texts, "input_image") for p in parts):
        raise bad("message content parts must be input_text, output_text or input_image (no files)", "input")
    if any(part["type"] == "input_image" for part in parts):
        return [{"type": "text", "text": part.get("text")} if part["type"] in texts else part for part in parts]
    return "".join(str(part.get("text", "")) for part in parts)


def _chat_tool(tool: JSON) -> dict[str, JSON]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise bad(f"tools: only function tools ({{\"type\": \"function\", \"name\": ..., \"parameters\": {{...}}}}) "
                  f"are supported, not {kind!r}", "tools")
    function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: JSON) -> JSON:
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: JSON) -> dict[str, Any]:
    given = text.get("format") if isinstance(text, dict) else None
    if given is None:
        return {"type": "text"}
    if not isinstance(given, dict) or given.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("text.format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}", "text")
    if given["type"] != "json_schema":
        return {"type": given["type"]}
    return {"type": "json_schema", "json_schema": {"name": given.get("name"), "schema": given.get("schema"),
                                                   "strict": given.get("strict")}}


def _list(value: JSON, name: str) -> list[JSON]:
    if not isinstance(value, list):
        raise bad(f"{name} must be a list", name)
    return value
