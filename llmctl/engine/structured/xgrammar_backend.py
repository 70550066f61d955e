"""xgrammar (the default backend, as in vLLM): a schema, regex, choice or EBNF grammar compiled once per
distinct spec (xgrammar's compiler caches them) against the model's tokenizer, and one matcher per
sequence that says which tokens may come next and follows the tokens that did."""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.structured.params import StructuredOutputsParams

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[07:43:59] /project/cpp/regex_converter.cc:83: "


def choice_as_grammar(choice: tuple[str, ...]) -> str:
    """vLLM's conversion: root ::= "a" | "b", with quotes and backslashes escaped."""
    escaped = (re.sub(r'(["\\])', r"\\\1", option) for option in choice)
    return "root ::= " + " | ".join(f'"{option}"' for option in escaped)


class XgrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, grammar: Any, vocab_size: int) -> None:
        import xgrammar

        self._grammar = grammar
        self._matcher = xgrammar.GrammarMatcher(grammar)
        self.vocab_size = vocab_size

    def fresh(self) -> XgrammarMatcher:
        """A matcher at the start of the same grammar (an n > 1 request's sibling)."""
        return XgrammarMatcher(self._grammar, self.vocab_size)

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def accept(self, token: int) -> bool:
        return self._matcher.accept_token(token)

    def rollback(self, count: int) -> None:
        if count:
            self._matcher.rollback(count)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of an int32 [N, words] bitmask: the tokens that may come next."""
        self._matcher.fill_next_token_bitmask(bitmask, row)


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        import xgrammar

        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=list(eos_token_ids) or None)
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)

    def compile(self, params: StructuredOutputsParams) -> XgrammarMatcher:
        """A matcher at the start of the request's grammar; a spec xgrammar refuses is an InvalidRequestError."""
        try:
            grammar = self._compile(params)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar reports bad specs as these
            message = _LOG_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            raise InvalidRequestError(f"the {params.kind} of structured outputs cannot be compiled: {message}",
                                      "structured_outputs") from None
        return XgrammarMatcher(grammar, self.vocab_size)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        any_whitespace = not params.disable_any_whitespace
        kind = params.kind
        if kind == "json":
            schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
            return self._compiler.compile_json_schema(schema, any_whitespace=any_whitespace)
        if kind == "json_object":
            return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
        if kind == "regex":
            return self._compiler.compile_regex(params.regex)
        if kind == "choice":
            return self._compiler.compile_grammar(choice_as_grammar(params.choice))
        if kind == "grammar":
            return self._compiler.compile_grammar(params.grammar)
        return self._compile_structural_tag(params.structural_tag)

    def _compile_structural_tag(self, text: str) -> Any:
        import xgrammar

        tag = json.loads(text)
        if isinstance(tag, dict) and "structures" in tag:  # vLLM's older form: begin/schema/end + triggers
            items = [xgrammar.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            return self._compiler.compile_structural_tag(items, tag["triggers"])
        return self._compiler.compile_structural_tag(text)
