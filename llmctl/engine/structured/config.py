"""The server-wide structured-output settings, vLLM's `--structured-outputs-config` JSON (and its older
`--guided-decoding-backend` flag): which backend compiles grammars, whether JSON may carry free
whitespace, and whether the grammar also constrains a reasoning model's thinking (enable_in_reasoning;
by default it starts when the reasoning ends, as vLLM's does)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmctl.errors import LlmctlError

BACKENDS = ("auto", "xgrammar", "guidance")  # auto: xgrammar, and llguidance for what xgrammar refuses (vLLM's)


@dataclass(frozen=True)
class StructuredOutputsConfig:
    backend: str = "auto"
    disable_any_whitespace: bool = False
    enable_in_reasoning: bool = False


def parse_structured_outputs_config(value: str | dict | StructuredOutputsConfig | None,
                                    guided_decoding_backend: str | None = None) -> StructuredOutputsConfig:
    """vLLM's JSON (or a dict) → StructuredOutputsConfig; an already parsed one is returned as it is."""
    if isinstance(value, StructuredOutputsConfig):
        return value
    try:
        fields = json.loads(value) if isinstance(value, str) else dict(value or {})
    except json.JSONDecodeError as exc:
        raise LlmctlError(f"--structured-outputs-config is not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise LlmctlError("--structured-outputs-config must be a JSON object, e.g. '{\"backend\": \"guidance\"}'")
    unknown = sorted(set(fields) - {"backend", "disable_any_whitespace", "enable_in_reasoning"})
    if unknown:
        raise LlmctlError(f"--structured-outputs-config: {unknown[0]} is not supported; llmctl takes backend "
                          f"({', '.join(BACKENDS)}), disable_any_whitespace and enable_in_reasoning")
    if guided_decoding_backend is not None:
        fields.setdefault("backend", guided_decoding_backend)
    config = StructuredOutputsConfig(**fields)
    if config.backend not in BACKENDS:
        raise LlmctlError(f"structured-output backend {config.backend!r} is not one of {', '.join(BACKENDS)}")
    return config
