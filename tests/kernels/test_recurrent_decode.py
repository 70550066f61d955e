"""The recurrent layers' decode kernels (kernels/recurrent_decode.py) against the torch paths they replace
(llmctl.engine.layers.ssd.state_step, delta_rule.step_delta_rule, selective_scan.step): under Triton's interpreter
on CPU tensors in float32 here. Sizes that are not powers of two (masked tiles), slots out of order (the kernel reads
and writes them in place, the torch path on a gathered copy), the other slots untouched."""

from __future__ import annotations

import torch

from llmctl.engine.layers import delta_rule, selective_scan, ssd
from llmctl.kernels.recurrent_decode import delta_rule_decode, selective_scan_decode, slot_indices, ssd_decode

SLOTS = torch.tensor([4, 1, 2])  # three decodes in a cache of 6 slots


def random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_updated_like(cache: torch.Tensor, before: torch.Tensor, expected_states: torch.Tensor) -> None:
    torch.testing.assert_close(cache[SLOTS], expected_states, atol=1e-5, rtol=1e-5)
    untouched = [i for i in range(cache.shape[0]) if i not in SLOTS.tolist()]
    assert torch.equal(cache[untouched], before[untouched])


def test_ssd_decode_matches_the_torch_state_step():
    heads, head_dim, groups, state = 4, 24, 2, 20
    cache = random(6, heads, head_dim, state, seed=0)
    before = cache.clone()
    x, dt, B, C = random(3, heads, head_dim, seed=1), random(3, heads, seed=2), random(3, groups, state, seed=3), \
        random(3, groups, state, seed=4)
    A, D, bias = -random(heads, seed=5).abs(), random(heads, seed=6), random(heads, seed=7)
    limit = (0.2, 1.5)  # both bounds bite on these values
    expected_y, expected_states = ssd.state_step(cache[SLOTS].clone(), x, dt, A, B, C, D, bias, limit)
    y = ssd_decode(cache, SLOTS, x, dt, A, B, C, D, bias, limit)
    torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)
    assert_updated_like(cache, before, expected_states)


def test_delta_rule_decode_matches_the_torch_step():
    k_heads, v_heads, key_dim, value_dim = 1, 3, 24, 40
    cache = random(6, v_heads, key_dim, value_dim, seed=0) * 0.1
    before = cache.clone()
    q, k, v = random(3, k_heads, key_dim, seed=1), random(3, k_heads, key_dim, seed=2), \
        random(3, v_heads, value_dim, seed=3)
    g, beta = -random(3, v_heads, seed=4).abs(), torch.sigmoid(random(3, v_heads, seed=5))
    expected_y, expected_states = delta_rule.step_delta_rule(cache[SLOTS].clone(), q, k, v, g, beta)
    prepared_q, prepared_k = delta_rule.prepare_heads(q, k, v_heads)
    y = delta_rule_decode(cache, SLOTS, prepared_q, prepared_k, v, g, beta)
    torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)
    assert_updated_like(cache, before, expected_states)


def test_selective_scan_decode_matches_the_torch_step():
    channels, state = 70, 12
    cache = random(6, channels, state, seed=0)
    before = cache.clone()
    x, dt = random(3, channels, seed=1), torch.nn.functional.softplus(random(3, channels, seed=2))
    B, C = random(3, state, seed=3), random(3, state, seed=4)
    A, D = -random(channels, state, seed=5).abs(), random(channels, seed=6)
    expected_y, expected_states = selective_scan.step(x, dt, A, B, C, D, cache[SLOTS].clone())
    y = selective_scan_decode(cache, SLOTS, x, dt, A, B, C, D)
    torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)
    assert_updated_like(cache, before, expected_states)


def test_consecutive_slots_given_as_a_slice_become_indices():
    assert slot_indices(slice(2, None), 3, torch.device("cpu")).tolist() == [2, 3, 4]
    assert slot_indices(torch.tensor([5, 0], dtype=torch.int32), 2, torch.device("cpu")).dtype == torch.int64
