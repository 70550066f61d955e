"""GPTQ v1 and AWQ GEMM packing against an independent, bit-by-bit dequantization."""

from __future__ import annotations

import torch

from llmctl.checkpoint.quant_formats import pack_awq, pack_gptq, unpack_awq, unpack_gptq
from llmctl.quant.gptq import HessianAccumulator, gptq_quantize
from llmctl.quant.rtn import QuantConfig, rtn_quantize


def nibble(word: int, index: int) -> int:
    return (word >> (4 * index)) & 0xF


def reference_gptq_dequant(t: dict, group: int) -> torch.Tensor:
    """Straight from the format's definition, one element at a time."""
    qweight, qzeros, scales = t["qweight"].tolist(), t["qzeros"].tolist(), t["scales"].float()
    rows_in, out = len(qweight) * 8, len(qweight[0])
    w = torch.zeros(out, rows_in)
    for i in range(rows_in):
        g = t["g_idx"][i].item()
        for c in range(out):
            q = nibble(qweight[i // 8][c] & 0xFFFFFFFF, i % 8)
            z = nibble(qzeros[g][c // 8] & 0xFFFFFFFF, c % 8) + 1
            w[c, i] = scales[g, c] * (q - z)
    return w


def reference_awq_dequant(t: dict, group: int) -> torch.Tensor:
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble k holds column order[k] of each pack of 8
    qweight, qzeros, scales = t["qweight"].tolist(), t["qzeros"].tolist(), t["scales"].float()
    rows_in, out = len(qweight), len(qweight[0]) * 8
    w = torch.zeros(out, rows_in)
    for i in range(rows_in):
        for pack in range(out // 8):
            for k in range(8):
                c = pack * 8 + order[k]
                q = nibble(qweight[i][pack] & 0xFFFFFFFF, k)
                z = nibble(qzeros[i // group][pack] & 0xFFFFFFFF, k)
                w[c, i] = scales[i // group, c] * (q - z)
    return w


def test_gptq_pack_round_trip_matches_the_reference():
    torch.manual_seed(0)
    weight = torch.randn(16, 64)
    quantized = rtn_quantize(weight, QuantConfig(bits=4, group_size=32, symmetric=True))
    tensors = pack_gptq(quantized)
    assert tensors["qweight"].shape == (8, 16) and tensors["qweight"].dtype == torch.int32
    assert tensors["qzeros"].shape == (2, 2) and tensors["scales"].shape == (2, 16)
    assert tensors["scales"].dtype == torch.float16 and tensors["g_idx"].tolist() == [i // 32 for i in range(64)]
    reference = reference_gptq_dequant(tensors, 32)
    unpacked = unpack_gptq(tensors, 4, 32)
    assert torch.equal(unpacked.q, quantized.q) and torch.equal(unpacked.zeros, quantized.zeros)
    assert torch.allclose(unpacked.dequantize(), reference, atol=1e-6)
    assert torch.allclose(reference, weight, atol=0.5)  # and it is still the same weight, roughly


def test_awq_pack_round_trip_matches_the_reference():
    torch.manual_seed(1)
    weight = torch.randn(16, 64)
    quantized = rtn_quantize(weight, QuantConfig(bits=4, group_size=32, symmetric=False))
    tensors = pack_awq(quantized)
    assert tensors["qweight"].shape == (64, 2) and tensors["qzeros"].shape == (2, 2)
    assert tensors["scales"].shape == (2, 16)
    reference = reference_awq_dequant(tensors, 32)
    unpacked = unpack_awq(tensors, 32)
    assert torch.equal(unpacked.q, quantized.q)
    assert torch.allclose(unpacked.dequantize(), reference, atol=1e-6)


def test_gptq_beats_round_to_nearest_on_correlated_inputs():
    torch.manual_seed(2)
    mixing = torch.randn(64, 64)
    inputs = torch.randn(2048, 64) @ mixing  # correlated features, as real activations are
    weight = torch.randn(32, 64)
    accumulator = HessianAccumulator(64)
    accumulator.add(inputs)
    config = QuantConfig(bits=4, group_size=32, symmetric=True)
    gptq = gptq_quantize(weight, accumulator.hessian(), config).dequantize()
    rtn = rtn_quantize(weight, config).dequantize()
    exact = inputs @ weight.t()
    gptq_error = (inputs @ gptq.t() - exact).pow(2).mean()
    rtn_error = (inputs @ rtn.t() - exact).pow(2).mean()
    assert gptq_error < 0.7 * rtn_error


def test_scales_keep_their_stored_float16_when_the_model_runs_in_bfloat16(tmp_path):
    # float16 has 10 mantissa bits, bfloat16 7: scales read through bfloat16 would come back changed
    from safetensors.torch import save_file

    from llmctl.checkpoint.weights import iterate_tensors

    scales = (torch.arange(1, 65, dtype=torch.float32) / 1000 + 0.0123).half().view(8, 8)
    assert not torch.equal(scales.to(torch.bfloat16).half(), scales)  # values bfloat16 cannot hold
    save_file({"layer.scales": scales, "layer.weight": scales.float()}, str(tmp_path / "model.safetensors"))
    read = {t.name: t.read() for t in iterate_tensors(tmp_path, torch.bfloat16)}
    assert read["layer.scales"].dtype == torch.float16 and torch.equal(read["layer.scales"], scales)
    assert read["layer.weight"].dtype == torch.bfloat16  # other floats take the model's dtype
