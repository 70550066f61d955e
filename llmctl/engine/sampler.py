"""Sampling one token per sequence from its logits, with the request's own settings.

Log-probabilities are reported from the raw model distribution (before temperature and
penalties), as vLLM does by default. Seeded requests draw from their own generator, so
their output does not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.sequence import Sequence, TokenLogprob


@dataclass
class SampleInput:
    seq: Sequence
    params: SamplingParams
    generator: torch.Generator
    blocked_token_ids: list[int]  # EOS and stop ids while min_tokens is not reached


def sample(logits: torch.Tensor, inputs: list[SampleInput]) -> list[tuple[int, TokenLogprob | None]]:
    """logits [N, V] float32, one row per input; returns (token, logprob entry) per row."""
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    results = []
    for row, item in enumerate(inputs):
        processed = _apply_penalties(logits[row].clone(), item)
        token = int(torch.argmax(processed)) if item.params.greedy else _draw(processed, item)
        results.append((token, _logprob_entry(raw_logprobs[row], token, item.params.logprobs)))
    return results


def _apply_penalties(row: torch.Tensor, item: SampleInput) -> torch.Tensor:
    params, seq = item.params, item.seq
    if item.blocked_token_ids:
        row[item.blocked_token_ids] = float("-inf")
    if params.repetition_penalty and params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.all_token_ids)), dtype=torch.long)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and seq.output_token_ids:
        ids, counts = torch.unique(torch.tensor(seq.output_token_ids, dtype=torch.long), return_counts=True)
        row[ids] -= params.frequency_penalty * counts.to(row.dtype) + params.presence_penalty
    return row


def _draw(row: torch.Tensor, item: SampleInput) -> int:
    params = item.params
    row = row / max(params.temperature or 1.0, 1e-5)
    if params.top_k and params.top_k > 0 and params.top_k < row.numel():
        kth = torch.topk(row, params.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=False)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        remove = cumulative <= 1 - params.top_p
        remove[-1] = False  # always keep the most likely token
        probs = probs.scatter(0, order, sorted_probs.masked_fill(remove, 0.0))
    if params.min_p:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, using the request's generator.
    noise = torch.empty_like(probs).exponential_(generator=item.generator)
    return int(torch.argmax(probs / noise))


def _logprob_entry(raw: torch.Tensor, token: int, top_n: int | None) -> TokenLogprob | None:
    if top_n is None:
        return None
    chosen = float(raw[token])
    rank = int((raw > raw[token]).sum()) + 1
    top: dict[int, float] = {}
    if top_n > 0:
        values, ids = torch.topk(raw, top_n)
        top = {int(i): float(v) for i, v in zip(ids, values)}
    return TokenLogprob(token_id=token, logprob=chosen, rank=rank, top=top)


def prompt_logprob_entries(logits: torch.Tensor, next_tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """Log-probabilities of each prompt token given the tokens before it."""
    raw = torch.log_softmax(logits, dim=-1)
    return [_logprob_entry(raw[row], token, top_n) for row, token in enumerate(next_tokens)]  # type: ignore[misc]
