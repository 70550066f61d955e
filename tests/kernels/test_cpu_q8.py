"""GGUF weights times int8 activations (the C++ `q8_linear`), as llama.cpp multiplies them: x rounded to
llama.cpp's Q8_0 blocks — the reference rounding is gguf-py's `quantize(x, Q8_0)` — then integer dot
products. Every block type (32-wide groups, and Q6_K's 16-wide ones), on every instruction-set path built here
(the run's summary line names them), against the float64 product of the two dequantized operands."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from helpers.gguf_models import coded_weight, gguf_tensor, reference
from llmctl.engine.layers.coded_linear import DECODE_ROWS, CodedWeight, coded_from
from llmctl.kernels import cpu

ISAS = cpu.int4_isas() if cpu.unavailable_reason() is None else []
needs_kernels = pytest.mark.skipif(not ISAS, reason=f"C++ kernels not built: {cpu.unavailable_reason()}")
GROUPS_OF_32 = ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0"]


@pytest.fixture(autouse=True)
def int8_activations(monkeypatch):
    """GGUF weights with int8 activations, the engine's default (conftest sets float32 for other tests)."""
    monkeypatch.setenv("LLMCTL_GGUF_ACTIVATIONS", "int8")


def rounded_as_q8_0(x: torch.Tensor) -> torch.Tensor:
    """x after gguf-py's Q8_0 round trip: d = max|x| / 127 per 32 (kept in float16), q = round(x / d)."""
    raw = quantize(x.numpy(), GGMLQuantizationType.Q8_0)
    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType.Q8_0), dtype=np.float32)).view(x.shape)


def check_close(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """out == x Wᵀ in float64, within float32 summation's error (its scale: Σ |x| |w|)."""
    bound = (x.double().abs() @ weight.double().abs().t()).max().item()
    torch.testing.assert_close(out.double(), x.double() @ weight.double().t(), rtol=1e-5, atol=2e-6 * bound)


def check_against_reference(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    check_close(out, rounded_as_q8_0(x), weight)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_activations_are_rounded_as_gguf_q8_0_to_the_bit(isa):
    # An identity weight of int8 codes (scale 1) returns each activation's d · q: equal to gguf-py's round trip
    # exactly. Blocks whose max is 127 have d = 1, so x · (1 / d) lands on halves: rounded away from zero.
    gen = torch.Generator().manual_seed(3)
    ties = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 1.5, -1.5, 3.49999976, -64.5] + [0.25] * 21)
    x = torch.cat([ties, torch.randn(32 * 15, generator=gen) * 5, torch.zeros(32)]).view(1, -1)
    k = x.shape[1]
    codes, scales = torch.eye(k, dtype=torch.int8), torch.ones(k, k // 32)
    out = cpu.q8_linear(x, codes, scales, torch.zeros_like(scales), None, isa, False)
    assert torch.equal(out, rounded_as_q8_0(x))


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", GROUPS_OF_32)
def test_int8_activation_kernel_on_every_path_equals_the_rounded_product(isa, type_name):
    # 11 chunks of 32 (eight, a pair, one), 17 (eight, eight, one) and 10 (eight, a pair); K-quants' 256-wide
    # super-blocks allow only multiples of eight chunks
    widths = (768, 1280) if type_name.endswith("_K") else (352, 544, 320)
    for columns in widths:
        raw = gguf_tensor(type_name, 40, columns, seed=columns)
        weight, expected = coded_weight(raw, type_name, 40, columns), reference(raw, type_name).view(40, columns)
        assert weight.group_size == 32
        for batch in (1, 2, 3, 5):
            x = torch.randn(batch, columns, generator=torch.Generator().manual_seed(batch)) * 3
            out = cpu.q8_linear(x, weight.codes, weight.scales, weight.offsets, None, isa, weight.offsets_used)
            check_against_reference(out, x, expected)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_16_wide_groups_q6_k_and_a_widened_q4_k_on_every_path(isa):
    """Q6_K's 16-weight scales (no offsets), and Q4_K widened to 16-wide groups with its offsets, as a fused
    layer holds it beside a Q6_K part (Q4_K_M's attention)."""
    for columns in (768, 1280):
        six = gguf_tensor("Q6_K", 40, columns, seed=columns)
        q6 = coded_weight(six, "Q6_K", 40, columns)
        four = gguf_tensor("Q4_K", 24, columns, seed=columns + 1)
        q4 = coded_weight(four, "Q4_K", 24, columns).widened(8, 16)
        assert q6.group_size == q4.group_size == 16 and not q6.offsets_used and q4.offsets_used
        for weight, expected in ((q6, reference(six, "Q6_K").view(40, columns)),
                                 (q4, reference(four, "Q4_K").view(24, columns))):
            for batch in (1, 2, 3, 5):
                x = torch.randn(batch, columns, generator=torch.Generator().manual_seed(batch)) * 3
                out = cpu.q8_linear(x, weight.codes, weight.scales, weight.offsets, None, isa, weight.offsets_used)
                check_against_reference(out, x, expected)


@needs_kernels
def test_rows_of_zeros_and_a_bias():
    raw = gguf_tensor("Q4_1", 8, 256, seed=3)
    weight, expected = coded_weight(raw, "Q4_1", 8, 256), reference(raw, "Q4_1").view(8, 256)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1))
    x[0] = 0  # d = 0: every q is 0, no division by zero
    x[1, :32] = 0
    bias = torch.randn(8)
    for isa in ISAS:
        out = cpu.q8_linear(x, weight.codes, weight.scales, weight.offsets, bias, isa)
        check_against_reference(out - bias, x, expected)


