"""Mamba2's state-space duality in torch (the reference path on every device): the chunked scan for a prompt chunk
that starts from a carried SSM state, and the one-token state update of a decode (mamba_ssm's ssd_combined and
selective_state_update algorithms, as transformers' torch path writes them). All in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    `initial` [h, p, n]. Returns y [L, h, p] (with the D skip) and the state after the last token."""
    length, heads, _ = x.shape
    dt = _discretized_dt(dt, dt_bias, limit)
    repeat = heads // B.shape[1]
    B = B.float().repeat_interleave(repeat, dim=1)
    C = C.float().repeat_interleave(repeat, dim=1)
    x = x.float()
    pad = (chunk_size - length % chunk_size) % chunk_size
    skip = D.float()[:, None] * x
    xdt = x * dt[..., None]
    Adt = A.float() * dt  # [L, h]

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [L, ...] -> [c, chunk, ...]
        return F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)).reshape(-1, chunk_size, *t.shape[1:])

    xdt, Adt, B, C = chunks(xdt), chunks(Adt), chunks(B), chunks(C)
    Adt = Adt.permute(2, 0, 1)  # [h, c, l]
    A_cumsum = torch.cumsum(Adt, dim=-1)
    L = torch.exp(_segment_sum(Adt))  # [h, c, l, s]
    scores = torch.einsum("clhn,cshn->clsh", C, B) * L.permute(1, 2, 3, 0)
    y_diag = torch.einsum("clsh,cshp->clhp", scores, xdt)
    decay_states = torch.exp(A_cumsum[:, :, -1:] - A_cumsum)  # [h, c, l]
    states = torch.einsum("clhn,clhp->chpn", B * decay_states.permute(1, 2, 0)[..., None], xdt)
    states = torch.cat([initial.float()[None], states], dim=0)  # [c + 1, h, p, n]
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[:, :, -1], (1, 0))))  # [h, c + 1, c + 1]
    new_states = torch.einsum("hzc,chpn->zhpn", decay_chunk, states)
    states, final = new_states[:-1], new_states[-1]
    y_off = torch.einsum("clhn,chpn->clhp", C, states) * torch.exp(A_cumsum).permute(1, 2, 0)[..., None]
    y = (y_diag + y_off).reshape(-1, heads, x.shape[-1])[:length]
    return y + skip, final


def state_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: states [S, h, p, n], x [S, h, p], dt [S, h], B and C [S, g, n]. Returns y [S, h, p]
    and the new states."""
    heads = x.shape[1]
    dt = _discretized_dt(dt, dt_bias, limit)  # [S, h]
    repeat = heads // B.shape[1]
    B = B.float().repeat_interleave(repeat, dim=1)  # [S, h, n]
    C = C.float().repeat_interleave(repeat, dim=1)
    x = x.float()
    decay = torch.exp(dt * A.float())[..., None, None]  # [S, h, 1, 1]
    new = state.float() * decay + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    y = torch.einsum("shpn,shn->shp", new, C) + D.float()[:, None] * x
    return y, new
