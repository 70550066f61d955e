"""The recurrent layers' decode kernels — Triton's for GPUs (kernels/recurrent_decode.py, under the interpreter here)
and the C++ ones for CPUs (kernels/cpu_recurrent.cpp) — against the torch paths they replace
(llmctl.engine.layers.ssd.state_step, delta_rule.step_delta_rule, selective_scan.step, and causal_conv.conv_step
for the C++ convolution step), in float32 (and a bfloat16
state cache): sizes that are not powers of two (masked tiles), slots out of order (the kernels read and write them
in place, the torch path on a gathered copy), the other slots untouched, and a padding row (slot -1, as the CUDA
graphs' static buffers pad a batch) reading and storing no state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmctl.engine.layers import causal_conv, delta_rule, selective_scan, ssd
from llmctl.kernels import cpu, recurrent_decode

KERNELS = {"triton": recurrent_decode, "cpu": cpu}

SLOTS = torch.tensor([4, 1, -1, 2])  # three decodes and a padding row in a cache of 6 slots
REAL = SLOTS >= 0
ROWS = len(SLOTS)


def random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_updated_like(cache: torch.Tensor, before: torch.Tensor, expected_states: torch.Tensor) -> None:
    torch.testing.assert_close(cache[SLOTS[REAL]], expected_states.to(cache.dtype), atol=1e-5, rtol=1e-5)
    untouched = [i for i in range(cache.shape[0]) if i not in SLOTS.tolist()]
    assert torch.equal(cache[untouched], before[untouched])


def assert_outputs_like(y: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(y[REAL], expected, atol=1e-5, rtol=1e-5)
    assert y[~REAL].isfinite().all()  # the padding row's output: dropped, but nothing that could spread


@pytest.mark.parametrize(("kind", "dtype"), [("triton", torch.float32), ("cpu", torch.float32),
                                             ("cpu", torch.bfloat16)])
def test_ssd_decode_matches_the_torch_state_step(kind, dtype):
    heads, head_dim, groups, state = 4, 24, 2, 20
    cache = random(6, heads, head_dim, state, seed=0).to(dtype)
    before = cache.clone()
    x, dt, B, C = random(ROWS, heads, head_dim, seed=1), random(ROWS, heads, seed=2), \
        random(ROWS, groups, state, seed=3), random(ROWS, groups, state, seed=4)
    A, D, bias = -random(heads, seed=5).abs(), random(heads, seed=6), random(heads, seed=7)
    limit = (0.2, 1.5)  # both bounds bite on these values
    expected_y, expected_states = ssd.state_step(cache[SLOTS[REAL]].clone(), x[REAL], dt[REAL], A, B[REAL], C[REAL],
                                                 D, bias, limit)
    y = KERNELS[kind].ssd_decode(cache, SLOTS, x, dt, A, B, C, D, bias, limit)
    assert_outputs_like(y, expected_y)
    assert_updated_like(cache, before, expected_states)


@pytest.mark.parametrize(("kind", "dtype"), [("triton", torch.float32), ("cpu", torch.float32),
                                             ("cpu", torch.bfloat16)])
@pytest.mark.parametrize("biased", [True, False])
def test_conv_decode_matches_the_torch_conv_step(kind, dtype, biased):
    channels, taps = 300, 4  # more channels than one task's (or program's) block
    cache = random(6, channels, taps - 1, seed=0).to(dtype)
    before = cache.clone()
    x, weight = random(ROWS, channels, seed=1).to(dtype), random(channels, taps, seed=2)
    bias = random(channels, seed=3) if biased else None
    expected_out, expected_windows = causal_conv.conv_step(x[REAL], cache[SLOTS[REAL]].clone(), weight, bias)
    out = KERNELS[kind].conv_decode(cache, SLOTS, x, weight, bias)
    assert_outputs_like(out, expected_out)
    assert_updated_like(cache, before, expected_windows)


@pytest.mark.parametrize("kind", KERNELS)
def test_delta_rule_decode_matches_the_torch_step(kind):
    k_heads, v_heads, key_dim, value_dim = 1, 3, 24, 40
    cache = random(6, v_heads, key_dim, value_dim, seed=0) * 0.1
    before = cache.clone()
    q, k, v = random(ROWS, k_heads, key_dim, seed=1), random(ROWS, k_heads, key_dim, seed=2), \
        random(ROWS, v_heads, value_dim, seed=3)
    g, beta = -random(ROWS, v_heads, seed=4).abs(), torch.sigmoid(random(ROWS, v_heads, seed=5))
    expected_y, expected_states = delta_rule.step_delta_rule(cache[SLOTS[REAL]].clone(), q[REAL], k[REAL], v[REAL],
                                                             g[REAL], beta[REAL])
    prepared_q, prepared_k = delta_rule.prepare_heads(q, k, v_heads)
    y = KERNELS[kind].delta_rule_decode(cache, SLOTS, prepared_q, prepared_k, v, g, beta)
    assert_outputs_like(y, expected_y)
    assert_updated_like(cache, before, expected_states)


@pytest.mark.parametrize("kind", KERNELS)
def test_selective_scan_decode_matches_the_torch_step(kind):
    channels, state = 70, 12
    cache = random(6, channels, state, seed=0)
    before = cache.clone()
    x, dt = random(ROWS, channels, seed=1), torch.nn.functional.softplus(random(ROWS, channels, seed=2))
    B, C = random(ROWS, state, seed=3), random(ROWS, state, seed=4)
    A, D = -random(channels, state, seed=5).abs(), random(channels, seed=6)
    expected_y, expected_states = selective_scan.step(x[REAL], dt[REAL], A, B[REAL], C[REAL], D,
                                                      cache[SLOTS[REAL]].clone())
    y = KERNELS[kind].selective_scan_decode(cache, SLOTS, x, dt, A, B, C, D)
    assert_outputs_like(y, expected_y)
    assert_updated_like(cache, before, expected_states)


def test_decodes_split_into_runs_of_consecutive_slots_for_the_torch_path():
    """Without the kernels, decodes update views of the state cache: one per run of consecutive slots (in slot
    order), all gathered at once past MAX_DECODE_RUNS runs; a prompt chunk is never among them."""
    from llmctl.engine.layers.recurrent_state import MAX_DECODE_RUNS, StateCache, StateStep

    def step(slots: list[int], prompt_at: int | None = None) -> StateStep:
        lengths = [5 if i == prompt_at else 1 for i in range(len(slots))]
        starts = [sum(lengths[:i]) for i in range(len(slots) + 1)]
        return StateStep(StateCache({}, 16), starts, slots, [i == prompt_at for i in range(len(slots))],
                         torch.device("cpu"))

    reversed_run = step([3, 2, 1, 0])
    assert [(rows.tolist(), slots) for rows, slots in reversed_run.decode_runs] == [([3, 2, 1, 0], slice(0, 4))]
    holes = step([0, 1, 7, 5, 8, 2], prompt_at=3)  # slot 5 prefills: runs 0-2 and 7-8
    assert [slots for _, slots in holes.decode_runs] == [slice(0, 3), slice(7, 9)] and holes.prefills == [3]
    assert holes.all_decodes[0][1].tolist() == [0, 1, 2, 7, 8]
    scattered = step(list(range(0, 2 * (MAX_DECODE_RUNS + 1), 2)))
    assert len(scattered.decode_runs) == 1 and scattered.decode_runs[0][1].tolist() == scattered.slots


@pytest.mark.parametrize("chunk,head_dim", [(32, 24), (16, 64)])
def test_the_prompt_scans_triton_part_within_chunks_matches_torchs(monkeypatch, chunk, head_dim):
    """Mamba2's chunked scan with its within-chunk part through kernels/recurrent_prefill.py (interpreted) equals the torch
    path: two sequences of different lengths over several chunks, two groups of two heads, from carried states."""
    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    heads, groups, state, lengths = 4, 2, 16, (70, 33)
    xs = [random(n, heads, head_dim, seed=n) for n in lengths]
    dts = [random(n, heads, seed=n + 1) for n in lengths]
    Bs, Cs = ([random(n, groups, state, seed=n + k) for n in lengths] for k in (2, 3))
    A, D, bias = -random(heads, seed=5).abs(), random(heads, seed=6), random(heads, seed=7)
    initial = random(2, heads, head_dim, state, seed=8) * 0.1
    arguments = (xs, dts, A, Bs, Cs, D, bias, chunk, initial, (0.0, float("inf")))
    expected_ys, expected_final = ssd.chunk_scan_batch(*arguments)
    monkeypatch.setenv(KERNELS_ON_CPU, "1")
    ys, final = ssd.chunk_scan_batch(*arguments)
    for y, expected in zip(ys, expected_ys):
        torch.testing.assert_close(y, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, expected_final, atol=1e-4, rtol=1e-4)


def test_mamba1s_prompt_scan_kernel_matches_the_torch_token_loop(monkeypatch):
    """Mamba (1)'s scan through kernels/recurrent_prefill.py (interpreted) equals torch's token loop: two sequences
    of different lengths (the shorter padded with dt = 0), channels not a multiple of the block, from carried states."""
    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    channels, state, lengths = 40, 6, (9, 4)
    xs, dts = [random(n, channels, seed=n) for n in lengths], [F.softplus(random(n, channels, seed=n + 1)) for n in lengths]
    Bs, Cs = ([random(n, state, seed=n + k) for n in lengths] for k in (2, 3))
    A, D = -random(channels, state, seed=5).abs(), random(channels, seed=6)
    initial = random(2, channels, state, seed=7)
    expected_states = initial.clone()
    expected = selective_scan.scan_batch(xs, dts, A, Bs, Cs, D, expected_states)
    monkeypatch.setenv(KERNELS_ON_CPU, "1")
    states = initial.clone()
    got = selective_scan.scan_batch(xs, dts, A, Bs, Cs, D, states)
    for y, reference in zip(got, expected):
        torch.testing.assert_close(y, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states, expected_states, atol=1e-5, rtol=1e-5)


def test_the_delta_rules_prompt_kernel_matches_the_torch_chunked_form(monkeypatch):
    """The gated delta rule over prompts through kernels/recurrent_prefill.py (interpreted) equals torch's chunked form
    (transformers' algorithm): two sequences of different lengths across 64-token chunks (the shorter padded with
    g = β = 0), key heads shared by two value heads, value dims not a multiple of the block, from carried states."""
    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    k_heads, v_heads, key_dim, value_dim, lengths = 1, 2, 24, 40, (70, 9)
    qs, ks = ([random(n, k_heads, key_dim, seed=n + s) for n in lengths] for s in (0, 1))
    vs = [random(n, v_heads, value_dim, seed=n + 2) for n in lengths]
    gs = [-random(n, v_heads, seed=n + 3).abs() * 0.1 for n in lengths]
    betas = [torch.sigmoid(random(n, v_heads, seed=n + 4)) for n in lengths]
    initial = random(2, v_heads, key_dim, value_dim, seed=5) * 0.1
    expected_ys, expected_final = delta_rule.chunk_delta_rule_batch(qs, ks, vs, gs, betas, initial)
    monkeypatch.setenv(KERNELS_ON_CPU, "1")
    ys, final = delta_rule.chunk_delta_rule_batch(qs, ks, vs, gs, betas, initial)
    for y, expected in zip(ys, expected_ys):
        torch.testing.assert_close(y, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, expected_final, atol=1e-4, rtol=1e-4)
