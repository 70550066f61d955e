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
    `initial` [h, p, n]. Returns y [L, h, p] (with the D skip) and the state after the last token."""
    ys, final = chunk_scan_batch([x], [dt], A, [B], [C], D, dt_bias, chunk_size, initial[None], limit)
    return ys[0], final[0]


def chunk_scan_batch(xs: list[torch.Tensor], dts: list[torch.Tensor], A: torch.Tensor, Bs: list[torch.Tensor],
                     Cs: list[torch.Tensor], D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
                     initial: torch.Tensor, limit: tuple[float, float]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Several sequences' chunks at once, each padded to the longest with dt = 0 (no decay, no input: the state
    passes the padding unchanged): x_i [L_i, h, p], dt_i [L_i, h], B_i and C_i [L_i, g, n], from the states
    `initial` [S, h, p, n]. Returns each y_i [L_i, h, p] (with the D skip) and the states after each last token.
    Sequence and head first throughout ([S·h, chunks, l, ·]), so every contraction is one batched matmul."""
    lengths = [x.shape[0] for x in xs]
    count, heads, groups = len(xs), xs[0].shape[1], Bs[0].shape[1]
    chunk = fitted_chunk(max(lengths), chunk_size)
    padded = -(-max(lengths) // chunk) * chunk
    repeat = heads // groups

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:  # [S, padded, k, ...], zeros after each length
        return torch.stack([F.pad(t, (0, 0) * (t.dim() - 1) + (0, padded - t.shape[0])) for t in parts])

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [S, padded, k, ...] -> [S·k, c, chunk, ...]
        t = t.reshape(count, -1, chunk, *t.shape[2:]).movedim(3, 1)
        return t.flatten(0, 1).contiguous()

    dt = stacked([_discretized_dt(d, dt_bias, limit) for d in dts])  # [S, P, h]; 0 in the padding
    x = stacked([t.float() for t in xs])
    xdt = chunks(x * dt[..., None])  # [S·h, c, l, p]
    Adt = chunks((A.float() * dt)[..., None])[..., 0]  # [S·h, c, l]
    Bg, Cg = chunks(stacked([t.float() for t in Bs])), chunks(stacked([t.float() for t in Cs]))  # [S·g, c, l, n]
    Bh, Ch = Bg.repeat_interleave(repeat, dim=0), Cg.repeat_interleave(repeat, dim=0)  # [S·h, c, l, n]
    A_cumsum = torch.cumsum(Adt, dim=-1)
    scores = (Cg @ Bg.transpose(-1, -2)).repeat_interleave(repeat, dim=0) * torch.exp(_segment_sum(Adt))
    y = scores @ xdt  # [S·h, c, l, p]: within each chunk
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # [S·h, c, l]
    states = (Bh * decay_states[..., None]).transpose(-1, -2) @ xdt  # [S·h, c, n, p]: each chunk's own
    states = torch.cat([initial.float().flatten(0, 1).transpose(-1, -2)[:, None], states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[..., -1], (1, 0))))  # [S·h, c + 1, c + 1]
    states = (decay_chunk @ states.flatten(2)).view_as(states)  # the state at each chunk's start, then the end
    y = y + (Ch @ states[:, :-1]) * torch.exp(A_cumsum)[..., None]  # from the state before each chunk
    y = y.view(count, heads, -1, y.shape[-1]).transpose(1, 2)  # [S, padded, h, p]
    skip = D.float()[:, None]
    ys = [y[i, :length] + skip * x[i, :length] for i, length in enumerate(lengths)]
    return ys, states[:, -1].transpose(-1, -2).view(count, heads, *initial.shape[2:])


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
