"""A W8A8 checkpoint's int8 GEMM on CPUs: q8_linear's per_token mode quantizes each input row as
compressed-tensors' dynamic int8 scheme does — the reference is the library's own `fake_quantize` with the
scale from its `compute_dynamic_scales_and_zp` — and multiplies in integers, on every instruction-set path
built here; -128 included (a row's most negative value, when it is the largest in size), which the signed dot
products cannot negate and the kernel adds apart."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels import cpu

ISAS = cpu.int4_isas() if cpu.unavailable_reason() is None else []
needs_kernels = pytest.mark.skipif(not ISAS, reason=f"C++ kernels not built: {cpu.unavailable_reason()}")


def library_quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x after compressed-tensors' int8 per-token round trip, and each row's scale."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    tokens = x.reshape(1, *x.shape)
    scale, zero_point = compute_dynamic_scales_and_zp(tokens, args, torch.nn.Linear(1, 1))
    return fake_quantize(tokens, scale, zero_point, args).reshape(x.shape), scale.reshape(-1, 1)


def identity(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of the identity, scale 1 in groups of 32: the output is each activation's scale · q."""
    return torch.eye(k, dtype=torch.int8), torch.ones(k, k // 32)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_activations_are_quantized_per_token_as_compressed_tensors_to_the_bit(isa):
    gen = torch.Generator().manual_seed(5)
    # row 0: max|x| = 127.5 (positive), so the scale is 1 and x / scale lands on halves: rounded to even
    ties = torch.tensor([127.5, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5, -126.5, 126.5] + [0.25] * 22)
    rows = [torch.cat([ties, torch.randn(32 * 7, generator=gen) * 9]),
            torch.randn(256, generator=gen).abs() * 3 - 1,  # its largest value is positive
            torch.zeros(256)]  # a zero row: the library's eps scale, every q 0
    x = torch.stack(rows)
    codes, scales = identity(256)
    out = cpu.q8_linear(x, codes, scales, torch.zeros_like(scales), None, isa, False, True)
    expected, _ = library_quantized(x)
    assert torch.equal(out, expected)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_minus_128_where_the_most_negative_value_is_the_largest_in_size(isa):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 128, generator=gen)
    x[:4, 7] = -x[:4].abs().amax(dim=1) - 1  # rows 0-3: the largest value in size is negative
    x[1, 100] = x[1, 7]  # twice in row 1
    x[2, 31] = x[2, 7]  # at the end of a block
    codes, scales = identity(128)
    out = cpu.q8_linear(x, codes, scales, torch.zeros_like(scales), None, isa, False, True)
    expected, scale = library_quantized(x)
    assert torch.equal(expected[:4, 7:8], -128 * scale[:4]) and torch.equal(out, expected)
    weights = torch.randint(-128, 128, (24, 128), generator=gen, dtype=torch.int8)  # and against other weights
    channel = torch.rand(24, 1, generator=gen) * 0.02 + 0.001
    scales = channel.expand(24, 4).contiguous()
    out = cpu.q8_linear(x, weights, scales, torch.zeros_like(scales), None, isa, False, True)
    reference = expected.double() @ (weights.double() * channel.double()).t()
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_w8a8_product_equals_the_product_of_the_library_quantized_operands(isa):
    """Random int8 weights with per-channel scales (repeated over 32-wide groups, as CodedLinear widens them),
    1-5 rows of 11, 17 and 10 chunks (their -128s as they come), against the float64 product of the
    library-quantized x and the weight."""
    gen = torch.Generator().manual_seed(0)
    for columns in (352, 544, 320):
        codes = torch.randint(-128, 128, (40, columns), generator=gen, dtype=torch.int8)
        channel = torch.rand(40, 1, generator=gen) * 0.02 + 0.001
        weight = codes.double() * channel.double()
        for batch in (1, 2, 3, 5):
            x = torch.randn(batch, columns, generator=gen) * 3
            scales = channel.expand(40, columns // 32).contiguous()
            out = cpu.q8_linear(x, codes, scales, torch.zeros_like(scales), None, isa, False, True)
            quantized, _ = library_quantized(x)
            reference = quantized.double() @ weight.t()
            bound = (quantized.double().abs() @ weight.abs().t()).max().item()
            torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=2e-6 * bound)


@needs_kernels
def test_per_token_mode_takes_int8_codes_in_32_wide_groups():
    packed, scales = torch.zeros(4, 32, dtype=torch.uint8), torch.ones(4, 2)
    with pytest.raises(RuntimeError, match="per-token activations take int8 codes in 32-wide groups"):
        cpu.q8_linear(torch.zeros(1, 64), packed, scales, scales, None, "auto", False, True)
