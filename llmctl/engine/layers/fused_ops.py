"""The GPU path's fused element-wise layers as torch ops: `llmctl::rms_norm` (with the residual add fused in)
and `llmctl::gated_activation` (silu or tanh-GELU of gate, times up).

On CUDA tensors they run the Triton kernels of `kernels/fused_layers.py` (one launch each where torch runs
five to seven). As registered ops they also have fake implementations, so a trace over fake CUDA tensors
counts each as one launch on a machine without a GPU (tests/engine/layers/test_launch_count.py). CPU tensors
keep the C++ kernels and torch forms of `norms.py` and `activations.py`; these ops run on CPU tensors only
under Triton's interpreter (the kernel tests)."""

from __future__ import annotations

import torch

from llmctl.kernels.limits import MAX_FUSED_WIDTH
from llmctl.kernels.torch_ops import define


def applies(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """A CUDA tensor the kernels take: [tokens, (heads,) width], its last dimension contiguous and one
    program wide, in the weight's dtype (a float32 weight times bfloat16 rows would promote in torch)."""
    return (x.is_cuda and x.dim() in (2, 3) and x.stride(-1) == 1 and x.shape[-1] <= MAX_FUSED_WIDTH
            and (weight is None or weight.dtype == x.dtype))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
              unit_offset: bool) -> torch.Tensor:
    from llmctl.kernels import fused_layers  # imports triton: only where a GPU path runs

    return fused_layers.rms_norm(x, weight, eps, residual, unit_offset)


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                   unit_offset: bool) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _gated_activation(fused: torch.Tensor, intermediate: int, gelu: bool) -> torch.Tensor:
    from llmctl.kernels import fused_layers

    return fused_layers.gated_activation(fused, intermediate, gelu)


def _gated_activation_fake(fused: torch.Tensor, intermediate: int, gelu: bool) -> torch.Tensor:
    return fused.new_empty(fused.shape[0], intermediate)


define("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!)? residual, bool unit_offset) -> Tensor", _rms_norm,
       _rms_norm_fake)
define("gated_activation(Tensor fused, int intermediate, bool gelu) -> Tensor", _gated_activation,
       _gated_activation_fake)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
             unit_offset: bool) -> torch.Tensor:
    """norm(x), or norm(x + residual) with the sum written into `residual`; (1 + weight) with `unit_offset`."""
    return torch.ops.llmctl.rms_norm.default(x, weight, eps, residual, unit_offset)


def gated_activation(fused: torch.Tensor, intermediate: int, gelu: bool) -> torch.Tensor:
    return torch.ops.llmctl.gated_activation.default(fused, intermediate, gelu)
