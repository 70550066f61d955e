"""Argument values written as text (Qwen3-Coder's <parameter=…>, GLM-4.5's <arg_value>), typed by the
request's tool schema as vLLM's parsers type them: strings stay text; integers, numbers and booleans are
converted; objects and arrays are read as JSON (or a Python literal). A growing call's arguments are the
JSON object of its finished parameters, without the closing brace until the call ends."""

from __future__ import annotations

import ast
import json

from llmctl.server.protocol import JSON


def function_properties(tools: list[dict[str, JSON]], name: str | None) -> dict[str, JSON]:
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            return dict((function.get("parameters") or {}).get("properties") or {})
    return {}


def schema_type(prop: JSON) -> str | None:
    """A property's type; for anyOf/oneOf or a list of types, the first that is not null (Pydantic's Optional)."""
    if not isinstance(prop, dict):
        return None
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None:
        for option in prop.get("anyOf") or prop.get("oneOf") or []:
            found = schema_type(option)
            if found not in (None, "null"):
                return found
    return kind if isinstance(kind, str) else None


def typed_value(text: str, prop: JSON, unknown_as_text: bool) -> JSON:
    """The value of a parameter whose schema is `prop` (None: not in the schema)."""
    kind = schema_type(prop) if prop is not None else None
    if kind is None:
        return text if unknown_as_text or prop is not None else _structured(text)
    if kind == "string":
        return text
    if kind in ("integer", "int"):
        return _number(text, integral=True)
    if kind in ("number", "float", "double"):
        return _number(text, integral=False)
    if kind in ("boolean", "bool"):
        return {"true": True, "false": False}.get(text.strip().lower(), text)
    return _structured(text)


def arguments_text(pairs: list[tuple[str, JSON]], complete: bool) -> str:
    """The arguments' JSON: finished pairs only, closed once the call has ended."""
    body = ", ".join(f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
                     for key, value in pairs)
    return "{" + body + ("}" if complete else "")


def _number(text: str, integral: bool) -> JSON:
    try:
        value = float(text.strip())
    except ValueError:
        return text
    if integral or value.is_integer():  # vLLM's: a whole number is an int
        return int(value) if value.is_integer() else value
    return value


def _structured(text: str) -> JSON:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, (dict, list)) else text  # a Python dict or list as JSON; nothing else
