"""Token counting for benchmarks: a local Hugging Face tokenizer, or the server's /tokenize.

Prompts must have exact token lengths in the *server's* tokenizer, so when the model's own
tokenizer cannot be loaded here we count with the server (`/tokenize`, `/detokenize`, as
vLLM and llmctl serve both offer) rather than silently with a different vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2

from llmctl.errors import LlmctlError

WORD = re.compile(r"^ [a-z]{2,}$")


class TokenCounter(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class LocalTokenizer:
    name: str
    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def words(self) -> list[str]:
        """Vocabulary entries that are a plain lowercase word with a leading space: joined they
        re-tokenize to themselves, which makes exact-length prompts easy to build."""
        words = []
        for token_id in range(self.tokenizer.vocab_size):
            text = self.tokenizer.decode([token_id])
            if WORD.match(text) and self.encode(text) == [token_id]:
                words.append(text)
        return words


@dataclass
class ServerTokenizer:
    """Counts with the server's own tokenizer over HTTP (vLLM's and llmctl's /tokenize)."""

    name: str
    base_url: str
    model: str
    headers: dict[str, str]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx2.post(f"{self.base_url}{path}", json={"model": self.model, **body}, headers=self.headers,
                              timeout=60)
        if response.status_code != 200:
            raise LlmctlError(f"{self.base_url}{path} answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def encode(self, text: str) -> list[int]:
        return self._post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

    def decode(self, ids: list[int]) -> str:
        return self._post("/detokenize", {"tokens": ids})["prompt"]


def load_local_tokenizer(model: str | None) -> LocalTokenizer:
    """The tokenizer of `model` (hub id, folder, .gguf; None: llmctl's default model)."""
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID, resolve_model
    from llmctl.checkpoint.tokenizer import load_tokenizer

    source = resolve_model(None if model == DEFAULT_MODEL_ID else model, show_progress=False)
    tokenizer = load_tokenizer(source)
    if tokenizer is None:
        raise LlmctlError(f"{model} has no tokenizer files")
    return LocalTokenizer(model or source.name, tokenizer)
