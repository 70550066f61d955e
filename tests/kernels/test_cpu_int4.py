"""The C++ int4 kernel (kernels/cpu_int4.cpp) against weights dequantized in torch: every instruction-set
path built on this machine (the run's summary line names them), and GPTQ/AWQ linears repacked for it."""

from __future__ import annotations

import pytest
import torch

from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
from llmctl.engine.layers.coded_linear import DECODE_ROWS
from llmctl.engine.layers.quant_linear import QuantLinear
from llmctl.kernels import cpu

ISAS = cpu.int4_isas() if cpu.unavailable_reason() is None else []
pytestmark = pytest.mark.skipif(not ISAS, reason=f"C++ kernels not built: {cpu.unavailable_reason()}")


def dequantized(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    group = codes.shape[1] // scales.shape[1]
    return codes.double() * scales.double().repeat_interleave(group, 1) + offsets.double().repeat_interleave(group, 1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 33])
@pytest.mark.parametrize("k, group", [(64, 32), (256, 128), (512, 64)])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_every_path_equals_the_dequantized_weight(isa, rows, k, group, scale_dtype):
    gen = torch.Generator().manual_seed(rows * k + group)
    n = 40  # not a multiple of the 16 outputs a thread's range starts at
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales, offsets = torch.rand(n, k // group, generator=gen) / 8, torch.randn(n, k // group, generator=gen) / 8
    scales, offsets = scales.to(scale_dtype), offsets.to(scale_dtype)  # float16: as GGUF's Q4_0/Q4_1 store them
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    expected = x.double() @ dequantized(codes, scales, offsets).t() + bias.double()
    out = cpu.int4_linear(x, cpu.pack_int4(codes), scales, offsets, bias, isa)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_a_path_this_machine_lacks_is_refused():
    missing = [name for name in ("avx512", "avx2") if name not in ISAS]
    codes, scales = cpu.pack_int4(torch.zeros(16, 32, dtype=torch.int64)), torch.ones(16, 1)
    for name in missing:
        with pytest.raises(RuntimeError, match="not built on this machine"):
            cpu.int4_linear(torch.zeros(1, 32), codes, scales, scales, None, name)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        cpu.int4_linear(torch.zeros(1, 48), cpu.pack_int4(torch.zeros(16, 64))[:, :24].contiguous(),
                        scales, scales, None, "plain")


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptq_and_awq_linears_repacked_equal_their_dequantized_weight(method):
    """QuantLinear on the CPU through the int4 kernel == x · (the formats module's dequantized weight)ᵀ + b."""
    gen = torch.Generator().manual_seed(3)
    out_features, in_features, group = 48, 256, 128
    weight = QuantizedWeight(torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.int32),
                             (torch.rand(out_features, in_features // group, generator=gen) / 8).half().float(),
                             torch.randint(1, 16, (out_features, in_features // group), generator=gen,
                                           dtype=torch.int32), 4, group)  # GPTQ (v1) stores zero − 1: from 1
    layer = QuantLinear(in_features, out_features, True, method, 4, group)
    layer.load_parts([pack_awq(weight) if method == "awq" else pack_gptq(weight)])
    with torch.no_grad():
        layer.bias.normal_(generator=gen)
    assert layer.pack_for_cpu() > 0 and layer.cpu_int4 is not None
    for rows in (5, DECODE_ROWS * 2):  # decoded by the kernel; dequantized once, then a float GEMM
        x = torch.randn(2, rows, in_features, generator=gen)
        expected = x.double() @ weight.dequantize().double().t() + layer.bias.double()
        torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-4)


def test_the_dequantized_weight_equals_the_codes_times_scales_plus_offsets():
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (24, 128), generator=gen)
    scales, offsets = torch.rand(24, 4, generator=gen), torch.randn(24, 4, generator=gen)
    torch.testing.assert_close(cpu.int4_dequantize(cpu.pack_int4(codes), scales, offsets).double(),
                               dequantized(codes, scales, offsets), rtol=1e-6, atol=1e-6)


def test_formats_the_kernel_does_not_take_keep_the_torch_path():
    """8-bit, and groups that are not a multiple of 32: no repacked copy, the dequantizing forward."""
    eight = QuantLinear(64, 16, False, "gptq", 8, 32)
    odd_groups = QuantLinear(48, 16, False, "gptq", 4, 16)
    for layer in (eight, odd_groups):
        assert layer.pack_for_cpu() == 0 and layer.cpu_int4 is None
