"""The FP8 W8A16 GEMM (llmctl.kernels.fp8_w8a16) in Triton's interpreter against torch's own float8_e4m3fn
conversion: every e4m3 byte decoded exactly, and products with 128 × 128 block scales (DeepSeek-V3's layout),
per-channel and per-tensor scales, at decode, mid and prefill row counts (the dequantize-then-GEMM path), in
float32 and float16; the compile check builds the same kernels for sm_80/89/90 (tests/kernels/test_compile_check.py)."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels.fp8_w8a16 import fp8_dequantize, fp8_matmul, fp8_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # scripts/gpu-check.sh runs this file on a GPU
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # no bfloat16 in the interpreter


def test_every_e4m3_byte_decodes_exactly():
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # e4m3fn's two NaNs
    qweight = codes.reshape(-1, 1).repeat(1, 8).contiguous()  # [254, 8]
    decoded = fp8_dequantize(qweight.to(DEVICE), torch.ones(1, 8, device=DEVICE), qweight.shape[0], torch.float32)
    assert torch.equal(decoded.cpu(), qweight.view(torch.float8_e4m3fn).float())


def fp8_weight(inner: int, outputs: int, scale_k: int, per_tensor: bool = False):
    torch.manual_seed(inner + outputs)
    qweight = (torch.randn(inner, outputs) * 3).to(torch.float8_e4m3fn).view(torch.uint8)
    groups = -(-inner // scale_k)
    scales = torch.full((1, outputs), 0.7) if per_tensor else torch.rand(groups, outputs) + 0.25
    return qweight.to(DEVICE), scales.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner, outputs, scale_k, per_tensor", [
    (256, 192, 128, False),  # 128 × 128 blocks (scales repeated along columns): one scale row per tile
    (200, 70, 200, False),  # per channel, with a K the 64-deep tiles do not divide: a scale per element
    (320, 96, 320, True),  # per tensor
])
@pytest.mark.parametrize("rows", [1, 5, 130])  # 130: dequantized once, then one GEMM
def test_fp8_gemm_equals_torch(dtype, inner, outputs, scale_k, per_tensor, rows):
    qweight, scales = fp8_weight(inner, outputs, scale_k, per_tensor)
    x = torch.randn(rows, inner).to(dtype).to(DEVICE)
    out, expected = fp8_matmul(x, qweight, scales, scale_k), fp8_reference(x, qweight, scales, scale_k)
    assert out.dtype == dtype and out.shape == (rows, outputs)
    dense = qweight.view(torch.float8_e4m3fn).float() * scales.repeat_interleave(scale_k, 0)[:inner]
    bound = (x.float().abs() @ dense.abs()).max()  # the scale of the sums
    # float32: summation order; 16-bit: the scaled weight and the output rounded to the activations' type
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(out.float(), expected.float(), rtol=tolerance, atol=tolerance * float(bound))
