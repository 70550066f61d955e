"""Structured outputs for one engine: the backends, built on the first request that needs them (each
reads the whole vocabulary once), and the token bitmask of a sequence that has a grammar.

The server compiles a request's grammar before queueing it (`matcher`: a bad schema is a 400 then);
the engine compiles it again for the request itself, which the backends' caches make cheap. With the
`auto` backend (vLLM's default) xgrammar compiles, and llguidance takes what xgrammar refuses."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.structured.bitmask import words_for
from llmctl.engine.structured.config import StructuredOutputsConfig
from llmctl.engine.structured.llguidance_backend import LLGuidanceBackend
from llmctl.engine.structured.matcher import GrammarMatcher
from llmctl.engine.structured.params import StructuredOutputsParams
from llmctl.engine.structured.reasoning_gate import ReasoningGate, prompt_ends_reasoning
from llmctl.engine.structured.xgrammar_backend import XgrammarBackend

BACKEND_CLASSES = {"xgrammar": XgrammarBackend, "guidance": LLGuidanceBackend}


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig | None = None, reasoning_end_ids: tuple[int, ...] | None = None,
                 reasoning_start_ids: tuple[int, ...] = ()) -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, eos_token_ids
        self.config = config or StructuredOutputsConfig()
        # with a reasoning parser: the grammar starts after these tokens (unless enable_in_reasoning)
        self.reasoning_end_ids = None if self.config.enable_in_reasoning else reasoning_end_ids
        self.reasoning_start_ids = reasoning_start_ids
        self._backends: dict[str, XgrammarBackend | LLGuidanceBackend] = {}
        self._lock = threading.Lock()  # the server's handlers and the engine thread both compile

    def backend(self, name: str) -> XgrammarBackend | LLGuidanceBackend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = BACKEND_CLASSES[name](self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._backends[name]

    def matcher(self, params: StructuredOutputsParams, prompt_token_ids: list[int] | None = None) -> GrammarMatcher:
        """A matcher at the start of the request's grammar (behind the reasoning when there is a reasoning
        parser, unless the prompt has ended it: enable_thinking false); InvalidRequestError when it cannot be
        compiled."""
        grammar = self._grammar(params)
        if not self.reasoning_end_ids or prompt_ends_reasoning(prompt_token_ids or [], self.reasoning_start_ids,
                                                               self.reasoning_end_ids):
            return grammar
        return ReasoningGate(grammar, self.reasoning_end_ids)

    def _grammar(self, params: StructuredOutputsParams) -> GrammarMatcher:
        if self.config.disable_any_whitespace and not params.disable_any_whitespace:
            params = dataclasses.replace(params, disable_any_whitespace=True)
        if self.config.backend != "auto":
            return self.backend(self.config.backend).compile(params)
        try:
            return self.backend("xgrammar").compile(params)
        except InvalidRequestError as refused:
            if params.kind == "structural_tag":
                raise
            try:
                return self.backend("guidance").compile(params)
            except InvalidRequestError:
                raise refused from None

    def full_row(self) -> torch.Tensor:
        """A bitmask row that allows every token."""
        return torch.full((words_for(self.vocab_size),), -1, dtype=torch.int32)

    def bitmask(self, matcher: GrammarMatcher) -> torch.Tensor | None:
        """The tokens the matcher allows next as int32 words; None once its grammar is complete (vLLM then
        leaves the row unmasked: the stop token is what the grammar allowed last)."""
        if matcher.is_terminated:
            return None
        mask = self.full_row().unsqueeze(0)
        matcher.fill_bitmask(mask, 0)
        return mask[0]
