"""Scoring's pure parts, shared by LLM.score and the /score and /rerank endpoints: which texts pair up, and an
embedding model's score (the cosine similarity of the two embeddings, as vLLM scores with embedding models)."""

from __future__ import annotations

import torch

Pair = tuple[str, str]


def pair_texts(firsts: list[str], seconds: list[str], names: tuple[str, str] = ("text_1", "text_2")) -> list[Pair]:
    """One first text against every second, or pair by pair (ValueError naming the field when neither)."""
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise ValueError(f"{names[0]} has {len(firsts)} texts and {names[1]} {len(seconds)}: give one {names[0]}, "
                         f"or as many as {names[1]}")
    return list(zip(firsts, seconds))


def cosine_scores(vectors: list[torch.Tensor]) -> list[float]:
    """Vectors in pairs (first, second, first, second, …) → each pair's cosine similarity."""
    unit = torch.nn.functional.normalize(torch.stack(vectors).float(), dim=-1)
    return (unit[0::2] * unit[1::2]).sum(-1).tolist()
