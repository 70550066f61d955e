"""What a request constrains its output to, in vLLM's `StructuredOutputsParams` terms: exactly one of a
JSON schema, any JSON object, a regular expression, a choice of strings, an EBNF grammar or a structural
tag."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmctl.engine.errors import InvalidRequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (object or its text)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF (GBNF, as llama.cpp and xgrammar write it)
    json_object: bool = False  # any JSON object
    structural_tag: str | None = None  # xgrammar's structural tag, as JSON text
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(f"structured outputs take exactly one of {', '.join(KINDS)}; got "
                                      f"{', '.join(given) or 'none'}", "structured_outputs")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise InvalidRequestError("choice must be a non-empty list of strings", "structured_outputs")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    def key(self) -> tuple[str, str, bool]:
        """What identifies the compiled grammar (the compiler caches by it)."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, tuple):
            value = json.dumps(list(value))
        return self.kind, str(value), self.disable_any_whitespace
