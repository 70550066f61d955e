"""A chat message streamed in pieces of `step` characters through StreamedMessage, its deltas accumulated
as the openai SDK accumulates them."""

from __future__ import annotations

from llmctl.server.chat_message import StreamedMessage, ToolCalling


def streamed_calls(calling: ToolCalling, text: str, step: int) -> tuple[str, list[tuple[str, str, str]], bool]:
    """The content, the calls [(id, name, arguments)] and whether any call was made."""
    message = StreamedMessage(calling)
    content, calls = "", {}
    for end in list(range(step, len(text), step)) + [len(text)]:
        delta = message.delta(text[:end], final=end == len(text))
        content += delta.get("content", "")
        for fragment in delta.get("tool_calls", []):
            call = calls.setdefault(fragment["index"], {"id": fragment.get("id"), "name": None, "arguments": ""})
            call["name"] = fragment["function"].get("name") or call["name"]
            call["arguments"] += fragment["function"]["arguments"]
    return content, [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())], message.called
