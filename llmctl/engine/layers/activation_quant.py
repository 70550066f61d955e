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


def dynamic_activations_of(form: Any) -> dict[str, Any] | None:
    """The per-token scheme a layer form asks inputs to be quantized by (form "dynamic-activations"), else None."""
    return form.details.get("input_activations") if form is not None and form.method == "dynamic-activations" \
        else None


def activation_args(activations: dict[str, Any]) -> Any:
    """compressed-tensors' QuantizationArgs of a config group's `input_activations`."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs.model_validate(activations)


def quantized_tokens(x: torch.Tensor, args: Any, module: nn.Module) -> torch.Tensor:
    """x with each token quantized and dequantized by the dynamic scheme `args`: the common symmetric int8 and
    fp8 per-token schemes in five torch ops (`_symmetric_per_token`, the library's arithmetic step for step: the
    tests hold it to the library bit for bit), any other through compressed-tensors' own functions."""
    if _fast(args):
        return _symmetric_per_token(x, args.type == "float")
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    tokens = x.reshape(1, -1, x.shape[-1])  # [1, T, in]: the library reduces per token over the last dim only
    scale, zero_point = compute_dynamic_scales_and_zp(tokens, args, module)
    return fake_quantize(tokens, scale, zero_point, args).reshape(x.shape)


def int8_per_token(args: Any) -> bool:
    """Whether `args` is the W8A8 int8 scheme (dynamic, symmetric, per token) that q8_linear's per_token mode
    quantizes itself, in integers (llmctl.engine.layers.coded_linear)."""
    return _fast(args) and args.type == "int"


def _fast(args: Any) -> bool:
    return args.dynamic is True and args.symmetric and args.strategy == "token" and args.num_bits == 8 \
        and args.type in ("int", "float") and args.scale_dtype is None  # symmetric: zero points are 0


def _symmetric_per_token(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """As compressed-tensors computes it: scale = max|x| / (range / 2) (127.5 for int8, 448 for fp8 e4m3), a zero
    scale replaced by the dtype's eps, x / scale clamped to the range and rounded (to the nearest integer, or
    through float8_e4m3fn), times the scale."""
    low, high = (-448.0, 448.0) if fp8 else (-128.0, 127.0)
    scale = x.abs().amax(dim=-1, keepdim=True) / ((high - low) / 2)
    scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    clamped = torch.clamp(x / scale, low, high)
    rounded = clamped.to(torch.float8_e4m3fn).to(x.dtype) if fp8 else torch.round(clamped)
    return rounded * scale


class ActivationQuantLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool, activations: dict[str, Any]) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.activation_args = activation_args(activations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(quantized_tokens(x, self.activation_args, self), self.weight, self.bias)
