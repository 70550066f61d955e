"""The recurrent layers' prompt scans on GPUs. In float32.

- `ssd_within_chunks`: Mamba2's scan within each chunk, y_i = Σ_{j ≤ i} (C_i · B_j) · exp(cs_i − cs_j) · dt_j x_j
  (cs the running sum of A·dt), as mamba_ssm's chunk-scan kernel computes it — tile by tile, like causal attention
  without a softmax, so the l × l decay and score matrices of every head are never stored. The rest of the chunked
  scan (each chunk's state, the states passed between chunks, their readout) stays in torch
  (llmctl.engine.layers.ssd), as matmuls over all heads of a group.
- `selective_scan_prompts`: Mamba (1)'s scan (mamba_ssm's selective_scan_fn), a block of channels per program, the
  state in registers while the tokens pass — where torch runs a token loop from the host.
- `delta_rule_prompts`: the gated delta rule over a prompt, flash-linear-attention's fused_recurrent form — per
  sequence, value head and block of value dimensions, the state tile S [d_k, block] in registers while the tokens
  pass (S ← exp(g)·S, S ← S + k ⊗ β(v − Sᵀk), y = Sᵀq): the host's loop over 64-token chunks, its triangular
  solves and small matmuls (llmctl.engine.layers.delta_rule) become one launch. Its work grows with d_k · d_v per
  token, as the chunked form's does, without the chunked form's matmuls on tensor cores.

Tested under Triton's interpreter against the torch paths (tests/kernels/test_recurrent_decode.py) and compiled for
sm_80/89/90 by the compile check."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmctl.kernels.recurrent_decode import delta_rule_constexprs  # the same tile as the decode step's


def chunk_constexprs(head_dim: int) -> dict:
    return dict(BLOCK_I=16, BLOCK_J=16, HEAD_DIM=head_dim, BLOCK_P=max(16, triton.next_power_of_2(head_dim)))


def ssd_within_chunks(cb: torch.Tensor, cumsum: torch.Tensor, xdt: torch.Tensor) -> torch.Tensor:
    """cb [N, g, l, l] (C_i · B_j per group), cumsum [N, h, l], xdt [N, h, l, p] (N: sequence × chunk), float32
    -> y [N, h, l, p] float32."""
    count, heads, length, head_dim = xdt.shape
    y = torch.empty(xdt.shape, dtype=torch.float32, device=xdt.device)  # contiguous, whatever xdt's strides
    if count == 0:
        return y
    constexprs = chunk_constexprs(head_dim)
    grid = (count * heads, triton.cdiv(length, constexprs["BLOCK_I"]))
    _within_chunks_kernel[grid](cb.contiguous(), cumsum.contiguous(), xdt.contiguous(), y, heads, cb.shape[1], length,
                                **constexprs)
    return y


def scan_constexprs(channels: int, state_size: int) -> dict:
    return dict(CHANNELS=channels, BLOCK_I=min(32, triton.next_power_of_2(channels)), STATE=state_size,
                BLOCK_N=triton.next_power_of_2(state_size))


def selective_scan_prompts(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                           D: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """x, dt [S, L, I] (dt after softplus; 0 in padding: the state passes it unchanged), A [I, N], B, C [S, L, N],
    D [I], states [S, I, N] float32 (left holding each one's state after the last token) -> y [S, L, I] float32."""
    count, length, channels = x.shape
    y = torch.empty(count, length, channels, dtype=torch.float32, device=x.device)
    if count == 0 or length == 0:
        return y
    constexprs = scan_constexprs(channels, A.shape[1])
    grid = (count, triton.cdiv(channels, constexprs["BLOCK_I"]))
    work = states.contiguous()  # written in place
    _selective_scan_kernel[grid](*(t.float().contiguous() for t in (x, dt, A, B, C, D)), work, y, length,
                                 **constexprs)
    if work.data_ptr() != states.data_ptr():
        states.copy_(work)
    return y


@triton.jit
def _selective_scan_kernel(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, states_ptr, y_ptr, length,
                           CHANNELS: tl.constexpr, BLOCK_I: tl.constexpr, STATE: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    seq, block = tl.program_id(0), tl.program_id(1)
    channels = block * BLOCK_I + tl.arange(0, BLOCK_I)
    n = tl.arange(0, BLOCK_N)
    ok_i, ok_n = channels < CHANNELS, n < STATE
    tile = channels[:, None] * STATE + n[None, :]
    ok = ok_i[:, None] & ok_n[None, :]
    state_base = seq.to(tl.int64) * CHANNELS * STATE
    h = tl.load(states_ptr + state_base + tile, mask=ok, other=0.0)
    a = tl.load(a_ptr + tile, mask=ok, other=0.0)
    d = tl.load(d_ptr + channels, mask=ok_i, other=0.0)
    for t in range(length):
        row = seq.to(tl.int64) * length + t
        x = tl.load(x_ptr + row * CHANNELS + channels, mask=ok_i, other=0.0)
        dt = tl.load(dt_ptr + row * CHANNELS + channels, mask=ok_i, other=0.0)
        b = tl.load(b_ptr + row * STATE + n, mask=ok_n, other=0.0)
        c = tl.load(c_ptr + row * STATE + n, mask=ok_n, other=0.0)
        h = tl.exp(dt[:, None] * a) * h + (dt * x)[:, None] * b[None, :]
        tl.store(y_ptr + row * CHANNELS + channels, tl.sum(h * c[None, :], axis=1) + d * x, mask=ok_i)
    tl.store(states_ptr + state_base + tile, h, mask=ok)


@triton.jit
def _within_chunks_kernel(cb_ptr, cumsum_ptr, xdt_ptr, y_ptr, heads, groups, length,
                          BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_P: tl.constexpr):
    pid, block = tl.program_id(0), tl.program_id(1)
    chunk, head = pid // heads, pid % heads
    group = head // (heads // groups)
    rows = block * BLOCK_I + tl.arange(0, BLOCK_I)
    dims = tl.arange(0, BLOCK_P)
    row_ok = rows < length
    base = (chunk * heads + head).to(tl.int64) * length
    cs_rows = tl.load(cumsum_ptr + base + rows, mask=row_ok, other=0.0)
    cb_base = (chunk * groups + group).to(tl.int64) * length * length
    acc = tl.zeros([BLOCK_I, BLOCK_P], dtype=tl.float32)
    for start in range(0, (block + 1) * BLOCK_I, BLOCK_J):  # causal: columns up to the block's last row
        cols = start + tl.arange(0, BLOCK_J)
        col_ok = cols < length
        cs_cols = tl.load(cumsum_ptr + base + cols, mask=col_ok, other=0.0)
        scores = tl.load(cb_ptr + cb_base + rows[:, None] * length + cols[None, :],
                         mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        causal = (cols[None, :] <= rows[:, None]) & col_ok[None, :]
        weights = tl.where(causal, scores * tl.exp(tl.where(causal, cs_rows[:, None] - cs_cols[None, :], 0.0)), 0.0)
        values = tl.load(xdt_ptr + (base + cols[:, None]) * HEAD_DIM + dims[None, :],
                         mask=col_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        acc = tl.dot(weights, values, acc, input_precision="ieee")
    tl.store(y_ptr + (base + rows[:, None]) * HEAD_DIM + dims[None, :], acc,
             mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :])


def delta_rule_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       states: torch.Tensor) -> torch.Tensor:
    """q, k [S, L, H, dk] (prepared: L2-normed, q scaled), v [S, L, H, dv], g and beta [S, L, H] (0 in padding: the
    state passes it unchanged), states [S, H, dk, dv] float32 (left holding each one's state after its last token)
    -> y [S, L, H, dv] float32."""
    count, length, heads, value_dim = v.shape
    y = torch.empty(count, length, heads, value_dim, dtype=torch.float32, device=v.device)
    if count == 0 or length == 0:
        return y
    constexprs = delta_rule_constexprs(k.shape[-1], value_dim)
    grid = (count, heads, triton.cdiv(value_dim, constexprs["BLOCK_V"]))
    work = states.contiguous()  # written in place
    _delta_rule_kernel[grid](*(t.float().contiguous() for t in (q, k, v, g, beta)), work, y, length, heads,
                             **constexprs)
    if work.data_ptr() != states.data_ptr():
        states.copy_(work)
    return y


@triton.jit
def _delta_rule_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, y_ptr, length, heads,
                       KEY_DIM: tl.constexpr, BLOCK_K: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_V: tl.constexpr):
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    keys = tl.arange(0, BLOCK_K)
    values = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    key_ok, value_ok = keys < KEY_DIM, values < VALUE_DIM
    tile = ((seq * heads + head) * KEY_DIM + keys[:, None]) * VALUE_DIM + values[None, :]
    ok = key_ok[:, None] & value_ok[None, :]
    s = tl.load(states_ptr + tile, mask=ok, other=0.0)
    for t in range(length):
        row = (seq * length + t) * heads + head  # token t's row of this head
        q = tl.load(q_ptr + row * KEY_DIM + keys, mask=key_ok, other=0.0)
        k = tl.load(k_ptr + row * KEY_DIM + keys, mask=key_ok, other=0.0)
        v = tl.load(v_ptr + row * VALUE_DIM + values, mask=value_ok, other=0.0)
        s = s * tl.exp(tl.load(g_ptr + row))
        delta = (v - tl.sum(s * k[:, None], 0)) * tl.load(beta_ptr + row)
        s = s + k[:, None] * delta[None, :]
        tl.store(y_ptr + row * VALUE_DIM + values, tl.sum(s * q[:, None], 0), mask=value_ok)
    tl.store(states_ptr + tile, s, mask=ok)
