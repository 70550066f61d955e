"""The request fields that ask for structured outputs, read into one StructuredOutputsParams:
OpenAI's `response_format` (text, json_object, json_schema; vLLM's structural_tag), vLLM's
`structured_outputs` object, and its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` fields. At most one of them may constrain a request."""

from __future__ import annotations

import json
from typing import Any

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.structured.params import KINDS, StructuredOutputsParams
from llmctl.server.protocol import Fields, bad

LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# vLLM fields that llmctl refuses by name rather than ignore
NOT_IMPLEMENTED = {"whitespace_pattern": "a custom whitespace pattern", "disable_fallback": "backend fallback",
                   "disable_additional_properties": "disable_additional_properties",
                   "guided_whitespace_pattern": "a custom whitespace pattern"}


def structured_outputs(fields: Fields, backend: str = "auto") -> StructuredOutputsParams | None:
    """The request's constraint, or None; a malformed or doubled one is a 400 that names the field.
    backend: the server's (a request may name it, not choose another: vLLM no longer lets it)."""
    found = [(name, spec) for name, spec in (("response_format", _response_format(fields)),
                                             ("structured_outputs", _structured_outputs_field(fields, backend)),
                                             *_legacy(fields, backend)) if spec is not None]
    if len(found) > 1:
        raise bad(f"only one structured-output constraint per request; got {', '.join(n for n, _ in found)}",
                  found[1][0])
    if not found:
        return None
    name, spec = found[0]
    try:
        return StructuredOutputsParams(**spec)
    except InvalidRequestError as exc:
        raise bad(str(exc), name) from None


def _response_format(fields: Fields) -> dict[str, Any] | None:
    value = fields.raw("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad("response_format must be an object with a type: text, json_object, json_schema or structural_tag",
                  "response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        described = value.get("json_schema")
        schema = described.get("schema", {}) if isinstance(described, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise bad("response_format.json_schema must be an object with the JSON schema under `schema`",
                      "response_format")
        return {"json": schema if isinstance(schema, dict) else {}}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps(value)}
    raise bad(f"response_format.type must be text, json_object, json_schema or structural_tag, got {kind!r}",
              "response_format")


def _structured_outputs_field(fields: Fields, backend: str) -> dict[str, Any] | None:
    value = fields.raw("structured_outputs")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("structured_outputs must be an object with one of json, regex, choice, grammar, json_object, "
                  "structural_tag", "structured_outputs")
    refused = sorted(set(value) & set(NOT_IMPLEMENTED))
    if refused:
        raise bad(f"structured_outputs.{refused[0]} is not supported: llmctl does not implement "
                  f"{NOT_IMPLEMENTED[refused[0]]}", "structured_outputs")
    unknown = sorted(set(value) - set(KINDS) - {"disable_any_whitespace", "backend"})
    if unknown:
        raise bad(f"structured_outputs has no field {unknown[0]!r}; it takes {', '.join(KINDS)} and "
                  "disable_any_whitespace", "structured_outputs")
    _check_backend(value.get("backend"), backend, "structured_outputs")
    spec = {key: value[key] for key in (*KINDS, "disable_any_whitespace") if value.get(key) is not None}
    return _typed(spec, "structured_outputs")


def _legacy(fields: Fields, backend: str) -> list[tuple[str, dict[str, Any] | None]]:
    refused = [name for name in ("guided_whitespace_pattern",) if fields.raw(name) is not None]
    if refused:
        raise bad(f"{refused[0]} is not supported: llmctl does not implement {NOT_IMPLEMENTED[refused[0]]}",
                  refused[0])
    _check_backend(fields.raw("guided_decoding_backend"), backend, "guided_decoding_backend")
    return [(name, _typed({kind: fields.raw(name)}, name)) for name, kind in LEGACY.items()
            if fields.raw(name) is not None]


def _check_backend(asked: Any, backend: str, param: str) -> None:
    if asked is not None and asked != backend:
        raise bad(f"{param}: this server's structured-output backend is {backend!r} (choose it with "
                  f"--structured-outputs-config when starting the server); got {asked!r}", param)


def _typed(spec: dict[str, Any], param: str) -> dict[str, Any]:
    """Each kind's JSON type: json an object (or its text), choice a list of strings, the others strings."""
    for kind, value in spec.items():
        if kind == "json" and not isinstance(value, (dict, str)):
            raise bad(f"{param}: json must be a JSON schema object (or its text)", param)
        if kind == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
                raise bad(f"{param}: choice must be a non-empty list of strings", param)
            spec[kind] = tuple(value)
        if kind in ("regex", "grammar", "structural_tag") and not isinstance(value, str):
            raise bad(f"{param}: {kind} must be a string", param)
        if kind in ("json_object", "disable_any_whitespace") and not isinstance(value, bool):
            raise bad(f"{param}: {kind} must be true or false", param)
    return spec
