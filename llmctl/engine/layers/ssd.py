"""Mamba2's state-space duality in torch (the reference path on every device): the chunked scan for a prompt chunk
that starts from a carried SSM state, and the one-token state update of a decode (mamba_ssm's ssd_combined and
selective_state_update algorithms, as transformers' torch path writes them). All in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.engine.layers.recurrent_state import triton_kernels_for

CPU_CHUNK = 32  # on CPUs: the quadratic part within a chunk costs l² per head; 32 measured fastest (16-256)


def fitted_chunk(length: int, chunk_size: int, on_cpu: bool = False) -> int:
    """The scan's chunk for `length` tokens: the configured size (at most CPU_CHUNK on a CPU), or the power of two
    (≥ 16) that holds them all — the chunked form is exact for any chunk size, and a short prompt need not be
    padded to a long chunk."""
    return min(CPU_CHUNK if on_cpu else chunk_size, chunk_size, max(16, 1 << (length - 1).bit_length()))


def _discretized_dt(dt: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]) -> torch.Tensor:
    return torch.clamp(F.softplus(dt.float() + dt_bias.float()), min=limit[0], max=limit[1])


def _decay_within(cumsum: torch.Tensor) -> torch.Tensor:
    """[..., l] running sums of A·dt -> [..., l, l]: exp(cumsum[i] - cumsum[j]) for j <= i, 0 above the diagonal
    (mamba_ssm's chunk-scan kernel takes the same differences; the sums only fall, so no difference below the
    diagonal is positive)."""
    return torch.exp(cumsum[..., :, None] - cumsum[..., None, :]).tril_()


def _within_chunks(C: torch.Tensor, B: torch.Tensor, cumsum: torch.Tensor, xdt: torch.Tensor) -> torch.Tensor:
    """y_i = Σ_{j<=i} (C_i · B_j) exp(cumsum_i - cumsum_j) dt_j x_j in each chunk: C, B [S, c, g, l, n], cumsum
    [S, c, l, h], xdt [S, c, l, g, r, p] -> [S, c, g, r, l, p]. Triton's kernel on GPUs (kernels/recurrent_prefill.py:
    no l × l matrix per head stored), else the scores and decays as tensors, one batched matmul."""
    count, c, groups, chunk, _ = C.shape
    repeat, head_dim = xdt.shape[-2:]
    cb = C @ B.transpose(-1, -2)  # [S, c, g, l, l]
    if triton_kernels_for(xdt):
        from llmctl.kernels.recurrent_prefill import ssd_within_chunks

        y = ssd_within_chunks(cb.view(count * c, groups, chunk, chunk),
                              cumsum.permute(0, 1, 3, 2).reshape(count * c, groups * repeat, chunk),
                              xdt.permute(0, 1, 3, 4, 2, 5).reshape(count * c, groups * repeat, chunk, head_dim))
        return y.view(count, c, groups, repeat, chunk, head_dim)
    decay = _decay_within(cumsum.permute(0, 1, 3, 2)).view(count, c, groups, repeat, chunk, chunk)
    return decay.mul_(cb[:, :, :, None]) @ xdt.permute(0, 1, 3, 4, 2, 5)


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
    The heads of a group share its B and C, so a chunk's state and its readout are one matmul per group over all
    its heads' columns ([n, l] @ [l, r·p], [l, n] @ [n, r·p]), not one small matmul per head."""
    lengths = [x.shape[0] for x in xs]
    count, heads, head_dim = len(xs), xs[0].shape[1], xs[0].shape[2]
    groups, size = Bs[0].shape[1], Bs[0].shape[2]
    repeat = heads // groups
    chunk = fitted_chunk(max(lengths), chunk_size, xs[0].device.type == "cpu")
    padded = -(-max(lengths) // chunk) * chunk
    c = padded // chunk

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:  # [S, padded, ...] float32, zeros after each length
        return torch.stack([F.pad(t.float(), (0, 0) * (t.dim() - 1) + (0, padded - t.shape[0])) for t in parts])

    dt = stacked([_discretized_dt(d, dt_bias, limit) for d in dts])  # [S, P, h]; 0 in the padding
    x = stacked(xs)  # [S, P, h, p]
    xdt = (x * dt[..., None]).view(count, c, chunk, groups, repeat, head_dim)
    cumsum = torch.cumsum((A.float() * dt).view(count, c, chunk, heads), dim=2)  # [S, c, l, h]
    B = stacked(Bs).view(count, c, chunk, groups, size).transpose(2, 3)  # [S, c, g, l, n]
    C = stacked(Cs).view(count, c, chunk, groups, size).transpose(2, 3)
    y = _within_chunks(C, B, cumsum, xdt)  # [S, c, g, r, l, p]
    # each chunk's own state, then the state at each chunk's start
    to_end = torch.exp(cumsum[:, :, -1:] - cumsum).view(count, c, chunk, groups, repeat, 1)
    weighted = (xdt * to_end).permute(0, 1, 3, 2, 4, 5).reshape(count, c, groups, chunk, repeat * head_dim)
    own = (B.transpose(-1, -2).contiguous() @ weighted).view(count, c, groups, size, repeat, head_dim)
    through = torch.exp(cumsum[:, :, -1]).view(count, c, groups, 1, repeat, 1)  # each chunk's whole decay
    # chunk first, so that the states before each chunk are one contiguous block: [c+1, S, g, n, r, p]
    starts = torch.empty((c + 1, count, *own.shape[2:]), dtype=own.dtype, device=own.device)
    starts[0] = initial.float().view(count, groups, repeat, head_dim, size).permute(0, 1, 4, 2, 3)
    for index in range(c):  # in place: two passes over a state per chunk
        torch.mul(starts[index], through[:, index], out=starts[index + 1])
        starts[index + 1].add_(own[:, index])
    # from the state before each chunk: y_i += exp(cumsum_i) C_i · state
    carried = C.transpose(0, 1) @ starts[:-1].view(c, count, groups, size, repeat * head_dim)  # [c, S, g, l, r·p]
    carried = carried.view(c, count, groups, chunk, repeat, head_dim).transpose(0, 1)
    carried = carried * torch.exp(cumsum).view(count, c, chunk, groups, repeat, 1).transpose(2, 3)
    y = y.transpose(3, 4) + carried  # [S, c, g, l, r, p]
    y = y.transpose(2, 3).reshape(count, padded, heads, head_dim)
    skip = D.float()[:, None]
    ys = [y[i, :length] + skip * x[i, :length] for i, length in enumerate(lengths)]
    return ys, starts[-1].permute(0, 1, 3, 4, 2).reshape(count, heads, head_dim, size)


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
