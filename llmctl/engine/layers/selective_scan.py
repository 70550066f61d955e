"""Mamba (1)'s selective scan (mamba_ssm's selective_scan_fn and selective_state_update, as transformers' torch path
writes them), in float32 on every device: per inner channel i and state index n, h ← exp(dt·A)·h + dt·x·B and
y = h·C + D·x. B and C are shared by all channels of a token, dt is per channel, so the state is a diagonal
recurrence with nothing to batch across tokens: a prompt chunk runs token by token (one fused multiply-add each),
its states kept for one contraction with C at the end; decodes advance every sequence by one token together."""

from __future__ import annotations

import torch

SPAN = 64  # tokens whose per-token states are held at once ([SPAN, channels, state] floats)


def scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         state: torch.Tensor) -> torch.Tensor:
    """One sequence's tokens from its state: x, dt [L, I]; A [I, N]; B, C [L, N]; D [I]; state [I, N] float32,
    left holding the state after the last token. Returns y [L, I] float32."""
    ys = []
    for start in range(0, x.shape[0], SPAN):
        part = slice(start, start + SPAN)
        decay = torch.exp(dt[part, :, None] * A)  # [l, I, N]
        states = (dt[part] * x[part])[:, :, None] * B[part, None, :]  # the inputs, overwritten by the states
        h = state
        for t in range(states.shape[0]):
            h = torch.addcmul(states[t], decay[t], h, out=states[t])
        state.copy_(h)
        ys.append(torch.einsum("lin,ln->li", states, C[part]))
    return torch.cat(ys) + D * x


def step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of S sequences: x, dt [S, I]; B, C [S, N]; states [S, I, N] float32 (a view, updated in
    place, or a gathered copy). Returns y [S, I] and the new states."""
    new = states.mul_(torch.exp(dt[:, :, None] * A)).add_((dt * x)[:, :, None] * B[:, None, :])
    return torch.einsum("sin,sn->si", new, C) + D * x, new
