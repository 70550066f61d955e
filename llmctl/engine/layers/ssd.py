"""Mamba2's state-space duality in torch (the reference path on every device): the chunked scan for a prompt chunk
that starts from a carried SSM state, and the one-token state update of a decode (mamba_ssm's ssd_combined and
selective_state_update algorithms, as transformers' torch path writes them). All in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fitted_chunk(length: int, chunk_size: int) -> int:
    """The scan's chunk for `length` tokens: the configured size, or the power of two (≥ 16) that holds them all —
    the chunked form is exact for any chunk size, and a short prompt need not be padded to a long chunk."""
    return min(chunk_size, max(16, 1 << (length - 1).bit_length()))


def _discretized_dt(dt: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]) -> torch.Tensor:
    return torch.clamp(F.softplus(dt.float() + dt_bias.float()), min=limit[0], max=limit[1])


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[i, j] = sum of x[j+1 .. i] for j <= i, -inf above the diagonal."""
    size = x.size(-1)
    x = x[..., None].expand(*x.size(), size)
    below = torch.tril(torch.ones(size, size, dtype=torch.bool, device=x.device), diagonal=-1)
    sums = torch.cumsum(x.masked_fill(~below, 0), dim=-2)
    return sums.masked_fill(~torch.tril(torch.ones(size, size, dtype=torch.bool, device=x.device)), -torch.inf)


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int, initial: torch.Tensor,
               limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's chunk of L tokens: x [L, h, p], dt [L, h], B and C [L, g, n], from the SSM state
    `initial` [h, p, n]. Returns y [L, h, p] (with the D skip) and the state after the last token. Heads first
    throughout ([h, chunks, l, ·]), so every contraction is a plain batched matmul."""
    length, heads, _ = x.shape
    chunk = fitted_chunk(length, chunk_size)
    repeat = heads // B.shape[1]
    pad = (chunk - length % chunk) % chunk
    dt = _discretized_dt(dt, dt_bias, limit)  # [L, h]
    x = x.float()
    skip = D.float()[:, None] * x

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [L, k, ...] -> [k, c, chunk, ...]
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, 0, 0, pad))
        return t.reshape(-1, chunk, *t.shape[1:]).movedim(2, 0).contiguous()

    xdt = chunks(x * dt[..., None])  # [h, c, l, p]
    Adt = chunks((A.float() * dt)[..., None])[..., 0]  # [h, c, l]
    Bg, Cg = chunks(B.float()), chunks(C.float())  # [g, c, l, n]: heads share their group's B and C
    Bh, Ch = Bg.repeat_interleave(repeat, dim=0), Cg.repeat_interleave(repeat, dim=0)  # [h, c, l, n]
    A_cumsum = torch.cumsum(Adt, dim=-1)
    scores = (Cg @ Bg.transpose(-1, -2)).repeat_interleave(repeat, dim=0) * torch.exp(_segment_sum(Adt))
    y = scores @ xdt  # [h, c, l, p]: within each chunk
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # [h, c, l]
    states = (Bh * decay_states[..., None]).transpose(-1, -2) @ xdt  # [h, c, n, p]: each chunk's own
    states = torch.cat([initial.float().transpose(-1, -2)[:, None], states], dim=1)  # [h, c + 1, n, p]
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[..., -1], (1, 0))))  # [h, c + 1, c + 1]
    states = (decay_chunk @ states.flatten(2)).view_as(states)  # the state at each chunk's start, then the end
    y = y + (Ch @ states[:, :-1]) * torch.exp(A_cumsum)[..., None]  # from the state before each chunk
    y = y.flatten(1, 2)[:, :length].transpose(0, 1)  # [L, h, p]
    return y + skip, states[:, -1].transpose(-1, -2)


def state_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: states [S, h, p, n], x [S, h, p], dt [S, h], B and C [S, g, n]. Returns y [S, h, p]
    and the new states — float32 states updated in place (pass a view of the cache, or a copy)."""
    heads = x.shape[1]
    dt = _discretized_dt(dt, dt_bias, limit)  # [S, h]
    repeat = heads // B.shape[1]
    B = B.float().repeat_interleave(repeat, dim=1)  # [S, h, n]
    C = C.float().repeat_interleave(repeat, dim=1)
    x = x.float()
    decay = torch.exp(dt * A.float())[..., None, None]  # [S, h, 1, 1]
    new = state.mul_(decay) if state.dtype == torch.float32 else state.float() * decay  # in place: one pass
    flat = new.view(-1, *new.shape[-2:])
    flat.baddbmm_((dt[..., None] * x).reshape(-1, x.shape[-1], 1), B.reshape(-1, 1, B.shape[-1]))  # + dt·x ⊗ B
    y = (new @ C[..., None])[..., 0] + D.float()[:, None] * x
    return y, new