@needs_kernels
def test_gguf_weights_decode_with_int8_activations_and_others_with_floats():
    """GGUF codes go through q8_linear (llama.cpp's numerics), Q6_K's 16-wide groups included; GPTQ/AWQ repacks
    keep float activations, exact against the float weight."""
    raw = gguf_tensor("Q4_1", 16, 256, seed=5)
    parts = coded_weight(raw, "Q4_1", 16, 256)
    tensors = {"codes": parts.codes, "scales": parts.scales, "offsets": parts.offsets}
    gguf, expected = coded_from(tensors), reference(raw, "Q4_1").view(16, 256)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    assert gguf.int8_activations and not parts.int8_activations  # compact()'s default: GPTQ/AWQ
    check_against_reference(gguf.matmul(x), x, expected)
    check_close(parts.matmul(x), x, expected)
    six = gguf_tensor("Q6_K", 16, 256, seed=6)
    q6 = coded_weight(six, "Q6_K", 16, 256)
    q6 = coded_from({"codes": q6.codes, "scales": q6.scales, "offsets": q6.offsets})
    assert q6.group_size == 16 and q6.int8_kernel
    check_against_reference(q6.matmul(x), x, reference(six, "Q6_K").view(16, 256))


@needs_kernels
def test_prompts_through_wide_4_bit_weights_multiply_int8_activations():
    """From DECODE_ROWS rows a weight is normally decoded once for a float GEMM; 4-bit GGUF codes from 2048 inputs
    (every width with VNNI) stay in integers, as llama.cpp multiplies prompts: the product of the Q8_0-rounded
    activations, which a float GEMM of x itself misses by far more than the bound. Each block of x holds 127/16
    (d = 1/16 exactly) and otherwise (n + 1/4)/16: every x / d is a quarter off an integer, far from a tie."""
    raw = gguf_tensor("Q4_K", 8, 2048, seed=9)
    parts = coded_weight(raw, "Q4_K", 8, 2048)
    weight = coded_from({"codes": parts.codes, "scales": parts.scales, "offsets": parts.offsets})
    steps = torch.randint(-126, 126, (2 * DECODE_ROWS, 2048), generator=torch.Generator().manual_seed(4)) + 0.25
    steps[:, ::32] = 127
    x = steps / 16
    assert weight.integer_prompts
    check_against_reference(weight.matmul(x), x, reference(raw, "Q4_K").view(8, 2048))


@needs_kernels
def test_fused_parts_keep_int8_activations_and_offsets():
    first, second = (coded_from({"codes": w.codes, "scales": w.scales, "offsets": w.offsets})
                     for w in (coded_weight(gguf_tensor("Q8_0", 8, 256, seed=1), "Q8_0", 8, 256),
                               coded_weight(gguf_tensor("Q4_0", 8, 256, seed=2), "Q4_0", 8, 256)))
    assert not first.offsets_used and second.offsets_used  # Q8_0 has none; Q4_0's are −8 · scale
    joined = CodedWeight.stacked([first, second])
    assert joined.int8_activations and joined.offsets_used and joined.bits == 8


@needs_kernels
def test_q8_kernel_refuses_groups_other_than_32_and_16():
    codes, scales = torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 8)  # groups of 8
    with pytest.raises(RuntimeError, match="32 wide"):
        cpu.q8_linear(torch.zeros(1, 64), codes, scales, scales)
    packed, four = torch.zeros(4, 32, dtype=torch.uint8), torch.ones(4, 4)  # 4-bit codes in groups of 16
    with pytest.raises(RuntimeError, match="16 wide with 8-bit codes"):
        cpu.q8_linear(torch.zeros(1, 64), packed, four, four)
