"""A proposal: the tokens a proposer suggests for one sequence's next step."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # [k, V] the draft model's distributions; None: n-gram (q = 1 on each token)

    def truncated(self, k: int) -> Draft:
        return Draft(self.token_ids[:k], self.probs[:k] if self.probs is not None else None)
