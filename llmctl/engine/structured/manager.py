"""Structured outputs for one engine: the backend, built on the first request that needs it (xgrammar
reads the whole vocabulary once), and each step's token bitmasks for the sequences that have a grammar.

The server compiles a request's grammar before queueing it (`matcher`: a bad schema is a 400 then);
the engine compiles it again for the request itself, which xgrammar's cache makes a lookup."""

from __future__ import annotations

import threading
from typing import Any

import torch

from llmctl.engine.structured.params import StructuredOutputsParams
from llmctl.engine.structured.xgrammar_backend import XgrammarBackend, XgrammarMatcher

BACKENDS = ("xgrammar",)


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], backend: str = "xgrammar") -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, eos_token_ids
        self.backend_name = backend
        self._backend: XgrammarBackend | None = None
        self._lock = threading.Lock()  # the server's handlers and the engine thread both compile

    @property
    def backend(self) -> XgrammarBackend:
        with self._lock:
            if self._backend is None:
                self._backend = XgrammarBackend(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._backend

    def matcher(self, params: StructuredOutputsParams) -> XgrammarMatcher:
        """A matcher at the start of the request's grammar; InvalidRequestError when it cannot be compiled."""
        return self.backend.compile(params)

    def bitmask(self, matcher: XgrammarMatcher) -> torch.Tensor | None:
        """The tokens the matcher allows next as int32 words; None once its grammar is complete (vLLM then
        leaves the row unmasked: the stop token is what the grammar allowed last)."""
        if matcher.is_terminated:
            return None
        mask = torch.full((1, self.backend.words), -1, dtype=torch.int32)
        matcher.fill_bitmask(mask, 0)
        return mask[0]
