"""Tool calls written as JSON objects ({"name": ..., "arguments": {...}}), read as far as they go:
shared by the parsers whose models write them (hermes, llama3_json, mistral, tool_choice required)."""

from __future__ import annotations

import json

from llmctl.server.tool_parsers.base import ToolCallDraft
from llmctl.server.tool_parsers.json_scan import Member, scan_object, skip_whitespace

ARGUMENT_KEYS = ("arguments", "parameters")


def call_from_object(text: str, start: int, argument_keys: tuple[str, ...] = ARGUMENT_KEYS
                     ) -> tuple[ToolCallDraft, int | None]:
    """The call whose "{" is at start, and one past its "}" (None while it is open)."""
    scanned = scan_object(text, start)
    members = {member.key: member for member in scanned.members}
    name = _string(text, members.get("name"))
    found = next((members[key] for key in argument_keys if key in members), None)
    arguments = ""
    if found is not None and (found.complete or text[found.value_start:found.value_start + 1] == "{"):
        arguments = text[found.value_start:found.value_end]  # raw JSON: a growing prefix of the final text
    if found is not None and found.complete and not arguments.startswith("{"):
        arguments = _decoded_string_arguments(arguments)
    return ToolCallDraft(name, arguments, scanned.end is not None), scanned.end


def calls_in_array(text: str, start: int) -> tuple[list[ToolCallDraft], int | None]:
    """The calls of the JSON array whose "[" is at start, and one past its "]" (None while it is open)."""
    calls: list[ToolCallDraft] = []
    i = skip_whitespace(text, start + 1)
    while i < len(text):
        if text[i] == "]":
            return calls, i + 1
        if text[i] != "{":
            return calls + [ToolCallDraft(None, "", True)], len(text)  # not a call: the whole answer is invalid
        call, end = call_from_object(text, i)
        calls.append(call)
        if end is None:
            return calls, None
        i = skip_whitespace(text, end)
        if i < len(text) and text[i] == ",":
            i = skip_whitespace(text, i + 1)
    return calls, None


def calls_in_sequence(text: str, start: int, separators: str = ";") -> list[ToolCallDraft]:
    """JSON objects one after another, separated by whitespace or a separator (Llama 3's "; ")."""
    calls: list[ToolCallDraft] = []
    i = skip_whitespace(text, start)
    while i < len(text) and text[i] == "{":
        call, end = call_from_object(text, i)
        calls.append(call)
        if end is None:
            break
        i = skip_whitespace(text, end)
        while i < len(text) and text[i] in separators:
            i = skip_whitespace(text, i + 1)
    return calls


def _string(text: str, member: Member | None) -> str | None:
    if member is None or not member.complete:
        return None
    try:
        value = json.loads(text[member.value_start:member.value_end])
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _decoded_string_arguments(raw: str) -> str:
    """Some models write the arguments as a JSON string holding JSON: the call's arguments are that string."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, str) else raw

