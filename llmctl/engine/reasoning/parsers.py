"""The reasoning parsers vLLM ships for the families llmctl serves, on text as it grows: while it
grows (`final=False`) a split only ever extends the previous one — a piece that may be the start of a
marker is held back — so a stream sends each piece once.

- `deepseek_r1`: everything up to </think> is reasoning, with or without a leading <think> (DeepSeek-R1's
  template opens <think> in the prompt); an answer that never closes it is all reasoning.
- `qwen3`: Qwen3 writes <think>…</think> itself; text that does not start with <think> is all answer
  (enable_thinking: false puts an empty block in the prompt instead). An unclosed block is reasoning
  (the answer was cut off while thinking), as it is streamed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from llmctl.errors import LlmctlError


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: the text holds no reasoning
    content: str


def held_back(text: str, marker: str) -> int:
    """Characters at the end of text that could be the start of marker (held until the next token says)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ReasoningParser:
    start_token = "<think>"
    end_token = "</think>"

    def split(self, text: str, final: bool) -> ReasoningSplit:
        raise NotImplementedError

    def _after_start(self, body: str, final: bool) -> ReasoningSplit:
        """body: the text after an opening <think> (or from the start where the prompt opened it)."""
        reasoning, marker, content = body.partition(self.end_token)
        if marker:
            return ReasoningSplit(reasoning, content)
        return ReasoningSplit(body if final else body[:len(body) - held_back(body, self.end_token)], "")


P = TypeVar("P", bound=type[ReasoningParser])


class ReasoningParserManager:
    parsers: dict[str, type[ReasoningParser]] = {}

    @classmethod
    def register_module(cls, name: str) -> Callable[[P], P]:
        def register(parser: P) -> P:
            cls.parsers[name] = parser
            return parser

        return register

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        if name not in cls.parsers:
            raise LlmctlError(f"--reasoning-parser {name!r} is not known; choose one of {', '.join(sorted(cls.parsers))}")
        return cls.parsers[name]


@ReasoningParserManager.register_module("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    def split(self, text: str, final: bool) -> ReasoningSplit:
        _, opened, rest = text.partition(self.start_token)
        if not opened and not final and self.start_token.startswith(text.lstrip()):
            return ReasoningSplit("", "")  # may still become <think>
        return self._after_start(rest if opened else text, final)


@ReasoningParserManager.register_module("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    def split(self, text: str, final: bool) -> ReasoningSplit:
        stripped = text.lstrip()
        if stripped.startswith(self.start_token):
            return self._after_start(stripped[len(self.start_token):], final)
        if not final and self.start_token.startswith(stripped):
            return ReasoningSplit(None, "")  # may still become <think>
        return ReasoningSplit(None, text)
