"""Mamba (1)'s selective scan (mamba_ssm's selective_scan_fn and selective_state_update, as transformers' torch path
writes them), in float32 on every device: per inner channel i and state index n, h ← exp(dt·A)·h + dt·x·B and
y = h·C + D·x. B and C are shared by all channels of a token, dt is per channel, so the state is a diagonal
recurrence with nothing to batch across tokens: a step's prompt chunks run token by token together (one fused
multiply-add each), their states kept for one contraction with C at the end; decodes advance every sequence by one
token together."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.engine.layers.recurrent_state import triton_kernels_for

SPAN_VALUES = 1 << 22  # per-token states held at once (sequences × tokens × channels × state floats: 16 MiB)


def scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         state: torch.Tensor) -> torch.Tensor:
    """One sequence's tokens from its state: x, dt [L, I]; A [I, N]; B, C [L, N]; D [I]; state [I, N] float32,
    left holding the state after the last token. Returns y [L, I] float32."""
    states = state[None].clone()
    ys = scan_batch([x], [dt], A, [B], [C], D, states)
    state.copy_(states[0])
    return ys[0]


def scan_batch(xs: list[torch.Tensor], dts: list[torch.Tensor], A: torch.Tensor, Bs: list[torch.Tensor],
               Cs: list[torch.Tensor], D: torch.Tensor, states: torch.Tensor) -> list[torch.Tensor]:
    """Several sequences' tokens at once, each padded to the longest with dt = 0 (decay 1, no input: the state
    passes the padding unchanged): x_i, dt_i [L_i, I]; B_i, C_i [L_i, N]; states [S, I, N] float32, left holding
    each one's state after its last token. Returns each y_i [L_i, I] float32."""
    lengths = [x.shape[0] for x in xs]
    count, channels, size = len(xs), A.shape[0], A.shape[1]

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([F.pad(t.float(), (0, 0, 0, max(lengths) - t.shape[0])) for t in parts])

    x, dt, B, C = stacked(xs), stacked(dts), stacked(Bs), stacked(Cs)  # [S, L, ·]
    if triton_kernels_for(x):  # the state in registers while the tokens pass (kernels/recurrent_prefill.py)
        from llmctl.kernels.recurrent_prefill import selective_scan_prompts

        y = selective_scan_prompts(x, dt, A, B, C, D, states)
        return [y[i, :length] for i, length in enumerate(lengths)]
    span = max(1, SPAN_VALUES // (count * channels * size))
    ys = []
    h = states
    for start in range(0, max(lengths), span):
        part = slice(start, start + span)
        decay = torch.exp(dt[:, part, :, None] * A)  # [S, l, I, N]
        held = (dt[:, part] * x[:, part])[..., None] * B[:, part, None, :]  # the inputs, overwritten by the states
        for t in range(held.shape[1]):
            h = torch.addcmul(held[:, t], decay[:, t], h, out=held[:, t])
        ys.append(torch.einsum("slin,sln->sli", held, C[:, part]))
    states.copy_(h)
    y = torch.cat(ys, dim=1) + D * x
    return [y[i, :length] for i, length in enumerate(lengths)]


def step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of S sequences: x, dt [S, I]; B, C [S, N]; states [S, I, N] float32 (a view, updated in
    place, or a gathered copy). Returns y [S, I] and the new states."""
    new = states.mul_(torch.exp(dt[:, :, None] * A)).add_((dt * x)[:, :, None] * B[:, None, :])
    return torch.einsum("sin,sn->si", new, C) + D * x, new
