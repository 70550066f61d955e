"""A proposer's draw of one token per sequence from its own logits, with each request's settings (greedy, or
sampled with the request's generator), and the distributions the rejection sampler needs."""

from __future__ import annotations

import torch

from llmctl.engine.core.sequence import Sequence
from llmctl.engine.sample.sampler import greedy_tokens, inverse_cdf, probabilities


def draw(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """(the token drawn for each sequence, [N, V] the distributions drawn from)."""
    params = [seq.params for seq in seqs]
    q = probabilities(logits, params)
    greedy = greedy_tokens(logits)
    uniforms = torch.cat([torch.rand(1, generator=_generator(seq, generator)) for seq in seqs])
    drawn = inverse_cdf(q, uniforms.to(q.device))
    chosen = torch.where(torch.tensor([p.greedy for p in params], device=q.device), greedy, drawn).tolist()
    return chosen, q


def _generator(seq: Sequence, default: torch.Generator) -> torch.Generator:
    """The request's own (a seed), else the engine's."""
    return seq.generator if isinstance(seq.generator, torch.Generator) else default
