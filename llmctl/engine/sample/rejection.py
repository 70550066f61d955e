"""Verifying proposals against the target model, so that speculation never changes what is generated.

A sequence that proposed k tokens d1..dk gets k + 1 rows of target logits in one forward:
row j scores the token after d1..dj. Per row j < k:

- greedy: d(j+1) is accepted when it is the target's argmax, else the argmax replaces it;
- sampling (standard rejection sampling): d(j+1) is accepted with probability
  min(1, p(d) / q(d)); on rejection the token is drawn from normalize(max(0, p − q)).
  An n-gram proposal is a draft with q = 1 on the proposed token.

The first rejection ends the sequence's tokens for the step; when all k are accepted, row k
gives one more (bonus) token from p. With structured outputs p is the target's distribution
under the grammar's mask for that row (the draft having been cut at its first token the
grammar refuses), so the emitted tokens are what constrained sampling gives one at a time. The accepted and drawn tokens are, in distribution,
exactly what sampling from p one token at a time gives (Leviathan et al., 2023; Chen et al., 2023).
Every row of a sampling sequence draws its uniforms from the request's own generator, so a
seeded request is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmctl.engine.core.sequence import TokenLogprob
from llmctl.engine.sample.sampler import greedy_tokens, inverse_cdf, probabilities, token_logprobs
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.structured.bitmask import apply_token_bitmask
from llmctl.kernels.transfer import to_host


@dataclass
class VerifyInput:
    params: SamplingParams
    generator: torch.Generator
    draft: Draft
    first_row: int  # the sequence's k + 1 logits rows start here
    token_bitmask: torch.Tensor | None = None  # structured outputs: [k + 1, words] the grammar's mask per row


def accept_or_recover(target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor,
                      u_accept: torch.Tensor, u_sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One rejection-sampling decision per row: target p [R, V], draft q [R, V] (None: one-hot on
    the token), proposed tokens [R], two uniforms per row. Returns (accepted [R], the token
    drawn from normalize(max(0, p − q)) [R], used where the proposal is rejected)."""
    column = tokens.unsqueeze(1)
    p_token = target.gather(1, column).squeeze(1)
    if draft is None:
        accepted = u_accept < p_token
        residual = target.scatter(1, column, 0.0)
    else:
        accepted = u_accept * draft.gather(1, column).squeeze(1) < p_token
        residual = (target - draft).clamp_min_(0.0)
    # p == q leaves no residual mass (and then rejection cannot happen): fall back to p.
    empty = residual.sum(dim=1, keepdim=True) <= 0
    residual = torch.where(empty, target, residual)
    return accepted, inverse_cdf(residual, u_sample)


def verify(logits: torch.Tensor, inputs: list[VerifyInput]) -> list[list[tuple[int, TokenLogprob | None]]]:
    """The tokens each sequence emits this step (accepted proposals, then one drawn token),
    with their log-probabilities under the raw target distribution when the request asked."""
    emitted: list[list[int]] = [[] for _ in inputs]
    greedy = [i for i, item in enumerate(inputs) if item.params.greedy]
    sampled = [i for i, item in enumerate(inputs) if not item.params.greedy]
    decide = _masked_by_grammar(logits, inputs)  # the decisions follow the grammar; logprobs stay raw
    if greedy:
        _verify_greedy(decide, [inputs[i] for i in greedy], [emitted[i] for i in greedy])
    if sampled:
        _verify_sampled(decide, [inputs[i] for i in sampled], [emitted[i] for i in sampled])
    return _with_logprobs(logits, inputs, emitted)


def _masked_by_grammar(logits: torch.Tensor, inputs: list[VerifyInput]) -> torch.Tensor:
    constrained = [item for item in inputs if item.token_bitmask is not None]
    if not constrained:
        return logits
    rows = [row for item in constrained for row in _rows(item)]
    masked = logits.clone()
    apply_token_bitmask(masked, rows, torch.cat([item.token_bitmask for item in constrained]))
    return masked


