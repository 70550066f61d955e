"""Sampling one token per sequence from its logits, with the request's own settings.

Log-probabilities are reported from the raw model distribution (before temperature and
penalties), as vLLM does by default. Each row draws one uniform number from its request's
generator (seeded requests have their own), so a seeded output does not depend on the
batch; the draw is an inverse-CDF lookup, batched over rows.
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
    need_logprobs = any(item.params.logprobs is not None for item in inputs)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if need_logprobs else None
    processed = logits.clone()
    for row, item in enumerate(inputs):
        _apply_penalties(processed[row], item)
    tokens = torch.argmax(processed, dim=-1)
    sampled_rows = [row for row, item in enumerate(inputs) if not item.params.greedy]
    if sampled_rows:
        rows = torch.tensor(sampled_rows, dtype=torch.long)
        probs = _probabilities(processed[rows], [inputs[r] for r in sampled_rows])
        uniforms = torch.cat([torch.rand(1, generator=inputs[r].generator) for r in sampled_rows])
        tokens[rows] = _inverse_cdf(probs, uniforms)
    results = []
    for row, item in enumerate(inputs):
        token = int(tokens[row])
        entry = _logprob_entry(raw_logprobs[row], token, item.params.logprobs) if raw_logprobs is not None else None
        results.append((token, entry))
    return results


def _apply_penalties(row: torch.Tensor, item: SampleInput) -> None:
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


def _probabilities(logits: torch.Tensor, inputs: list[SampleInput]) -> torch.Tensor:
    temperatures = torch.tensor([max(item.params.temperature or 1.0, 1e-5) for item in inputs])
    logits = logits / temperatures.unsqueeze(1)
    for row, item in enumerate(inputs):
        top_k = item.params.top_k
        if top_k and 0 < top_k < logits.shape[1]:
            kth = torch.topk(logits[row], top_k).values[-1]
            logits[row] = logits[row].masked_fill(logits[row] < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    for row, item in enumerate(inputs):
        top_p, min_p = item.params.top_p, item.params.min_p
        if top_p is not None and top_p < 1.0:
            probs[row] = _top_p(probs[row], top_p)
        if min_p:
            probs[row] = probs[row].masked_fill(probs[row] < min_p * probs[row].max(), 0.0)
    return probs


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (transformers' rule)."""
    sorted_probs, order = torch.sort(probs, descending=False)
    remove = torch.cumsum(sorted_probs, dim=-1) <= 1 - top_p
    remove[-1] = False  # always keep the most likely token
    return probs.scatter(0, order, sorted_probs.masked_fill(remove, 0.0))


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token i is drawn with probability probs[i] / sum: the first index whose cumulative mass
    exceeds u · total. Zero-probability tokens are never drawn."""
    cumulative = torch.cumsum(probs, dim=-1)
    targets = (uniforms * cumulative[:, -1]).unsqueeze(1)
    tokens = torch.searchsorted(cumulative, targets, right=True).squeeze(1)
    return tokens.clamp_(max=probs.shape[1] - 1)


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
