"""What the engine needs of a grammar matcher, whichever backend compiled it."""

from __future__ import annotations

from typing import Protocol

import torch


class GrammarMatcher(Protocol):
    @property
    def is_terminated(self) -> bool: ...  # the grammar is complete (its stop token was accepted)

    def fresh(self) -> GrammarMatcher: ...  # a matcher at the start of the same grammar

    def accept(self, token: int) -> bool: ...  # follow a generated token; False if the grammar refuses it

    def rollback(self, count: int) -> None: ...  # undo the last `count` accepted tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...  # the allowed next tokens, as int32 words
