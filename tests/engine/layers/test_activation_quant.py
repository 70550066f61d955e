"""Per-token activation quantization (W8A8, FP8-dynamic): llmctl's short form against compressed-tensors' own
functions, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn


@pytest.mark.parametrize("kind", ["int", "float"])
def test_the_short_form_equals_compressed_tensors(kind):
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    from llmctl.engine.layers import activation_quant

    args = activation_quant.activation_args({"num_bits": 8, "type": kind, "symmetric": True, "strategy": "token",
                                             "dynamic": True})
    assert activation_quant._fast(args)
    torch.manual_seed(0)
    x = torch.randn(37, 96) * torch.logspace(-3, 2, 37).unsqueeze(1)  # tokens of every magnitude
    x[5] = 0.0  # a zero token: its scale becomes eps
    tokens = x.reshape(1, -1, 96)
    scale, zero_point = compute_dynamic_scales_and_zp(tokens, args, nn.Linear(96, 8))
    reference = fake_quantize(tokens, scale, zero_point, args).reshape(x.shape)
    ours = activation_quant.quantized_tokens(x, args, nn.Linear(96, 8))
    assert torch.equal(ours, reference)
    assert not torch.equal(ours, x)  # it did quantize
