"""A dense linear whose input is quantized per token first, as a W8A8 or FP8-dynamic checkpoint prescribes.

compressed-tensors checkpoints with dynamic activation schemes (int8 or fp8, per token) are served with
their weights dequantized at load (llmctl.checkpoint.quant_converters); running the activations in full
precision would give other numbers than the checkpoint was made (and evaluated) for. This layer
quantizes and dequantizes each token's input with compressed-tensors' own functions, as transformers
does with the same checkpoint: the scheme's numerics, not yet its speed (no int8/fp8 GEMM here).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def activation_args(activations: dict[str, Any]) -> Any:
    """compressed-tensors' QuantizationArgs of a config group's `input_activations`."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs.model_validate(activations)


def quantized_tokens(x: torch.Tensor, args: Any, module: nn.Module) -> torch.Tensor:
    """x with each token quantized and dequantized by the dynamic scheme `args` (compressed-tensors' own)."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    tokens = x.reshape(1, -1, x.shape[-1])  # [1, T, in]: the library reduces per token over the last dim only
    scale, zero_point = compute_dynamic_scales_and_zp(tokens, args, module)
    return fake_quantize(tokens, scale, zero_point, args).reshape(x.shape)


class ActivationQuantLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool, activations: dict[str, Any]) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.activation_args = activation_args(activations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(quantized_tokens(x, self.activation_args, self), self.weight, self.bias)
