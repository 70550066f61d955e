"""One decode token per sequence for the recurrent layers, on GPUs: each kernel reads a sequence's state from its
slot of the state cache once, advances it by the token, writes it back in place and produces the token's output —
where the torch path (llmctl.engine.layers.ssd.state_step, delta_rule.step_delta_rule, selective_scan.step) makes
three to five passes over the state and gathers / scatters the slots. In float32, stored in the cache's dtype.

- `ssd_decode`: Mamba2's state update (mamba_ssm's selective_state_update): per head, dt = softplus(dt + bias)
  clamped to the limit, h ← exp(dt·A)·h + dt·x ⊗ B, y = h·C + D·x; B and C per group of heads.
- `delta_rule_decode`: the gated delta rule (flash-linear-attention's fused_recurrent): S ← exp(g)·S,
  S ← S + k ⊗ β(v − Sᵀk), y = Sᵀq; q and k already L2-normed, q scaled (delta_rule.prepare_heads).
- `selective_scan_decode`: Mamba (1)'s per-channel update: h ← exp(dt·A)·h + dt·x·B, y = h·C + D·x.
- `conv_decode`: the causal convolution in front of them (causal-conv1d's update): out = w · [window, x] (+ bias),
  the slot's window of the last K-1 inputs shifted by one in place.

A row whose slot is negative is a padding row of the CUDA graphs' static buffers (llmctl.engine.worker.cuda_graphs):
it reads and stores no state (its outputs are computed from a zero state and dropped).

Tested under Triton's interpreter against those torch functions (tests/kernels/test_recurrent_decode.py) and
compiled for sm_80/89/90 by the compile check."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def ssd_constexprs(head_dim: int, state_size: int, heads_per_group: int) -> dict:
    return dict(BLOCK_P=min(32, triton.next_power_of_2(head_dim)), HEAD_DIM=head_dim,
                STATE=state_size, BLOCK_N=triton.next_power_of_2(state_size), HEADS_PER_GROUP=heads_per_group)


def delta_rule_constexprs(key_dim: int, value_dim: int) -> dict:
    return dict(KEY_DIM=key_dim, BLOCK_K=triton.next_power_of_2(key_dim), VALUE_DIM=value_dim,
                BLOCK_V=min(32, triton.next_power_of_2(value_dim)))


def conv_constexprs(channels: int, taps: int, biased: bool) -> dict:
    return dict(CHANNELS=channels, BLOCK_C=min(256, triton.next_power_of_2(channels)), TAPS=taps, HAS_BIAS=biased)


def selective_scan_constexprs(channels: int, state_size: int) -> dict:
    return dict(CHANNELS=channels, BLOCK_I=min(64, triton.next_power_of_2(channels)), STATE=state_size,
                BLOCK_N=triton.next_power_of_2(state_size))


def ssd_decode(states: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
               B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
               limit: tuple[float, float]) -> torch.Tensor:
    """states [slots, h, p, n] (updated in place), slots [S], x [S, h, p], dt [S, h], A, D, dt_bias [h], B and C
    [S, g, n] -> y [S, h, p] float32."""
    count, heads, head_dim = x.shape
    y = torch.empty(count, heads, head_dim, dtype=torch.float32, device=x.device)
    if count == 0:
        return y
    x, dt, B, C = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous()
    constexprs = ssd_constexprs(head_dim, states.shape[-1], heads // B.shape[1])
    grid = (count, heads, triton.cdiv(head_dim, constexprs["BLOCK_P"]))
    _ssd_decode_kernel[grid](states, slots, x, dt, A.float().contiguous(), B, C, D.float().contiguous(),
                             dt_bias.float().contiguous(), y, float(limit[0]), min(float(limit[1]), 3.0e38),
                             heads, B.shape[1], **constexprs)
    return y


def delta_rule_decode(states: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """states [slots, Hv, dk, dv] (updated in place), slots [S], q and k [S, Hv, dk] (prepared), v [S, Hv, dv],
    g and beta [S, Hv] -> y [S, Hv, dv] float32."""
    count, heads, value_dim = v.shape
    y = torch.empty(count, heads, value_dim, dtype=torch.float32, device=v.device)
    if count == 0:
        return y
    q, k, v = q.float().contiguous(), k.float().contiguous(), v.contiguous()
    constexprs = delta_rule_constexprs(k.shape[-1], value_dim)
    grid = (count, heads, triton.cdiv(value_dim, constexprs["BLOCK_V"]))
    _delta_rule_decode_kernel[grid](states, slots, q, k, v, g.float().contiguous(), beta.float().contiguous(), y,
                                    heads, **constexprs)
    return y


def selective_scan_decode(states: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                          A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """states [slots, I, n] (updated in place), slots [S], x and dt [S, I] (dt after softplus), A [I, n], B and C
    [S, n], D [I] -> y [S, I] float32."""
    count, channels = x.shape
    y = torch.empty(count, channels, dtype=torch.float32, device=x.device)
    if count == 0:
        return y
    constexprs = selective_scan_constexprs(channels, states.shape[-1])
    grid = (count, triton.cdiv(channels, constexprs["BLOCK_I"]))
    _selective_scan_decode_kernel[grid](states, slots, x.float().contiguous(), dt.float().contiguous(),
                                        A.float().contiguous(), B.float().contiguous(), C.float().contiguous(),
                                        D.float().contiguous(), y, **constexprs)
    return y


def conv_decode(windows: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """windows [slots, C, K-1] (shifted in place), slots [S], x [S, C], weight [C, K], bias [C] or None -> out [S, C]
    float32."""
    count, channels = x.shape
    out = torch.empty(count, channels, dtype=torch.float32, device=x.device)
    if count == 0:
        return out
    constexprs = conv_constexprs(channels, weight.shape[1], bias is not None)
    weight = weight.float().contiguous()
    grid = (count, triton.cdiv(channels, constexprs["BLOCK_C"]))
    _conv_decode_kernel[grid](windows, slots, x.contiguous(), weight,
                              bias.float().contiguous() if bias is not None else weight, out, **constexprs)
    return out


@triton.jit
def _conv_decode_kernel(windows_ptr, slots_ptr, x_ptr, w_ptr, bias_ptr, out_ptr, CHANNELS: tl.constexpr,
                        BLOCK_C: tl.constexpr, TAPS: tl.constexpr, HAS_BIAS: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = channels < CHANNELS
    slot = tl.load(slots_ptr + seq)
    live = tl.where(slot >= 0, ok, False)  # a negative slot: a padding row, no window read or stored
    x = tl.load(x_ptr + seq * CHANNELS + channels, mask=ok, other=0.0).to(tl.float32)
    acc = tl.load(w_ptr + channels * TAPS + TAPS - 1, mask=ok, other=0.0) * x
    if HAS_BIAS:
        acc += tl.load(bias_ptr + channels, mask=ok, other=0.0)
    window = windows_ptr + (tl.maximum(slot, 0) * CHANNELS + channels) * (TAPS - 1)
    for tap in tl.static_range(TAPS - 1):
        earlier = tl.load(window + tap, mask=live, other=0.0)
        acc += tl.load(w_ptr + channels * TAPS + tap, mask=ok, other=0.0) * earlier.to(tl.float32)
        if tap > 0:  # the window moves one input along: this program's channels only, read before written
            tl.store(window + tap - 1, earlier, mask=live)
    if TAPS > 1:
        tl.store(window + TAPS - 2, x.to(windows_ptr.dtype.element_ty), mask=live)
    tl.store(out_ptr + seq * CHANNELS + channels, acc, mask=ok)


@triton.jit
def _ssd_decode_kernel(states_ptr, slots_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, dt_bias_ptr, y_ptr,
                       dt_min, dt_max, heads, groups, BLOCK_P: tl.constexpr, HEAD_DIM: tl.constexpr,
                       STATE: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PER_GROUP: tl.constexpr):
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < HEAD_DIM, cols < STATE
    slot = tl.load(slots_ptr + seq)
    live, slot = slot >= 0, tl.maximum(slot, 0)  # a negative slot: a padding row, no state read or stored
    raw = tl.load(dt_ptr + seq * heads + head).to(tl.float32) + tl.load(dt_bias_ptr + head)
    dt = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(raw)))  # softplus, as torch's threshold 20
    dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    decay = tl.exp(dt * tl.load(a_ptr + head))
    group = head // HEADS_PER_GROUP
    b = tl.load(b_ptr + (seq * groups + group) * STATE + cols, mask=col_ok, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + (seq * groups + group) * STATE + cols, mask=col_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + (seq * heads + head) * HEAD_DIM + rows, mask=row_ok, other=0.0).to(tl.float32)
    at = states_ptr + ((slot * heads + head) * HEAD_DIM + rows[:, None]) * STATE + cols[None, :]
    ok = tl.where(live, row_ok[:, None] & col_ok[None, :], False)
    h = tl.load(at, mask=ok, other=0.0).to(tl.float32) * decay + (dt * x)[:, None] * b[None, :]
    tl.store(at, h.to(states_ptr.dtype.element_ty), mask=ok)
    y = tl.sum(h * c[None, :], 1) + tl.load(d_ptr + head) * x
    tl.store(y_ptr + (seq * heads + head) * HEAD_DIM + rows, y, mask=row_ok)


@triton.jit
def _delta_rule_decode_kernel(states_ptr, slots_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, y_ptr, heads,
                              KEY_DIM: tl.constexpr, BLOCK_K: tl.constexpr, VALUE_DIM: tl.constexpr,
                              BLOCK_V: tl.constexpr):
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    keys = tl.arange(0, BLOCK_K)
    values = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    key_ok, value_ok = keys < KEY_DIM, values < VALUE_DIM
    slot = tl.load(slots_ptr + seq)
    live, slot = slot >= 0, tl.maximum(slot, 0)  # a negative slot: a padding row, no state read or stored
    row = seq * heads + head
    q = tl.load(q_ptr + row * KEY_DIM + keys, mask=key_ok, other=0.0)
    k = tl.load(k_ptr + row * KEY_DIM + keys, mask=key_ok, other=0.0)
    v = tl.load(v_ptr + row * VALUE_DIM + values, mask=value_ok, other=0.0).to(tl.float32)
    at = states_ptr + ((slot * heads + head) * KEY_DIM + keys[:, None]) * VALUE_DIM + values[None, :]
    ok = tl.where(live, key_ok[:, None] & value_ok[None, :], False)
    s = tl.load(at, mask=ok, other=0.0).to(tl.float32) * tl.exp(tl.load(g_ptr + row))
    delta = (v - tl.sum(s * k[:, None], 0)) * tl.load(beta_ptr + row)
    s = s + k[:, None] * delta[None, :]
    tl.store(at, s.to(states_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + row * VALUE_DIM + values, tl.sum(s * q[:, None], 0), mask=value_ok)


@triton.jit
def _selective_scan_decode_kernel(states_ptr, slots_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, y_ptr,
                                  CHANNELS: tl.constexpr, BLOCK_I: tl.constexpr, STATE: tl.constexpr,
                                  BLOCK_N: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < CHANNELS, cols < STATE
    ok = row_ok[:, None] & col_ok[None, :]
    slot = tl.load(slots_ptr + seq)
    live, slot = slot >= 0, tl.maximum(slot, 0)  # a negative slot: a padding row, no state read or stored
    x = tl.load(x_ptr + seq * CHANNELS + rows, mask=row_ok, other=0.0)
    dt = tl.load(dt_ptr + seq * CHANNELS + rows, mask=row_ok, other=0.0)
    b = tl.load(b_ptr + seq * STATE + cols, mask=col_ok, other=0.0)
    c = tl.load(c_ptr + seq * STATE + cols, mask=col_ok, other=0.0)
    a = tl.load(a_ptr + rows[:, None] * STATE + cols[None, :], mask=ok, other=0.0)
    at = states_ptr + (slot * CHANNELS + rows[:, None]) * STATE + cols[None, :]
    stored = tl.where(live, ok, False)
    h = tl.load(at, mask=stored, other=0.0).to(tl.float32) * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * b[None, :]
    tl.store(at, h.to(states_ptr.dtype.element_ty), mask=stored)
    y = tl.sum(h * c[None, :], 1) + tl.load(d_ptr + rows, mask=row_ok, other=0.0) * x
    tl.store(y_ptr + seq * CHANNELS + rows, y, mask=row_ok)
