"""What a tool-call parser reads out of generated text, and the registry of parsers by name
(`--tool-call-parser NAME`; `--tool-parser-plugin FILE.py` registers more, as vLLM's plugins do).

A parser turns the text generated so far into content and tool-call drafts. While the text grows
(`final=False`) it must only ever extend what it returned before: content that may still turn out to
be the start of a tool-call marker is held back, and a call's arguments are the raw JSON text seen so
far. That is what lets a stream send each piece once."""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from llmctl.engine.reasoning.parsers import held_back
from llmctl.errors import LlmctlError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer


@dataclass(frozen=True)
class ToolCallDraft:
    name: str | None  # None until the name is whole
    arguments: str  # the raw JSON text of the arguments so far
    complete: bool  # the call's text has ended
    call_id: str | None = None  # the model's own id for the call (Kimi K2's functions.NAME:N), else one is made

    def valid(self) -> bool:
        if not self.complete or not self.name:
            return False
        try:
            return isinstance(json.loads(self.arguments), dict)
        except ValueError:
            return False


@dataclass(frozen=True)
class ParsedText:
    content: str
    calls: list[ToolCallDraft] = field(default_factory=list)


class ToolParser:
    """Subclasses implement parse(); a plugin that implements only extract_tool_calls (the whole text at
    the end) streams its content and calls once the generation has ended."""

    keep_special_tokens = False  # the markers are special tokens the detokenizer would otherwise drop

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools: list[dict[str, Any]] = []  # the request's tools (chat's shape): parsers that type values read them

    def parse(self, text: str, final: bool) -> ParsedText:
        return self.extract_tool_calls(text) if final else ParsedText("")

    def extract_tool_calls(self, text: str) -> ParsedText:
        raise NotImplementedError(f"{type(self).__name__} implements neither parse nor extract_tool_calls")

    def extract(self, text: str) -> ParsedText:
        """The finished text: its calls when every one is whole, else all of it as content (as vLLM answers)."""
        parsed = self.parse(text, final=True)
        if parsed.calls and not all(call.valid() for call in parsed.calls):
            return ParsedText(text)
        return parsed

    def new_call_id(self) -> str:
        return f"chatcmpl-tool-{uuid.uuid4().hex}"


def content_before(text: str, marker: str, final: bool) -> tuple[str, str | None]:
    """The content before marker and the text after it (None while the marker has not appeared)."""
    at = text.find(marker)
    if at >= 0:
        return text[:at], text[at + len(marker):]
    return (text if final else text[:len(text) - held_back(text, marker)]), None


P = TypeVar("P", bound=type[ToolParser])


class ToolParserManager:
    """Tool-call parsers by name, as vLLM's ToolParserManager keeps them."""

    parsers: dict[str, type[ToolParser]] = {}

    @classmethod
    def register_module(cls, names: str | list[str]) -> Callable[[P], P]:
        def register(parser: P) -> P:
            for name in [names] if isinstance(names, str) else names:
                cls.parsers[name] = parser
            return parser

        return register

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name not in cls.parsers:
            raise LlmctlError(f"--tool-call-parser {name!r} is not known; choose one of "
                              f"{', '.join(sorted(cls.parsers))}, or register one with --tool-parser-plugin FILE.py")
        return cls.parsers[name]

    @classmethod
    def import_tool_parser(cls, path: str) -> None:
        """Run a plugin file, whose @ToolParserManager.register_module("name") classes become parsers."""
        file = Path(path)
        if not file.is_file():
            raise LlmctlError(f"--tool-parser-plugin {path}: no such file")
        spec = importlib.util.spec_from_file_location(f"llmctl_tool_parser_plugin_{file.stem}", file)
        if spec is None or spec.loader is None:
            raise LlmctlError(f"--tool-parser-plugin {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the plugin's own error, said in one line
            raise LlmctlError(f"--tool-parser-plugin {path} failed to load: {type(exc).__name__}: {exc}") from None