def _rows(item: VerifyInput) -> range:
    return range(item.first_row, item.first_row + len(item.draft.token_ids) + 1)


def _verify_greedy(logits: torch.Tensor, items: list[VerifyInput], out: list[list[int]]) -> None:
    rows = [row for item in items for row in _rows(item)]
    best = greedy_tokens(logits[torch.tensor(rows, device=logits.device)]).tolist()
    at = 0
    for item, tokens in zip(items, out):
        k = len(item.draft.token_ids)
        target = best[at:at + k + 1]
        at += k + 1
        accepted = 0
        while accepted < k and item.draft.token_ids[accepted] == target[accepted]:
            accepted += 1
        tokens += target[:accepted + 1]  # the accepted proposals equal the target's tokens


def _verify_sampled(logits: torch.Tensor, items: list[VerifyInput], out: list[list[int]]) -> None:
    device, vocab = logits.device, logits.shape[1]
    rows = torch.tensor([row for item in items for row in _rows(item)], device=device)
    params = [item.params for item in items for _ in _rows(item)]
    p = probabilities(logits[rows], params)
    draft_rows, bonus_rows, proposed, q_parts = [], [], [], []
    u_accept, u_sample = [], []
    at = 0
    for item in items:
        k = len(item.draft.token_ids)
        draws = torch.rand(2 * (k + 1), generator=item.generator)
        u_accept.append(draws[:k])
        u_sample.append(draws[k + 1:])
        draft_rows += range(at, at + k)
        bonus_rows.append(at + k)
        at += k + 1
        proposed += item.draft.token_ids
        q_parts.append(item.draft.probs.to(device, torch.float32) if item.draft.probs is not None else
                       torch.nn.functional.one_hot(torch.tensor(item.draft.token_ids), vocab).to(device, torch.float32))
    sample_uniforms = torch.cat(u_sample).to(device)
    row_index = torch.tensor(draft_rows, dtype=torch.long, device=device)
    bonus_index = torch.tensor(bonus_rows, dtype=torch.long, device=device)
    accepted, recovered = accept_or_recover(
        p[row_index], torch.cat(q_parts), torch.tensor(proposed, dtype=torch.long, device=device),
        torch.cat(u_accept).to(device), sample_uniforms[row_index])
    bonus = inverse_cdf(p[bonus_index], sample_uniforms[bonus_index])
    accepted_host, recovered_host, bonus_host = to_host([accepted, recovered, bonus])  # one wait for the device
    at = 0
    for index, (item, tokens) in enumerate(zip(items, out)):
        k = len(item.draft.token_ids)
        taken = 0
        while taken < k and accepted_host[at + taken]:
            taken += 1
        tokens += item.draft.token_ids[:taken]
        tokens.append(int(recovered_host[at + taken] if taken < k else bonus_host[index]))
        at += k


def _with_logprobs(logits: torch.Tensor, inputs: list[VerifyInput],
                   emitted: list[list[int]]) -> list[list[tuple[int, TokenLogprob | None]]]:
    rows = [item.first_row + j for item, tokens in zip(inputs, emitted) for j in range(len(tokens))
            if item.params.logprobs is not None]
    entries: list[TokenLogprob | None] = []
    if rows:
        tokens = [t for item, ts in zip(inputs, emitted) if item.params.logprobs is not None for t in ts]
        top_n = [item.params.logprobs for item, ts in zip(inputs, emitted) if item.params.logprobs is not None
                 for _ in ts]
        entries = token_logprobs(logits[torch.tensor(rows, device=logits.device)],
                                 torch.tensor(tokens, device=logits.device), top_n)
    result, at = [], 0
    for item, tokens in zip(inputs, emitted):
        if item.params.logprobs is None:
            result.append([(t, None) for t in tokens])
        else:
            result.append(list(zip(tokens, entries[at:at + len(tokens)])))
            at += len(tokens)
    return result
