"""Token bitmasks, as xgrammar and llguidance write them: int32 words, bit j of word i allows token 32·i + j."""

from __future__ import annotations

import torch

BITS = torch.arange(32, dtype=torch.int32)


def words_for(vocab_size: int) -> int:
    return -(-vocab_size // 32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, words] int32 → [N, vocab_size] bool."""
    bits = (bitmask.unsqueeze(-1) >> BITS.to(bitmask.device)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Disallowed tokens of `rows` to -inf, in place; bitmask [len(rows), words] on any device."""
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    allowed = allowed_tokens(bitmask.to(logits.device), logits.shape[1])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
