"""The gated delta rule in torch (the reference path on every device; flash-linear-attention's algorithms, as
transformers' torch path writes them): for a prompt chunk, the chunked form (a UT transform per 64-token chunk,
then a scan over chunks) from a carried state — on GPUs a Triton kernel's token loop instead
(kernels/recurrent_prefill.py); for decodes, one recurrent step per sequence. q and k are
L2-normalized and q scaled by 1/√d_k inside, as the kernels do. All in float32.

State S [heads_v, d_k, d_v]: per token, S ← exp(g)·S; S ← S + k ⊗ β(v − Sᵀk); output Sᵀq."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.engine.layers.recurrent_state import triton_kernels_for
from llmctl.engine.layers.ssd import fitted_chunk

CHUNK = 64


def prepare_heads(q: torch.Tensor, k: torch.Tensor, v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., Hk, dk] -> [..., Hv, dk] float32, L2-normalized, q scaled by 1/√dk; heads shared in groups."""
    repeat = v_heads // q.shape[-2]
    q, k = (x.float().repeat_interleave(repeat, dim=-2) for x in (q, k))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q * q.shape[-1] ** -0.5, k


def chunk_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's chunk of L tokens: q, k [L, Hk, dk], v [L, Hv, dv], g and beta [L, Hv], from `initial`
    [Hv, dk, dv]. Returns the outputs [L, Hv, dv] and the state after the last token."""
    outs, final = chunk_delta_rule_batch([q], [k], [v], [g], [beta], initial[None])
    return outs[0], final[0]


def chunk_delta_rule_batch(qs: list[torch.Tensor], ks: list[torch.Tensor], vs: list[torch.Tensor],
                           gs: list[torch.Tensor], betas: list[torch.Tensor], initial: torch.Tensor
                           ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Several sequences' chunks at once, each padded to the longest with g = 0 and β = 0 (no decay, no update:
    the state passes the padding unchanged), from the states `initial` [S, Hv, dk, dv]; sequence and head are one
    batch dimension throughout. Returns each one's outputs [L_i, Hv, dv] and the states after each last token."""
    lengths = [v.shape[0] for v in vs]
    count, v_heads = len(vs), vs[0].shape[1]
    if triton_kernels_for(vs[0]):
        return _prompts_through_triton(qs, ks, vs, gs, betas, initial)
    chunk = fitted_chunk(max(lengths), CHUNK)
    padded = -(-max(lengths) // chunk) * chunk

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:  # each [L, H, ·] -> [S·H, padded, ·], zeros after L
        return torch.cat([F.pad(t.float().transpose(0, 1), (0, 0, 0, padded - t.shape[0])) for t in parts])

    prepared = [prepare_heads(q, k, v_heads) for q, k in zip(qs, ks)]
    q, k, v = stacked([p[0] for p in prepared]), stacked([p[1] for p in prepared]), stacked(vs)
    g, beta = (stacked([t[..., None] for t in ts])[..., 0] for ts in (gs, betas))  # [S·H, padded]
    heads = q.shape[0]
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(heads, -1, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    decay = g.reshape(heads, -1, chunk).cumsum(-1)  # [S·H, C, T]
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * pairwise  # the UT transform's unit lower-triangular system
    intra = (q @ k.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False,
                                               unitriangular=True)
    state = initial.float().flatten(0, 1)  # [S·H, dk, dv]
    out = torch.zeros_like(new_values)
    q = q * decay.exp()[..., None]
    k = k * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]
    for c in range(q.shape[1]):
        v_new = new_values[:, c] - k_cumdecay[:, c] @ state
        out[:, c] = q[:, c] @ state + intra[:, c] @ v_new
        state = state * chunk_decay[:, c] + k[:, c].transpose(-1, -2) @ v_new
    out = out.reshape(count, v_heads, -1, out.shape[-1])
    return [out[i, :, :length].transpose(0, 1) for i, length in enumerate(lengths)], state.view_as(initial)


def _prompts_through_triton(qs: list[torch.Tensor], ks: list[torch.Tensor], vs: list[torch.Tensor],
                            gs: list[torch.Tensor], betas: list[torch.Tensor], initial: torch.Tensor
                            ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """chunk_delta_rule_batch on GPUs: the token loop in registers (kernels/recurrent_prefill.py), each sequence
    padded to the longest with g = 0 and β = 0."""
    from llmctl.kernels.recurrent_prefill import delta_rule_prompts

    lengths, v_heads = [v.shape[0] for v in vs], vs[0].shape[1]
    longest = max(lengths)

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:  # each [L, ...] -> [S, longest, ...], zeros after L
        return torch.stack([F.pad(t.float(), (0, 0) * (t.dim() - 1) + (0, longest - t.shape[0])) for t in parts])

    prepared = [prepare_heads(q, k, v_heads) for q, k in zip(qs, ks)]
    states = initial.float().clone()
    y = delta_rule_prompts(stacked([p[0] for p in prepared]), stacked([p[1] for p in prepared]), stacked(vs),
                           stacked(gs), stacked(betas), states)
    return [y[i, :length] for i, length in enumerate(lengths)], states


def step_delta_rule(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: states [S, Hv, dk, dv], q and k [S, Hk, dk], v [S, Hv, dv], g and beta [S, Hv].
    Returns the outputs [S, Hv, dv] and the new states — float32 states updated in place (pass a view of the
    cache, or a copy)."""
    q, k = prepare_heads(q, k, v.shape[1])
    decay = g.float().exp()[..., None, None]
    state = state.mul_(decay) if state.dtype == torch.float32 else state.float() * decay
    remembered = (k[..., None, :] @ state)[..., 0, :]  # Sᵀk: [S, Hv, dv]
    delta = (v.float() - remembered) * beta.float()[..., None]
    flat = state.view(-1, *state.shape[-2:])
    flat.baddbmm_(k.reshape(-1, k.shape[-1], 1), delta.reshape(-1, 1, delta.shape[-1]))  # + k ⊗ δ
    return (q[..., None, :] @ state)[..., 0, :], state
