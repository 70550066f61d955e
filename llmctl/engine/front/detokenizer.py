"""Incremental detokenization: text grows token by token without broken characters.

Decoding a token alone loses leading spaces and splits multi-byte characters, so each
step decodes a short window of recent tokens twice (with and without the new ones) and
emits the difference; a trailing U+FFFD means a character is still incomplete and the
text waits for the next token (the method of vLLM and text-generation-inference). The
window starts on the last prompt tokens so the first output token gets its space right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 6


@dataclass
class IncrementalDetokenizer:
    tokenizer: Any
    prompt_token_ids: list[int]
    skip_special_tokens: bool = True
    text: str = ""
    _ids: list[int] = field(default_factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0
    _seen: int = 0

    def __post_init__(self) -> None:
        self._special = set(getattr(self.tokenizer, "all_special_ids", []) or []) if self.skip_special_tokens else set()
        self._ids = [t for t in self.prompt_token_ids[-CONTEXT_TOKENS:] if t not in self._special]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, output_token_ids: list[int]) -> str:
        """All output ids so far; returns the text this call adds (may be empty)."""
        self._take(output_token_ids)
        return self._emit(final=False)

    def flush(self, output_token_ids: list[int]) -> str:
        """At the end: whatever is still held back."""
        self._take(output_token_ids)
        return self._emit(final=True)

    def _take(self, output_token_ids: list[int]) -> None:
        for token in output_token_ids[self._seen:]:
            if token not in self._special:
                self._ids.append(token)
        self._seen = len(output_token_ids)

    def _emit(self, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=False)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=False)
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT) and not final):
            return ""
        delta = full[len(prefix):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += delta
        return delta
